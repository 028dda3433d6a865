"""Builds anybind's two FFI handlers against the headers of jax (and NumPy).

- ``src/anybind/routes/_shim.c``: a plain-C XLA FFI handler that calls compiled
  functions bound with ``ab.bind``;
- ``src/anybind/routes/_pycall.c``: an XLA FFI handler that calls Python host code on
  NumPy views of XLA's buffers.

Both are optional: without a C compiler the install still succeeds, Python host
code runs through XLA's own buffer callback instead, and binding a compiled
function explains what is missing (anybind then also tries to build the shim at
first use).
"""
from setuptools import Extension, setup


def _include_dir() -> str:
    import jax.ffi
    return jax.ffi.include_dir()


def _numpy_include_dir() -> str:
    import numpy
    return numpy.get_include()


setup(ext_modules=[
    Extension("anybind.routes._shim", sources=["src/anybind/routes/_shim.c"], include_dirs=[_include_dir()],
              depends=["src/anybind/routes/_ffi.h"],
              extra_compile_args=["-O2"], optional=True),
    Extension("anybind.routes._pycall", sources=["src/anybind/routes/_pycall.c"],
              depends=["src/anybind/routes/_ffi.h"],
              include_dirs=[_include_dir(), _numpy_include_dir()],
              extra_compile_args=["-O2"], optional=True)])
