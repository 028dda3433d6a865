"""What kind of code a user's function is: compiled (a C function pointer) or Python.

A Numba ``@cfunc``, a ctypes function or a cffi function pointer is compiled
code: it runs by the compiled route, and it closes over no Python values.
Everything else that is callable is Python (host or traced) code.
"""
from __future__ import annotations

import ctypes
import functools


def compiled_kind(fn) -> str | None:
    t = type(fn)
    if t.__name__ == "CFunc" and t.__module__.startswith("numba"):
        return "numba"
    if isinstance(fn, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        return "ctypes"
    if t.__module__ == "_cffi_backend" and cffi_ctype(fn) is not None:
        return "cffi"
    return None


def cffi_ctype(fn):
    try:
        import cffi
        ctype = cffi_ffi().typeof(fn)
    except (ImportError, TypeError, cffi.FFIError):
        return None
    return ctype if ctype.kind == "function" else None


@functools.cache
def cffi_ffi():
    import cffi
    return cffi.FFI()


def is_compiled(fn) -> bool:
    """Whether ``fn`` is compiled code that the compiled route calls."""
    return compiled_kind(fn) is not None
