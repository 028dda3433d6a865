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

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from ._spec import Call, InBatched

ROLE_NAMES = {"primal": "function", "fwd": "fwd rule", "jvp": "jvp rule", "vjp": "vjp rule",
              "bwd": "bwd rule", "transpose": "transpose rule", "vmap": "vmap rule",
              "symmetric": "jvp rule (as the vjp of a symmetric=True op)"}


def _zeros(xp, lead, aval):
    if xp is np:  # made once per compiled call and shared, so read-only
        z = np.zeros(lead + aval.shape, aval.dtype)
        z.setflags(write=False)
        return z
    return xp.zeros(lead + aval.shape, aval.dtype)


def _filler(mask, avals, floats, xp, lead, symbolic: bool) -> Callable[[Sequence], list]:
    """``fill(present)``: ``present`` spread over positions where ``mask``; zeros or None
    (integer leaves, or symbolic zeros) elsewhere."""
    if all(mask):
        return list
    slots = [i for i, m in enumerate(mask) if m]
    if xp is not np:  # traced: make the zeros inside the trace
        return lambda present: fill(mask, present, avals, floats, xp, lead, symbolic)
    base = [None if m or not f or symbolic else _zeros(xp, lead, a)
            for m, a, f in zip(mask, avals, floats)]

    def spread(present):
        out = list(base)
        for i, p in zip(slots, present):
            out[i] = p
        return out
    return spread


def fill(mask, present, avals, floats, xp, lead, symbolic: bool) -> list:
    """``present`` spread over positions where ``mask``; zeros or None elsewhere."""
    it = iter(present)
    return [next(it) if m else (_zeros(xp, lead, a) if f and not symbolic else None)
            for m, a, f in zip(mask, avals, floats)]


def _needs(call: Call, need) -> tuple:
    """Which positional arguments have at least one needed cotangent leaf."""
    it = iter(need)
    return tuple(any([next(it) for _ in range(sub.num_leaves)]) for sub in call.arg_trees)


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
        if out is None and role in ("jvp", "symmetric"):
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
    if call._flat_args:
        return list(cts)
    leaves = []
    for i, (sub, ct) in enumerate(zip(call.arg_trees, cts)):
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


def _selector(mask, avals, xp, lead) -> Callable[[list], list]:
    """``select(leaves)``: the leaves where ``mask``, with zeros for ``None``."""
    picked = [(i, a) for i, (m, a) in enumerate(zip(mask, avals)) if m]
    if xp is np:
        zeros = [_zeros(xp, lead, a) for _, a in picked]
        return lambda leaves: [z if leaves[i] is None else leaves[i]
                               for (i, _), z in zip(picked, zeros)]
    return lambda leaves: [_zeros(xp, lead, a) if leaves[i] is None else leaves[i]
                           for i, a in picked]


def _simple(call: Call) -> bool:
    """Arrays in, one array out, no keywords: no pytree handling needed."""
    return call._flat_args and not call.kw_avals and not call.static and call.leaf_out


def _inplace_error(call: Call) -> TypeError:
    return TypeError(f"anybind op '{call.op.name}' is bound with out=True, so its function "
                     f"writes into out= and must return None")


def primal(call: Call, fn: Callable, xp, lead=(), inplace: bool = False) -> Callable[..., list]:
    n = call.n_in
    if inplace:
        if _simple(call):
            def run_flat(ins, outs) -> None:
                if fn(*ins, out=outs[0]) is not None:
                    raise _inplace_error(call)
            return run_flat

        def run_inplace(ins, outs) -> None:
            res = fn(*call.args(ins[:n]), out=call.out_tree.unflatten(outs),
                     **call.kwargs(ins[n:]))
            if res is not None:
                raise _inplace_error(call)
        return run_inplace

    if _simple(call):
        return lambda *ops: [fn(*ops)]  # the common case, without pytree handling

    def run(*ops):  # None results are refused by the host call's check or check_traced_outputs
        return _flatten_outputs(call, "primal", fn(*call.args(ops[:n]), **call.kwargs(ops[n:])))
    return run


