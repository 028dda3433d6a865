"""Adapters between the user's pytree-level function and rules and the flat
operand lists that primitives carry.

Each builder returns ``run(*operands) -> list of output leaves`` for one role:

=========  ==========================================  =======================
role       operands                                    outputs
=========  ==========================================  =======================
primal     xs, ks                                      f(x) leaves
fwd        xs, ks                                      f(x) and residual leaves
jvp        xs, ks, [rs], ẋ (present ones, by ``lin``)   ∂f(x)·ẋ, float leaves
vjp        xs, ks, [rs], ȳ (present ones, by ``lin``)   ∂f(x)ᵀ·ȳ, ``need`` leaves
transpose  ks, ȳ (present ones, by ``lin``)             Aᵀ·ȳ, ``need`` leaves
=========  ==========================================  =======================

``xs`` are the positional leaves, ``ks`` the keyword operand leaves, ``rs``
the residuals of a fwd rule (present when the op has fwd and bwd rules; the
vjp role then runs the bwd rule on them). Absent
(symbolic zero) tangents and cotangents reach a rule as zero arrays, or as
``None`` when the rule was registered with ``symbolic_zeros=True``; such a vjp
or transpose rule also receives ``needs``, one bool per positional argument,
and may return ``None`` for the cotangents nobody asked for. Integer leaves'
tangents and cotangents reach a rule as ``None``. A rule may return
``None`` for any zero tangent or cotangent, leaf or whole argument. ``xp`` is
``numpy`` for host code and ``jax.numpy`` for traced code; ``lead`` is the
batch prefix of the zero arrays made here ((1,) in vectorized host calls).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from jax import tree_util

from ._spec import Call, is_float

ROLE_NAMES = {"primal": "function", "fwd": "fwd rule", "jvp": "jvp rule", "vjp": "vjp rule",
              "bwd": "bwd rule", "transpose": "transpose rule"}


def _zeros(xp, lead, aval):
    return xp.zeros(lead + aval.shape, aval.dtype)


def _fill(mask, present, avals, xp, lead, floats, symbolic: bool):
    """Spread ``present`` over positions where ``mask``; zeros or None elsewhere."""
    it = iter(present)
    return [next(it) if m else (_zeros(xp, lead, a) if f and not symbolic else None)
            for m, a, f in zip(mask, avals, floats)]


def _needs(call: Call, need) -> tuple:
    """Which positional arguments have at least one needed cotangent leaf."""
    it = iter(need)
    return tuple(any(next(it) for _ in range(sub.num_leaves))
                 for sub in call.args_tree.children())


def _structure_error(call: Call, role: str, what: str, expected, got, err) -> TypeError:
    return TypeError(
        f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned {what} of structure "
        f"{tree_util.tree_structure(got)}, but {expected} was expected ({err})")


def _flatten_outputs(call: Call, role: str, out) -> list:
    if call.leaf_out:
        return [out]
    try:
        return call.out_tree.flatten_up_to(out)
    except (ValueError, TypeError) as e:
        if out is None and role == "jvp":
            return [None] * len(call.out_avals)
        raise _structure_error(call, role, "an output", call.out_tree, out, e) from None


def _flatten_per_arg(call: Call, role: str, cts) -> list:
    """Cotangents returned as one entry per positional argument, flattened."""
    n = call.n_args
    if not isinstance(cts, (tuple, list)) or len(cts) != n:
        got = f"{len(cts)} entries" if isinstance(cts, (tuple, list)) else type(cts).__name__
        raise TypeError(
            f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} must return a tuple with one "
            f"cotangent per positional argument ({n}), got {got}")
    leaves = []
    for i, (sub, ct) in enumerate(zip(call.args_tree.children(), cts)):
        if ct is None:
            leaves += [None] * sub.num_leaves
            continue
        try:
            leaves += sub.flatten_up_to(ct)
        except (ValueError, TypeError) as e:
            raise TypeError(
                f"anybind op '{call.op.name}': the {ROLE_NAMES[role]}'s cotangent for positional "
                f"argument {i} has structure {tree_util.tree_structure(ct)}, but the argument "
                f"has structure {sub} ({e})") from None
    return leaves


def _select(leaves, mask, avals, xp, lead):
    return [_zeros(xp, lead, a) if l is None else l
            for l, m, a in zip(leaves, mask, avals) if m]


def primal(call: Call, fn: Callable, xp, lead=(), inplace: bool = False) -> Callable[..., list]:
    n = call.n_in
    if inplace:
        def run_inplace(ins, outs) -> None:
            res = fn(*call.args(ins[:n]), out=call.out_tree.unflatten(outs),
                     **call.kwargs(ins[n:]))
            if res is not None:
                raise TypeError(
                    f"anybind op '{call.op.name}' is bound with out=True, so its function "
                    f"writes into out= and must return None; it returned {type(res).__name__}")
        return run_inplace

    if call._flat_args and not call.kw_avals and not call.static and call.leaf_out:
        return lambda *ops: [fn(*ops)]  # the common case, without pytree handling

    def run(*ops):  # None results are refused by the host call's check or check_traced_outputs
        return _flatten_outputs(call, "primal", fn(*call.args(ops[:n]), **call.kwargs(ops[n:])))
    return run


def jvp(call: Call, fn: Callable, lin: Sequence[bool], xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m = call.n_in, len(call.kw_avals)
    r = len(call.res_avals)

    def run(*ops):
        xs, ks, ts = ops[:n], ops[n:n + m], ops[n + m + r:]
        tangents = _fill(lin, ts, call.in_avals, xp, lead, call.float_in, symbolic)
        out = fn(call.args(xs), call.args(tangents), **call.kwargs(ks))
        leaves = _flatten_outputs(call, "jvp", out)
        return _select(leaves, call.float_out, call.out_avals, xp, lead)
    return run


def vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m = call.n_in, len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}

    def run(*ops):
        xs, ks, cts = ops[:n], ops[n:n + m], ops[n + m:]
        ct = call.out_tree.unflatten(
            _fill(lin, cts, call.out_avals, xp, lead, call.float_out, symbolic))
        out = fn(call.args(xs), ct, **call.kwargs(ks), **extra)
        return _select(_flatten_per_arg(call, "vjp", out), need, call.in_avals, xp, lead)
    return run


def fwd(call: Call, fn: Callable, xp, lead=()) -> Callable[..., list]:
    n = call.n_in

    def run(*ops):
        res = fn(*call.args(ops[:n]), **call.kwargs(ops[n:]))
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(f"anybind op '{call.op.name}': the fwd rule must return a pair "
                            f"(output, residuals), got {type(res).__name__}")
        out, saved = res
        leaves = _flatten_outputs(call, "fwd", out)
        try:
            return leaves + call.res_tree.flatten_up_to(saved)
        except (ValueError, TypeError) as e:
            raise _structure_error(call, "fwd", "residuals", call.res_tree, saved, e) from None
    return run


def bwd(call: Call, fn: Callable, lin, need, xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}

    def run(*ops):
        ks, rs, cts = ops[n:n + m], ops[n + m:n + m + r], ops[n + m + r:]
        ct = call.out_tree.unflatten(
            _fill(lin, cts, call.out_avals, xp, lead, call.float_out, symbolic))
        out = fn(call.res_tree.unflatten(rs), ct, **call.kwargs(ks), **extra)
        return _select(_flatten_per_arg(call, "bwd", out), need, call.in_avals, xp, lead)
    return run


def transpose(call: Call, fn: Callable, lin, need, xp, lead=(),
              symbolic: bool = False, input_shapes: bool = False) -> Callable[..., list]:
    m = len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    if input_shapes:
        extra["input_shapes"] = call.input_shapes

    def run(*ops):
        ks, cts = ops[:m], ops[m:]
        ct = call.out_tree.unflatten(
            _fill(lin, cts, call.out_avals, xp, lead, call.float_out, symbolic))
        out = fn(ct, **call.kwargs(ks), **extra)
        return _select(_flatten_per_arg(call, "transpose", out), need, call.in_avals, xp, lead)
    return run


def check_traced_outputs(call: Call, role: str, outs: Sequence[Any], avals: Sequence[Any],
                         names: Sequence[str]) -> None:
    """Trace-time check of a traced rule's outputs against the expected avals."""
    for o, a, name in zip(outs, avals, names):
        shape, dtype = getattr(o, "shape", None), getattr(o, "dtype", None)
        if shape != a.shape or dtype != a.dtype:
            got = f"{dtype}{list(shape)}" if shape is not None else type(o).__name__
            raise TypeError(
                f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned {got} for {name}; "
                f"expected {a.str_short()}")
