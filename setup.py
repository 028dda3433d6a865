"""Builds anybind's two FFI handlers against the headers of jax (and NumPy).

- ``src/anybind/routes/_shim.c``: a plain-C XLA FFI handler that calls compiled
  functions bound with ``ab.bind``;
- ``src/anybind/routes/_pycall.c``: an XLA FFI handler that calls Python host code on
  NumPy views of XLA's buffers.

Both are optional: without a C compiler the install still succeeds, Python host
code runs through XLA's own buffer callback instead, and binding a compiled
function explains what is missing (anybind then also tries to build the shim at
first use). Such a build is not silent: it ends with a warning naming what was
left out (``pip install -v`` shows it), and ``python -m anybind info`` reports it.
Set ``ANYBIND_REQUIRE_HANDLERS=1`` to make a missing handler an error instead (the
release wheels are built so).

``_pycall`` is built for one Python version, not against the stable ABI: it uses
CPython's macros and struct fields (``PyTuple_GET_ITEM``, ``PyTuple_GET_SIZE``,
``PyList_SET_ITEM``, ``PyList_GET_SIZE``, ``PyBytes_AS_STRING``, ``PyBytes_GET_SIZE``,
``Py_XSETREF``, ``PyTypeObject.tp_name``), ``PyUnicode_AsUTF8`` (limited API from
3.13) and ``PyObject_Vectorcall`` (from 3.12), which the limited API of Python 3.11
lacks. NumPy's headers compile under ``Py_LIMITED_API``.
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

WHAT_IS_LOST = {
    "anybind.routes._shim": "binding compiled functions (C, Numba, ctypes, cffi) needs a C "
                            "compiler at first use, to build the shim into the user's cache",
    "anybind.routes._pycall": "Python host code runs through XLA's buffer callback, with more "
                              "overhead per call",
}


def _include_dir() -> str:
    import jax.ffi
    return jax.ffi.include_dir()


def _numpy_include_dir() -> str:
    import numpy
    return numpy.get_include()


class BuildHandlers(build_ext):
    """``build_ext`` that says which optional handler was not built, and why it matters."""

    def run(self) -> None:
        super().run()
        missing = [e.name for e in self.extensions
                   if not os.path.exists(self.get_ext_fullpath(e.name))]
        if not missing:
            return
        lines = [f"  - {name}: not built; {WHAT_IS_LOST[name]}" for name in missing]
        message = "\n".join(
            ["", "=" * 78,
             "anybind: WARNING: the C handlers below could not be built (is a C compiler",
             "installed? see the errors above). anybind works without them, more slowly:",
             *lines,
             "Install a C compiler (gcc or clang) and reinstall to build them;",
             "`python -m anybind info` reports what this install has.",
             "=" * 78, ""])
        if os.environ.get("ANYBIND_REQUIRE_HANDLERS", "") not in ("", "0"):
            raise SystemExit(message.replace("WARNING", "ERROR (ANYBIND_REQUIRE_HANDLERS is set)"))
        print(message, file=sys.stderr)


setup(cmdclass={"build_ext": BuildHandlers}, ext_modules=[
    Extension("anybind.routes._shim", sources=["src/anybind/routes/_shim.c"],
              include_dirs=[_include_dir()],
              depends=["src/anybind/routes/_ffi.h"],
              extra_compile_args=["-O2"], optional=True),
    Extension("anybind.routes._pycall", sources=["src/anybind/routes/_pycall.c"],
              depends=["src/anybind/routes/_ffi.h"],
              include_dirs=[_include_dir(), _numpy_include_dir()],
              extra_compile_args=["-O2"], optional=True)])