def jvp(call: Call, fn: Callable, lin: Sequence[bool], xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m = call.n_in, len(call.kw_avals)
    r = len(call.res_avals)
    fill = _filler(lin, call.in_avals, call.float_in, xp, lead, symbolic)
    select = _selector(call.float_out, call.out_avals, xp, lead)

    def run(*ops):
        xs, ks, ts = ops[:n], ops[n:n + m], ops[n + m + r:]
        out = fn(call.args(xs), call.args(fill(ts)), **call.kwargs(ks))
        return select(_flatten_outputs(call, "jvp", out))
    return run


def vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m = call.n_in, len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    if _simple(call) and all(lin) and xp is np:  # the hot path: x1, x2, ... ↦ one array
        picked = [(i, _zeros(xp, lead, a)) for i, (k, a) in enumerate(zip(need, call.in_avals))
                  if k]

        def run_simple(*ops):
            out = fn(ops[:n], ops[n], **extra)
            if type(out) is not tuple or len(out) != n:
                _flatten_per_arg(call, "vjp", out)  # raises the error
            return [z if out[i] is None else out[i] for i, z in picked]
        return run_simple
    cotangent = _cotangent_maker(call, lin, xp, lead, symbolic)
    select = _selector(need, call.in_avals, xp, lead)

    def run(*ops):
        xs, ks, cts = ops[:n], ops[n:n + m], ops[n + m:]
        out = fn(call.args(xs), cotangent(cts), **call.kwargs(ks), **extra)
        return select(_flatten_per_arg(call, "vjp", out))
    return run


def symmetric_vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
                  symbolic: bool = False) -> Callable[..., list]:
    """∂f(x)ᵀ·ȳ = ∂f(x)·ȳ: the jvp rule with the cotangent ȳ as its tangent.

    The output is structured like the one positional argument, so ȳ's leaves
    are that argument's tangent leaves and the rule's output leaves are its
    cotangent leaves.
    """
    n, m = call.n_in, len(call.kw_avals)
    fill = _filler(lin, call.out_avals, call.float_out, xp, lead, symbolic)
    select = _selector(need, call.in_avals, xp, lead)

    def run(*ops):
        xs, ks, cts = ops[:n], ops[n:n + m], ops[n + m:]
        out = fn(call.args(xs), call.args(fill(cts)), **call.kwargs(ks))
        return select(_flatten_outputs(call, "symmetric", out))
    return run


def _cotangent_maker(call: Call, lin, xp, lead, symbolic) -> Callable[[Sequence], Any]:
    """The output cotangent pytree from the present leaves."""
    fill = _filler(lin, call.out_avals, call.float_out, xp, lead, symbolic)
    if call.leaf_out:
        return lambda cts: fill(cts)[0]
    return lambda cts: call.out_tree.unflatten(fill(cts))


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
    cotangent = _cotangent_maker(call, lin, xp, lead, symbolic)
    select = _selector(need, call.in_avals, xp, lead)

    def run(*ops):
        ks, rs, cts = ops[n:n + m], ops[n + m:n + m + r], ops[n + m + r:]
        out = fn(call.res_tree.unflatten(rs), cotangent(cts), **call.kwargs(ks), **extra)
        return select(_flatten_per_arg(call, "bwd", out))
    return run


def transpose(call: Call, fn: Callable, lin, need, xp, lead=(),
              symbolic: bool = False, input_shapes: bool = False) -> Callable[..., list]:
    m = len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    if input_shapes:
        extra["input_shapes"] = call.input_shapes

    cotangent = _cotangent_maker(call, lin, xp, lead, symbolic)
    select = _selector(need, call.in_avals, xp, lead)

    def run(*ops):
        ks, cts = ops[:m], ops[m:]
        out = fn(cotangent(cts), **call.kwargs(ks), **extra)
        return select(_flatten_per_arg(call, "transpose", out))
    return run


