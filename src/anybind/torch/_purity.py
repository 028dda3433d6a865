"""Whether a torch program may be captured once and run as JAX code (``mode="auto"``).

``mode="call"`` runs the user's Python at every call: a ``print`` prints, a
counter counts, a global or a tensor the function closes over is read as it is
then. A program captured by ``torch.export`` is a snapshot: it runs none of
that Python again. ``"auto"`` must never give another number than ``"call"``,
so it captures only code it can see is a function of its arguments alone, and
runs anything else as one torch call. ``impure(fn)`` is the reason it cannot
(or None), found by reading the code reachable from ``fn``:

=====================  ===================================================================
what it finds          why it is not a function of the arguments
=====================  ===================================================================
writes                 ``global``/``nonlocal`` assignments, attribute stores (a counter,
                       ``self.calls += 1``), deletions of globals
side effects           a call of ``print``, ``input``, ``open``, ``breakpoint``, ``exec``,
                       ``eval``, ``setattr``, ``delattr``, ``globals``, ``vars``
outside state          a global that is data (a number, a tensor, a list, …) or a module
                       other than torch's and ``math``'s (NumPy, ``random``, ``time``:
                       their values would be baked in); a closure or module attribute
                       that is a tensor or a container (a tensor outside the params dict
                       is a constant of the capture); a module with tensors other than
                       the one given (its weights are read at each call); a module's
                       non-persistent buffers;
                       a ``torch.Generator`` the function holds; torch's process-wide
                       state (``torch.manual_seed``, ``set_default_dtype``, grad mode)
=====================  ===================================================================

Functions the code calls (globals, closures, methods of the module's own
classes) are read the same way, to a fixed depth; code of torch, JAX, NumPy
and the standard library is trusted. Closure variables that hold numbers,
strings, dtypes or tuples of them are constants of the function and are
allowed.
"""
from __future__ import annotations

import builtins
import dis
import functools
import math
import types

import torch

from . import _draws

_EFFECTS = frozenset({"print", "input", "open", "breakpoint", "exec", "eval", "setattr",
                      "delattr", "globals", "vars", "locals", "__import__", "compile"})
# torch's process-wide state, which a capture would not replay
_STATEFUL = frozenset({"manual_seed", "seed", "set_rng_state", "get_rng_state", "initial_seed",
                       "fork_rng", "set_default_dtype", "get_default_dtype",
                       "set_default_tensor_type", "set_default_device", "set_grad_enabled",
                       "is_grad_enabled", "use_deterministic_algorithms", "set_printoptions",
                       "set_num_threads", "get_num_threads"})
_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR"})
_TRUSTED = ("torch", "math", "operator", "functools", "itertools", "typing", "collections",
            "builtins", "abc", "enum", "dataclasses", "numbers", "warnings", "einops")
_CONSTANTS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
              torch.Size, type(Ellipsis), slice)
_DEPTH = 6


def impure(fn) -> str | None:
    """Why ``fn`` (a function or an ``nn.Module``) cannot be captured once, or None."""
    if _draws.generators(fn):
        return "it holds a torch.Generator"
    return _Reader().visit(fn, 0)


