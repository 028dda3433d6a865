"""Closure conversion: an op's code that closes over tracers of enclosing traces.

An op made inside a ``jit``, ``vmap``, ``scan`` or ``cond`` body may close over
that body's values (``lambda y: a * jnp.sin(y)``). Its traced code runs later,
when its primitives are lowered or differentiated, after those traces ended.
So at the op's call, while they are alive, its traced function and rules are
traced once on their full operands (every tangent present, every cotangent
needed); the tracers they close over become extra keyword operands, hidden
from the user's code, and each role evaluates the recorded jaxpr with those
operands in their place (as ``jax.closure_convert`` does for ``custom_vjp``).
Batching, differentiation and lowering then treat them like any operand.

=====================  ==========================================================
piece                  what it does
=====================  ==========================================================
``under_trace()``      whether a call can see live tracers at all
``convert(call)``      the Call with the closed-over tracers as trailing keyword
                       operand leaves (``Call.n_closure``, ``Call.closed``) and a
                       ``Converted``; the Call unchanged when there are none
``Converted.run``      a role's run on its operands for any ``lin``/``need``: the
                       jaxpr with closed-over values taken from the operands,
                       absent linear operands as zeros, unneeded outputs dropped
``check_host(op)``     host code cannot see tracers: a clear error at the call
``converting(op)``     whether the op's own code is being traced by ``convert``
``nested(call)``       a call of the op from its own rule, traced by ``convert``: on
                       the same signature, the outer call's closed-over values and
                       conversion
``closes_over_nothing``  marks a traced rule that refers to no traced value (only
                       to ops and constants): ``convert`` leaves it untraced
=====================  ==========================================================

A rule may call its own op on new shapes (a jvp that stacks tangents and calls
the op on the stack). Tracing that rule calls the op again, and converting
that call would trace the rule again on a larger stack, without end; so a call
made while its op is being converted is not converted itself (``converting``).
Where such an op closes over tracers, its rules are traced a second time, with
each inner call on the signature being converted taking the same closed-over
values as operands and sharing the conversion (``nested``): the tracers then
appear as values the rule uses, and are hoisted with the rest. An inner call
on another signature would need a conversion of its own, and is refused.

Recorded on full operands, a ``symbolic_zeros`` rule of such an op sees zero
arrays rather than ``None``. A tangent reaching a closed-over value is
differentiated through the code that uses it where JAX differentiates that
code (a traced rule of a derived primitive, a traced function without rules),
is zero for code that does not use it, and is an error naming the op for a
function with custom rules (``_derivatives._closure_tangents``). A traced vmap
rule cannot run on converted code, and says so.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax
from ._code import is_compiled
from ._spec import Call, Rule, fmt_aval, to_aval
from .roles import ROLE_NAMES, traced_run, uses_residuals


def under_trace() -> bool:
    """Whether the current call runs inside some transformation (tracers may be alive)."""
    return not isinstance(_jax.trace_ctx.trace, _jax.EvalTrace)


# ----------------------------------------------------------------- traced code

_NOTHING = "__anybind_closes_over_nothing__"


def closes_over_nothing(fn: Callable) -> Callable:
    """Mark a traced rule that refers to no value of any trace, only to ops and constants.

    ``convert`` does not trace such a rule. A rule that calls ops it makes on
    first use (a bridge's jvp, whose own jvp is made when it is first called)
    needs this: tracing it at every call would make and trace the next order
    without end.
    """
    setattr(fn, _NOTHING, True)
    return fn


def _pieces(call: Call) -> dict:
    """The traced code of an op, by role: what may close over tracers."""
    op = call.op
    pieces = {"primal": op.traced}
    for role in ("jvp", "vjp", "transpose"):
        rule = getattr(op, f"{role}_rule")
        pieces[role] = rule is not None and rule.traced and not getattr(rule.fn, _NOTHING, False)
    if uses_residuals(call):
        pieces["vjp"] = False  # the bwd rule (host code) replaces the vjp rule
    return {role: True for role, traced in pieces.items() if traced}


def _full(role: str, call: Call) -> tuple:
    """``lin``, ``need`` and operand avals of a role with every linear operand present."""
    kw = call.kw_avals[:call.n_kw]
    if role == "primal":
        return None, None, [*call.in_avals, *kw]
    float_in = [a for a, f in zip(call.in_avals, call.float_in) if f]
    float_out = [a for a, f in zip(call.out_avals, call.float_out) if f]
    if role == "jvp":
        return call.float_in, None, [*call.in_avals, *kw, *call.res_avals, *float_in]
    need = (True,) * call.n_in
    if role == "vjp":
        return call.float_out, need, [*call.in_avals, *kw, *call.res_avals, *float_out]
    return call.float_out, need, [*kw, *float_out]


class _Slot(int):
    """A jaxpr constant that is closed-over value number ``self``."""


_ACTIVE = threading.local()  # per thread: id of each op whose code convert() traces ->
#                               whether that code called the op itself


def converting(op) -> bool:
    """Whether ``convert`` is tracing this op's code now (its rules call the op itself)."""
    active = getattr(_ACTIVE, "ops", {})
    if id(op) not in active:
        return False
    active[id(op)] = True
    return True


def convert(call: Call) -> Call:
    """Trace the op's traced code at this call; hoist the tracers it closes over."""
    active = _ACTIVE.__dict__.setdefault("ops", {})
    active[id(call.op)] = False
    try:
        return _convert(call, active)
    finally:
        del active[id(call.op)]


def nested(call: Call) -> Call:
    """A call of an op from inside its own rule while ``convert`` traces that rule.

    On the signature being converted, it takes the outer call's closed-over values
    as operands and shares its conversion (so tracing the rule records them as
    values the rule uses, and they are hoisted with the rest); on another
    signature it stays unconverted, and ``convert`` refuses the op if it closes
    over anything."""
    outer = _ACTIVE.__dict__.setdefault("outer", {}).get(id(call.op))
    if outer is None:
        return call
    first, closed, converted, missed = outer
    if first != call:
        missed.append(call)
        return call
    return dataclasses.replace(call, kw_avals=call.kw_avals + tuple(map(to_aval, closed)),
                               n_closure=len(closed), closed=closed, converted=converted)


def _convert(call: Call, active: dict) -> Call:
    jaxprs: dict = {}
    closed: list = []
    index: dict = {}
    recursive = []  # the roles whose code calls the op itself

    def trace(role: str) -> None:
        lin, need, avals = _full(role, call)
        rule = Rule(call.op.fn, True) if role == "primal" else getattr(call.op, f"{role}_rule")
        if role != "primal" and _find_tracer(rule.fn, "", 4, set()) is None:
            return  # a rule that closes over no tracer runs where it is used, as written
        run = traced_run(role, call, rule, lin, need)
        active[id(call.op)] = False
        try:
            jaxpr = jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(a.shape, a.dtype)
                                          for a in avals])
        except Exception as e:
            if role == "primal":  # left to the function to raise again where it is used
                return
            raise TypeError(
                f"anybind op '{call.op.name}': its traced {ROLE_NAMES[role]} closes over "
                f"traced values of an enclosing transformation, so it is traced at the op's "
                f"call with every tangent and cotangent present (zeros where they will be "
                f"symbolic), and it raised {type(e).__name__}: {e}. Pass the values it closes "
                f"over to the op as keyword operands instead") from e
        if active[id(call.op)]:
            recursive.append(role)
        consts, used = [], set()
        for c in jaxpr.consts:
            if isinstance(c, _jax.Tracer):
                if id(c) not in index:
                    index[id(c)] = len(closed)
                    closed.append(c)
                c = _Slot(index[id(c)])
                used.add(int(c))
            consts.append(c)
        jaxprs[role] = (jaxpr.jaxpr, consts, frozenset(used))

    for role in _pieces(call):
        trace(role)
    if not closed:
        return call
    converted = Converted(jaxprs)
    missed: list = []
    if recursive and not call.op.multilinear and call.op.shard is None:
        # the rules call the op: traced again, those calls take the closed-over values
        # as operands and share this conversion, so they are hoisted with the rest
        found = tuple(closed)
        outer = _ACTIVE.__dict__.setdefault("outer", {})
        outer[id(call.op)] = (call, found, converted, missed)
        try:
            for role in list(recursive):
                trace(role)
        finally:
            del outer[id(call.op)]
        if len(closed) != len(found):
            missed.append(call)  # (tracing again found other values: not one conversion)
    unsupported = ("multilinear" if call.op.multilinear  # per-argument transposes
                   else "sharded (shard=)" if call.op.shard is not None
                   else None)
    if unsupported:
        raise TypeError(
            f"anybind op '{call.op.name}' is {unsupported} and its traced code closes over "
            f"{len(closed)} traced value(s) of an enclosing transformation, which such ops "
            f"do not support; pass them to the op as keyword operands")
    if missed:
        got = ", ".join(fmt_aval(a) for a in missed[0].in_avals)
        want = ", ".join(fmt_aval(a) for a in call.in_avals)
        raise TypeError(
            f"anybind op '{call.op.name}' is called by its own rules on inputs ({got}) other "
            f"than those of the call being traced ({want}), and its traced code closes over "
            f"{len(closed)} traced value(s) of an enclosing transformation: such an inner "
            f"call would need its own conversion, whose rules call the op again, without "
            f"end; pass the closed-over values to the op as keyword operands")
    avals = tuple(to_aval(c) for c in closed)
    return dataclasses.replace(call, kw_avals=call.kw_avals + avals, n_closure=len(closed),
                               closed=tuple(closed), converted=converted)