def call_vmap_rule(call: Call, fn: Callable, batch, ops) -> tuple[list, list]:
    """Run a vmap rule on operands in ``Batch`` layout; its output leaves and batched flags."""
    n = call.n_in
    args = [o if m else o[0] for o, m in zip(ops, batch.mask)]
    in_batched = InBatched(call.args_tree.unflatten(batch.mask[:n]))
    in_batched.kwargs = call.kw_tree.unflatten(batch.mask[n:n + call.n_kw])
    res = fn(batch.size, in_batched, *call.args(args[:n]), **call.kwargs(args[n:]))
    if not (isinstance(res, tuple) and len(res) == 2):
        raise TypeError(f"anybind op '{call.op.name}': the vmap rule must return a pair "
                        f"(out, out_batched), got {type(res).__name__}")
    out, out_batched = res
    leaves = _flatten_outputs(call, "vmap", out)
    if isinstance(out_batched, bool):
        return leaves, [out_batched] * len(leaves)
    try:
        return leaves, call.out_tree.flatten_up_to(out_batched)
    except (ValueError, TypeError) as e:
        raise _structure_error(call, "vmap", "out_batched", call.out_tree, out_batched,
                               e) from None


def is_python_scalar(r) -> bool:
    return isinstance(r, (int, float, complex, bool)) and not isinstance(r, np.generic)


def exact_python_scalar(r, dtype) -> np.ndarray | None:
    """A Python number as a 0-d array of ``dtype`` if it converts exactly, else None.

    A Python number has no dtype of its own, so host and traced rules alike may
    return one wherever the declared dtype holds it: equal after conversion as
    NumPy compares them, without overflow (``3`` and ``0.1`` for float32, not
    ``1.5`` or ``2**40`` for int32, ``1e300`` for float32 or ``1j`` for float64).
    """
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.asarray(r, dtype=dtype)
            same = bool(v == r) or (r != r and bool(np.isnan(v)))  # nan stays nan
            exact = same and (bool(np.isfinite(v)) or not np.isfinite(r))
        return v if exact else None
    except (TypeError, ValueError, OverflowError):
        return None


def check_traced_outputs(call: Call, role: str, outs: Sequence[Any], avals: Sequence[Any],
                         names: Sequence[str]) -> list:
    """Trace-time check of a traced rule's outputs against the expected avals.

    Accepts what a host rule's outputs may be (see ``_hostcall``): values of
    the expected shape and dtype, and Python numbers that the dtype holds
    exactly; and, as JAX's type promotion would, weakly typed values (the
    results of Python-number arithmetic) of the expected shape whose dtype
    promotes to the expected one. Returns the outputs with those converted.
    """
    res = []
    for o, a, name in zip(outs, avals, names):
        if is_python_scalar(o):
            v = exact_python_scalar(o, a.dtype) if a.shape == () else None
            if v is None:
                raise TypeError(
                    f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned the Python "
                    f"{type(o).__name__} {o!r} for {name}, which is not a {a.str_short()} "
                    f"(a Python number must be exactly representable in a scalar output's "
                    f"dtype); expected {a.str_short()}")
            res.append(jnp.asarray(v))
            continue
        shape, dtype = getattr(o, "shape", None), getattr(o, "dtype", None)
        if shape == a.shape and dtype != a.dtype and _weak_promotes(o, a.dtype):
            o = lax.convert_element_type(o, a.dtype)
        elif shape != a.shape or dtype != a.dtype:
            got = f"{dtype}{list(shape)}" if shape is not None else type(o).__name__
            raise TypeError(
                f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned {got} for {name}; "
                f"expected {a.str_short()}")
        res.append(o)
    return res


def _weak_promotes(o, dtype) -> bool:
    """Whether ``o`` is weakly typed and JAX's promotion with ``dtype`` gives ``dtype``."""
    if not isinstance(o, (jax.Array, jax.core.Tracer)) or not jax.typeof(o).weak_type:
        return False
    return jnp.result_type(o, dtype) == dtype
