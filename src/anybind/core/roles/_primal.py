"""The primal role: the op's function f(x), and the fwd rule (f(x) and residuals).

==========================  ==============================================================
form                        called as
==========================  ==============================================================
plain                       ``f(*args, **kw) -> out``
in place (``out=True``)     ``f(*args, out=out, **kw) -> None``, writing every output
fwd rule                    ``fwd(*args, **kw) -> (out, residuals)``
vmap rule                   ``rule(axis_size, in_batched, *args, **kw) -> (out, out_batched)``
vmap rule in place          ``rule(axis_size, in_batched, *args, out=out, **kw) -> None``
==========================  ==============================================================

Each builder returns ``run(*operands) -> output leaves`` (in place:
``run(ins, outs) -> None``) over the role's flat operands (xs, ks).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._spec import Batch, Call, InBatched
from ._common import check_none, flatten_outputs, simple, structure_error


def _inplace_error(call: Call) -> TypeError:
    return TypeError(f"anybind op '{call.op.name}' is bound with out=True, so its function "
                     f"writes into out= and must return None")


def primal(call: Call, fn: Callable, xp, lead=(), inplace: bool = False) -> Callable:
    n = call.n_in
    if inplace:
        if simple(call):
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

    if simple(call):
        return lambda *ops: [fn(*ops)]  # the common case, without pytree handling

    def run(*ops):  # None results are refused by the host call's check or check_traced_outputs
        return flatten_outputs(call, "primal", fn(*call.args(ops[:n]), **call.kwargs(ops[n:])))
    return run


def fwd(call: Call, fn: Callable, xp, lead=()) -> Callable[..., list]:
    n = call.n_in

    def run(*ops):
        res = fn(*call.args(ops[:n]), **call.kwargs(ops[n:]))
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(f"anybind op '{call.op.name}': the fwd rule must return a pair "
                            f"(output, residuals), got {type(res).__name__}")
        out, saved = res
        leaves = flatten_outputs(call, "fwd", out)
        try:
            return leaves + call.res_tree.flatten_up_to(saved)
        except (ValueError, TypeError) as e:
            raise structure_error(call, "fwd", "residuals", call.res_tree, saved, e) from None
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
    if call.leaf_out and isinstance(out, (tuple, list)):  # the outputs first, as JAX's
        a = call.out_avals[0]
        raise TypeError(
            f"anybind op '{call.op.name}': the vmap rule returned {type(out).__name__} for "
            f"{call.out_name(0)}; expected {a.update(shape=(batch.size,) + a.shape).str_short()}")
    leaves = flatten_outputs(call, "vmap", out)
    if isinstance(out_batched, (bool, np.bool_)):
        return leaves, [bool(out_batched)] * len(leaves)
    try:
        flags = call.out_tree.flatten_up_to(out_batched)
    except (ValueError, TypeError) as e:
        raise structure_error(call, "vmap", "out_batched", call.out_tree, out_batched,
                               e) from None
    for j, f in enumerate(flags):
        if isinstance(f, (bool, np.bool_)):
            continue
        if f is None or isinstance(f, (tuple, list, dict)):  # an output leaf met a container
            raise structure_error(call, "vmap", "out_batched", call.out_tree, out_batched,
                                  f"one bool per output leaf; got {f!r} for "
                                  f"{call.out_name(j)}")
        raise TypeError(f"anybind op '{call.op.name}': the vmap rule's out_batched must hold "
                        f"Python bools (known while tracing), got {f!r} for "
                        f"{call.out_name(j)}")
    return leaves, flags


def vmap_rule_inplace(call: Call, fn: Callable, batch: Batch) -> Callable:
    """rule(axis_size, in_batched, *args, out=f(x) for every row)."""
    n, mask = call.n_in, batch.mask
    in_batched = InBatched(call.args_tree.unflatten(mask[:n]))
    in_batched.kwargs = call.kw_tree.unflatten(mask[n:])
    out_of = (lambda outs: outs[0]) if call.leaf_out else call.out_tree.unflatten

    def run(ins, outs) -> None:
        args = [x if m else x[0] for x, m in zip(ins, mask)]
        check_none(call, "vmap", fn(batch.size, in_batched, *call.args(args[:n]),
                                     out=out_of(outs), **call.kwargs(args[n:])))
    return run