def _trusted_module(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in _TRUSTED


def _constant(v) -> bool:
    return isinstance(v, _CONSTANTS) or (isinstance(v, tuple) and all(map(_constant, v)))


class _Reader:
    def __init__(self):
        self.seen: set = set()

    def visit(self, obj, depth: int) -> str | None:
        if depth > _DEPTH or id(obj) in self.seen:
            return None
        self.seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            if depth and any(True for _ in (*obj.parameters(), *obj.buffers())):
                return (f"it calls the module {type(obj).__name__}, whose parameters and "
                        f"buffers it reads as they are at each call (pass the module itself "
                        f"to ab.from_torch: its params dict is then an argument)")
            return self.module(obj, depth)
        if isinstance(obj, functools.partial):
            for v in (*obj.args, *obj.keywords.values()):
                why = self.value(v, "an argument bound by functools.partial", depth)
                if why:
                    return why
            return self.visit(obj.func, depth + 1)
        if isinstance(obj, types.MethodType):
            return self.visit(obj.__self__, depth + 1) or self.visit(obj.__func__, depth + 1)
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth)
        inner = getattr(obj, "module", None)  # a module function (``_module_function``)
        if isinstance(inner, torch.nn.Module):
            return self.visit(inner, depth + 1)
        if isinstance(obj, types.BuiltinFunctionType | type) or _trusted_module(
                getattr(obj, "__module__", None)):
            return None
        call = vars(type(obj)).get("__call__")  # a callable object: its code and its state
        if isinstance(call, types.FunctionType):
            for k, v in vars(obj).items() if hasattr(obj, "__dict__") else ():
                why = self.value(v, f"its attribute {k!r}", depth)
                if why:
                    return why
            return self.function(call, depth)
        return None

    def module(self, m: torch.nn.Module, depth: int) -> str | None:
        for name, sub in m.named_modules():
            hidden = sorted(getattr(sub, "_non_persistent_buffers_set", ()))
            if hidden:
                return (f"its module {name or type(m).__name__!r} has non-persistent buffers "
                        f"{hidden} (read as they are at each call)")
            for k, v in vars(sub).items():
                if k.startswith("_") or k == "training":
                    continue
                if isinstance(v, torch.Tensor):
                    return f"the module attribute {k!r} is a tensor outside its state_dict"
            if not _trusted_module(type(sub).__module__):
                for klass in type(sub).__mro__:
                    if _trusted_module(klass.__module__) or klass is object:
                        continue
                    for k, v in vars(klass).items():
                        if k.startswith("__") and k != "__call__":
                            continue  # __init__ and friends do not run in a call
                        if isinstance(v, types.FunctionType):
                            why = self.function(v, depth + 1)
                            if why:
                                return why
        return None

    def function(self, f: types.FunctionType, depth: int) -> str | None:
        if _trusted_module(f.__module__):
            return None
        name = f.__qualname__
        for cell, var in zip(f.__closure__ or (), f.__code__.co_freevars):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            why = self.value(v, f"{name} closes over {var!r}", depth)
            if why:
                return why
        for v in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
            why = self.value(v, f"a default argument of {name}", depth)
            if why:
                return why
        return self.code(f.__code__, f.__globals__, name, depth)

    def code(self, code: types.CodeType, g: dict, name: str, depth: int) -> str | None:
        for ins in dis.get_instructions(code):
            if ins.opname in _WRITES:
                return f"{name} writes {ins.argval!r} ({ins.opname})"
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in _STATEFUL:
                return f"{name} uses torch's process-wide state ({ins.argval})"
            if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
                return f"{name} assigns the nonlocal {ins.argval!r}"
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                n = ins.argval
                if n in g:
                    why = self.global_(g[n], n, name, depth)
                elif n in _EFFECTS:
                    why = f"{name} calls {n}()"
                else:
                    why = None
                if why:
                    return why
        for c in code.co_consts:  # nested functions, lambdas and comprehensions
            if isinstance(c, types.CodeType):
                why = self.code(c, g, name, depth)
                if why:
                    return why
        return None

    def global_(self, v, n: str, name: str, depth: int) -> str | None:
        if isinstance(v, types.ModuleType):
            if _trusted_module(v.__name__) or v is math:
                return None
            return f"{name} reads the module {v.__name__} ({n}), whose state it may use"
        if v is builtins.print or getattr(v, "__name__", None) in _EFFECTS and \
                isinstance(v, types.BuiltinFunctionType):
            return f"{name} calls {n}()"
        if isinstance(v, type):
            return None
        if callable(v) and not isinstance(v, torch.Tensor):
            return self.visit(v, depth + 1)
        return f"{name} reads the global {n!r} ({type(v).__name__}), which may change"

    def value(self, v, where: str, depth: int) -> str | None:
        if _constant(v) or isinstance(v, type | types.ModuleType):
            return None
        if isinstance(v, torch.Tensor):
            return f"{where}: a tensor, read as it is at each call"
        if callable(v):
            return self.visit(v, depth + 1)
        return f"{where}: a {type(v).__name__}, which may change"
