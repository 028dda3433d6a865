"""Builds anybind's FFI shim (``src/anybind/_shim.c``) against the headers of jax.

The shim is a plain-C XLA FFI handler that calls compiled functions bound with
``ab.bind``. It is optional: without a C compiler the install still succeeds,
the Python route works, and binding a compiled function explains what is
missing (anybind then also tries to build the shim at first use).
"""
from setuptools import Extension, setup


def _include_dir() -> str:
    import jax.ffi
    return jax.ffi.include_dir()


setup(ext_modules=[Extension(
    "anybind._shim", sources=["src/anybind/_shim.c"], include_dirs=[_include_dir()],
    extra_compile_args=["-O2"], optional=True)])