class Converted:
    """The jaxprs of an op's traced code at one call, closed-over values hoisted."""

    def __init__(self, jaxprs: dict):
        self.jaxprs = jaxprs

    def uses(self, role: str) -> frozenset:
        """The closed-over values (by number) that a role's code depends on."""
        source = role
        if role not in self.jaxprs:  # derived: the jvp from the vjp, a transpose from f
            source = {"jvp": "vjp", "transpose": "primal"}.get(role, role)
        entry = self.jaxprs.get(source)
        return frozenset() if entry is None else entry[2]

    def run(self, role: str, call: Call, lin, need) -> Callable[..., list] | None:
        """``run(*operands)`` of ``role`` in the Call's operand layout, or None when this
        role's code was not recorded (it then runs as written and raises what it raises)."""
        entry = self.jaxprs.get(role)
        if entry is None:
            return None
        jaxpr, consts, _ = entry
        n, m, c = call.n_in, call.n_kw, call.n_closure
        k0 = (0 if role == "transpose" else n) + m  # where the closed-over values start
        stop = k0 + c + (len(call.res_avals) if role in ("jvp", "vjp") else 0)
        full_lin, _, avals = _full(role, call)
        lin_avals = avals[len(avals) - sum(full_lin):] if full_lin is not None else []
        fill = [] if full_lin is None else [
            b for b, f in zip(lin, full_lin) if f]  # which full linear operands are given
        pick = None if role in ("primal", "jvp") else [i for i, k in enumerate(need) if k]

        def run(*ops):
            cl = ops[k0:k0 + c]
            vals = [cl[v] if type(v) is _Slot else v for v in consts]
            given = iter(ops[stop:])
            full = [next(given) if b else jnp.zeros(a.shape, a.dtype)
                    for b, a in zip(fill, lin_avals)]
            outs = _jax.eval_jaxpr(jaxpr, vals, *ops[:k0], *ops[k0 + c:stop], *full)
            return outs if pick is None else [outs[i] for i in pick]
        return run


