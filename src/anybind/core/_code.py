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


def higher_order_way(fn, op_name: str, kind: str, role: str, where: str = "") -> str:
    """Why a rule gives first derivatives only, and the way to higher orders: for
    compiled code (which is never called host code) and for Python host code."""
    what = compiled_kind(fn)
    if what is not None:
        return (f"anybind op '{op_name}': a higher-order derivative{where} differentiates its "
                f"{role}, which is compiled code (a {what} function). A compiled rule gives "
                f"first derivatives; for higher orders give it rules of its own: bind it as "
                f"an op that takes the rule's buffers as positional arguments, with its own "
                f"rules (rule_op = ab.bind(lib.f_{kind}, shape=..., jvp=lib.f_{kind}_jvp, "
                f"vjp=...)) and set op.def_{kind}(rule_op) (e.g. op.def_vjp(vjp_op)); or "
                f"register a traced rule that calls compiled ops "
                f"(op.def_{kind}(rule, traced=True))")
    return (f"anybind op '{op_name}': a higher-order derivative{where} differentiates its "
            f"{role}, which is host code. Host rules give first derivatives only; for "
            f"higher orders register the rule as traced JAX code "
            f"(op.def_{kind}(rule, traced=True)), calling other bound ops where needed, or "
            f"give an op with rules of its own as the rule (op.def_{kind}(rule_op))")
