"""What every role's runner shares: zeros, operand layout and output checks.

==========================  ==========================================================
piece                       what it does
==========================  ==========================================================
``ROLES``, ``ROLE_NAMES``   the roles, and how messages name the rule behind each
``out_avals``/``out_names`` a role's outputs, and how messages name them
``filler``, ``fill``        present tangents/cotangents spread over their slots, zeros
                            (or None, for ``symbolic_zeros``) elsewhere
``selector``                the needed output leaves, zeros for a rule's None
``flatten_outputs``         a rule's output pytree as leaves, or a structure error
``flatten_per_arg``         a rule's per-argument cotangents as leaves, or an error
``cotangent_out``           in-place rules: output views as one entry per argument
``Layout``                  where a role's operands stand, and ``split`` into them
``form``                    a rule's runner, plain or in place, from how it is called
``check_traced_outputs``    a traced rule's outputs checked against the avals
==========================  ==========================================================

Zeros: absent (symbolic zero) tangents and cotangents reach a rule as zero
arrays, or as ``None`` when the rule was registered with ``symbolic_zeros=True``;
integer leaves' tangents and cotangents always as ``None``. A rule may return
``None`` for any zero result. ``xp`` is ``numpy`` for host code and
``jax.numpy`` for traced code; ``lead`` is the batch prefix of the zero arrays
made here ((1,) in vectorized host calls).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from .._jax import Tracer
from .._spec import Call

ROLES = ("primal", "fwd", "jvp", "vjp", "transpose")


ROLE_NAMES = {"primal": "function", "fwd": "fwd rule", "jvp": "jvp rule", "vjp": "vjp rule",
              "bwd": "bwd rule", "transpose": "transpose rule", "vmap": "vmap rule",
              "symmetric": "jvp rule (as the vjp of a symmetric=True op)"}


def out_avals(role: str, call: Call, lin, need) -> list:
    if role == "primal":
        return list(call.out_avals)
    if role == "fwd":
        return list(call.out_avals + call.res_avals)
    if role == "jvp":
        return [a for a, f in zip(call.out_avals, call.float_out) if f]
    return [a for a, k in zip(call.in_avals, need) if k]


def out_names(role: str, call: Call, need) -> list:
    if role in ("primal", "fwd"):
        outs = [call.out_name(j) for j in range(len(call.out_avals))]
        return outs + [f"residual leaf {i}" for i in range(len(call.res_avals))] \
            if role == "fwd" else outs
    if role == "jvp":
        return [f"tangent of {call.out_name(j)}" for j, f in enumerate(call.float_out) if f]
    return [f"cotangent of input leaf {i}" for i, k in enumerate(need) if k]


def uses_residuals(call: Call) -> bool:
    return call.res_tree is not None


def role_name(role: str, call: Call) -> str:
    if role == "vjp" and call.op.symmetric:
        return ROLE_NAMES["symmetric"]
    return ROLE_NAMES["bwd" if role == "vjp" and uses_residuals(call) else role]


class Layout:
    """Where a role's operands stand: inputs xs, keyword operands ks, residuals rs (jvp
    and vjp of an op with a fwd rule), then the linear operands (tangents ẋ or
    cotangents ȳ); ``lin``/``nonlin`` are the linear and fixed ones."""

    def __init__(self, role: str, call: Call, n_operands: int | None = None):
        n, m = call.n_in, len(call.kw_avals)
        self.xs = range(0) if role == "transpose" else range(0, n)
        self.ks = range(self.xs.stop, self.xs.stop + m)
        stop = self.ks.stop
        self.rs = range(stop, stop + len(call.res_avals)) if role in ("jvp", "vjp") \
            else range(stop, stop)
        if n_operands is None:
            return
        if role == "primal" and call.op.linear:
            self.lin, self.nonlin = self.xs, self.ks
        else:
            self.lin = range(self.rs.stop, n_operands)
            self.nonlin = range(0, self.rs.stop)

    def split(self, ops: Sequence) -> tuple:
        """``(xs, ks, rs, rest)``: the operands by part, ``rest`` the linear ones."""
        a, b, c = self.xs.stop, self.ks.stop, self.rs.stop
        return ops[:a], ops[a:b], ops[b:c], ops[c:]


def form(call: Call, role: str, fn: Callable, args_of: Callable, finish: Callable | None,
         out_of: Callable | None = None) -> Callable:
    """The runner of a rule called as ``fn(*args, **kw)``, ``(args, kw) = args_of(ops)``.

    Plain (``out_of`` None): ``run(*ops) -> finish(what fn returned)``. In place:
    ``run(ins, outs) -> None``, calling ``fn(*args, out=out_of(outs), **kw)``,
    which writes into XLA's buffers and must return None.
    """
    if out_of is None:
        def run(*ops):
            args, kw = args_of(ops)
            return finish(fn(*args, **kw))
        return run

    def run_inplace(ins, outs) -> None:
        args, kw = args_of(ins)
        check_none(call, role, fn(*args, out=out_of(outs), **kw))
    return run_inplace


def zeros_of(xp, lead, aval):
    if xp is np:  # made once per compiled call and shared, so read-only
        z = np.zeros(lead + aval.shape, aval.dtype)
        z.setflags(write=False)
        return z
    return xp.zeros(lead + aval.shape, aval.dtype)


def filler(mask, avals, floats, xp, lead, symbolic: bool) -> Callable[[Sequence], list]:
    """``fill(present)``: ``present`` spread over positions where ``mask``; zeros or None
    (integer leaves, or symbolic zeros) elsewhere."""
    if all(mask):
        return list
    slots = [i for i, m in enumerate(mask) if m]
    if xp is not np:  # traced: make the zeros inside the trace
        return lambda present: fill(mask, present, avals, floats, xp, lead, symbolic)
    base = [None if m or not f or symbolic else zeros_of(xp, lead, a)
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
    return [next(it) if m else (zeros_of(xp, lead, a) if f and not symbolic else None)
            for m, a, f in zip(mask, avals, floats)]


def needs(call: Call, need) -> tuple:
    """Which positional arguments have at least one needed cotangent leaf."""
    it = iter(need)
    return tuple(any([next(it) for _ in range(sub.num_leaves)]) for sub in call.arg_trees)


def structure_error(call: Call, role: str, what: str, expected, got, err) -> TypeError:
    return TypeError(
        f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned {what} of structure "
        f"{tree_util.tree_structure(got)}, but {expected} was expected ({err})")


def flatten_outputs(call: Call, role: str, out) -> list:
    if call.leaf_out:
        return [out]
    try:
        return call.out_tree.flatten_up_to(out)
    except (ValueError, TypeError) as e:
        if out is None and role in ("jvp", "symmetric"):
            return [None] * len(call.out_avals)
        raise structure_error(call, role, "an output", call.out_tree, out, e) from None


def flatten_per_arg(call: Call, role: str, cts) -> list:
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


def selector(mask, avals, xp, lead) -> Callable[[list], list]:
    """``select(leaves)``: the leaves where ``mask``, with zeros for ``None``."""
    picked = [(i, a) for i, (m, a) in enumerate(zip(mask, avals)) if m]
    if xp is np:
        zeros = [zeros_of(xp, lead, a) for _, a in picked]
        return lambda leaves: [z if leaves[i] is None else leaves[i]
                               for (i, _), z in zip(picked, zeros)]
    return lambda leaves: [zeros_of(xp, lead, a) if leaves[i] is None else leaves[i]
                           for i, a in picked]


def simple(call: Call) -> bool:
    """Arrays in, one array out, no keywords: no pytree handling needed."""
    return call._flat_args and not call.kw_avals and not call.static and call.leaf_out


def cotangent_maker(call: Call, lin, xp, lead, symbolic) -> Callable[[Sequence], Any]:
    """The output cotangent pytree from the present leaves."""
    fill = filler(lin, call.out_avals, call.float_out, xp, lead, symbolic)
    if call.leaf_out:
        return lambda cts: fill(cts)[0]
    return lambda cts: call.out_tree.unflatten(fill(cts))


def check_none(call: Call, role: str, res) -> None:
    if res is not None:
        raise TypeError(
            f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} is registered with out=True, "
            f"so it writes its results into out= and must return None; it returned "
            f"{type(res).__name__}")


def cotangent_out(call: Call, need) -> Callable[[list], tuple]:
    """The views of the needed input cotangents ↦ ``out``: one entry per positional argument."""
    slots = [i for i, k in enumerate(need) if k]
    blank = [None] * call.n_in
    if call._flat_args:
        def flat(outs):
            full = list(blank)
            for i, o in zip(slots, outs):
                full[i] = o
            return tuple(full)
        return flat
    starts = np.cumsum([0] + [t.num_leaves for t in call.arg_trees]).tolist()
    parts = [(sub, starts[a], starts[a + 1], any(need[starts[a]:starts[a + 1]]))
             for a, sub in enumerate(call.arg_trees)]

    def nested(outs):
        full = list(blank)
        for i, o in zip(slots, outs):
            full[i] = o
        return tuple(sub.unflatten(full[s:e]) if asked else None for sub, s, e, asked in parts)
    return nested


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

    Accepts what a host rule's outputs may be (see ``routes._host``): values of
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
        if shape == a.shape and dtype != a.dtype and weak_promotes(o, a.dtype):
            o = lax.convert_element_type(o, a.dtype)
        elif shape != a.shape or dtype != a.dtype:
            got = f"{dtype}{list(shape)}" if shape is not None else type(o).__name__
            raise TypeError(
                f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} returned {got} for {name}; "
                f"expected {a.str_short()}")
        res.append(o)
    return res


def weak_promotes(o, dtype) -> bool:
    """Whether ``o`` is weakly typed and JAX's promotion with ``dtype`` gives ``dtype``."""
    if not isinstance(o, (jax.Array, Tracer)) or not jax.typeof(o).weak_type:
        return False
    return jnp.result_type(o, dtype) == dtype