def vmap_rule_error(call: Call) -> TypeError:
    closed = ", ".join(call.kw_name(i) for i in range(call.n_kw, len(call.kw_avals)))
    return TypeError(
        f"anybind op '{call.op.name}' closes over traced values of an enclosing "
        f"transformation ({closed}), so its traced vmap rule cannot run: it would see them "
        f"after their trace ended. Pass those values to the op as keyword operands (the "
        f"vmap rule then gets them, and in_batched.kwargs says which are batched), or give "
        f"no vmap rule")


# ------------------------------------------------------------------- host code

def check_host(op) -> None:
    """Host code runs outside every trace: closing over a tracer is an error at the call."""
    pieces = [] if op.traced else [("function", op.fn)]
    for kind in ("jvp", "vjp", "transpose", "fwd", "bwd", "vmap"):
        rule = getattr(op, f"{kind}_rule")
        if rule is not None and not rule.traced:
            pieces.append((ROLE_NAMES[kind], rule.fn))
    for what, fn in pieces:
        if is_compiled(fn):  # compiled code closes over no Python values
            continue
        found = _find_tracer(fn, "", 4, set())
        if found is not None:
            path, tracer = found
            aval = to_aval(tracer)
            name = path if path.isidentifier() else "name"
            path = path if " " in path else f"'{path}'"
            raise TypeError(
                f"anybind op '{op.name}': its host {what} closes over {path}, a traced value "
                f"({fmt_aval(aval)}, a {type(tracer).__name__}) of an enclosing "
                f"transformation. Host code runs outside the trace and cannot see it; pass "
                f"the value to the op as a keyword operand (op(..., {name}={name})) or as a "
                f"positional argument, and take it as a parameter of the {what}")


_OPAQUE = (jax.Array, np.ndarray, np.generic, str, bytes, int, float, complex, type,
           types.ModuleType)
_MAX_ITEMS = 64  # of one container or object: a closure over a long list is not walked


def _find_tracer(obj: Any, path: str, depth: int, seen: set):
    """A (description, tracer) for a tracer reachable from ``obj``'s closure, or None."""
    if isinstance(obj, _jax.Tracer):
        return (path or "a value"), obj
    if depth == 0 or id(obj) in seen or isinstance(obj, _OPAQUE):
        return None
    seen.add(id(obj))
    items: list = []
    if isinstance(obj, types.FunctionType):
        cells = obj.__closure__ or ()
        items += [(name, _cell(cell))
                  for name, cell in zip(obj.__code__.co_freevars, cells)]
        items += [(f"a default of {obj.__name__}", d) for d in obj.__defaults__ or ()]
        items += [(k, v) for k, v in (obj.__kwdefaults__ or {}).items()]
    elif isinstance(obj, functools.partial):
        items += [("the partial's function", obj.func)]
        items += [("a partial argument", a) for a in obj.args]
        items += [(k, v) for k, v in obj.keywords.items()]
    elif isinstance(obj, types.MethodType):
        items += [("the method's function", obj.__func__), ("self", obj.__self__)]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items += [(path or "a value", v) for v in list(obj)[:_MAX_ITEMS]]
    elif isinstance(obj, dict):
        items += [(f"{path}[{k!r}]" if path else f"[{k!r}]", v)
                  for k, v in list(obj.items())[:_MAX_ITEMS]]
    elif isinstance(getattr(obj, "__dict__", None), dict):
        items += [(f"{path}.{k}" if path else k, v) for k, v in vars(obj).items()]
    for p, v in items[:_MAX_ITEMS]:
        found = _find_tracer(v, p, depth - 1, seen)
        if found is not None:
            return found
    return None


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None
