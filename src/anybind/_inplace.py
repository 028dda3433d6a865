"""In-place rules: host derivative rules that write into XLA's buffers (``out=True``).

A rule registered with ``out=True`` gets one more keyword, ``out``: writable
NumPy views of the buffers XLA allocated for the role's results. It writes
every element of every array in ``out`` and returns None; nothing is copied.

=========  ======================================  ==========================================
rule       called as                               ``out`` holds
=========  ======================================  ==========================================
jvp        jvp(primals, tangents, out=out, **kw)   a pytree like the output: the tangent of
                                                   each floating leaf (∂f(x)·ẋ), None at
                                                   integer leaves
vjp        vjp(primals, ct, out=out, **kw)         a tuple, one entry per positional
bwd        bwd(residuals, ct, out=out, **kw)       argument: a pytree like it of the
transpose  transpose(ct, out=out, **kw)            cotangents asked for (∂f(x)ᵀ·ȳ, Aᵀ·ȳ),
                                                   None at leaves not asked for (integer
                                                   leaves, arguments not differentiated),
                                                   and None for an argument with none
vmap       rule(size, in_batched, *args, out=out)  a pytree like the output, every leaf
                                                   with the batch axis (length ``size``) at 0
=========  ======================================  ==========================================

A zero cotangent is written as zeros (``out[i][...] = 0``). Zero inputs arrive
as in ``_impls`` (zero arrays, or None with ``symbolic_zeros=True``, which also
passes ``needs``). Under ``vmap`` the views carry the batch axis like the
inputs (``vectorized``: a leading axis; ``sequential``: one row at a time).

``make_run`` returns ``run(ins, outs) -> None`` over a role's flat operands
(as in ``_impls``) and its output views in the order of ``_roles.out_avals``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ._impls import ROLE_NAMES, _cotangent_maker, _filler, _needs, _simple
from ._spec import Batch, Call, InBatched


def _check_none(call: Call, role: str, res) -> None:
    if res is not None:
        raise TypeError(
            f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} is registered with out=True, "
            f"so it writes its results into out= and must return None; it returned "
            f"{type(res).__name__}")


def tangent_out(call: Call) -> Callable[[list], object]:
    """The views of the floating outputs' tangents ↦ ``out`` of a jvp rule."""
    if call.leaf_out:
        return lambda outs: outs[0]
    slots = [j for j, f in enumerate(call.float_out) if f]
    blank = [None] * len(call.out_avals)

    def make(outs):
        full = list(blank)
        for j, o in zip(slots, outs):
            full[j] = o
        return call.out_tree.unflatten(full)
    return make


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


def jvp(call: Call, fn: Callable, lin, lead=(), symbolic: bool = False) -> Callable:
    """jvp(primals, tangents, out=∂f(x)·ẋ)."""
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    fill = _filler(lin, call.in_avals, call.float_in, np, lead, symbolic)
    out_of = tangent_out(call)

    def run(ins, outs) -> None:
        xs, ks, ts = ins[:n], ins[n:n + m], ins[n + m + r:]
        _check_none(call, "jvp", fn(call.args(xs), call.args(fill(ts)), out=out_of(outs),
                                    **call.kwargs(ks)))
    return run


def vjp(call: Call, fn: Callable, lin, need, lead=(), symbolic: bool = False) -> Callable:
    """vjp(primals, ȳ, out=∂f(x)ᵀ·ȳ)."""
    n, m = call.n_in, len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    out_of = cotangent_out(call, need)
    if _simple(call) and all(lin):  # the hot path: x1, x2, ... ↦ one array
        def run_simple(ins, outs) -> None:
            _check_none(call, "vjp", fn(tuple(ins[:n]), ins[n], out=out_of(outs), **extra))
        return run_simple
    cotangent = _cotangent_maker(call, lin, np, lead, symbolic)

    def run(ins, outs) -> None:
        xs, ks, cts = ins[:n], ins[n:n + m], ins[n + m:]
        _check_none(call, "vjp", fn(call.args(xs), cotangent(cts), out=out_of(outs),
                                    **call.kwargs(ks), **extra))
    return run


def bwd(call: Call, fn: Callable, lin, need, lead=(), symbolic: bool = False) -> Callable:
    """bwd(residuals, ȳ, out=∂f(x)ᵀ·ȳ)."""
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    cotangent = _cotangent_maker(call, lin, np, lead, symbolic)
    out_of = cotangent_out(call, need)

    def run(ins, outs) -> None:
        ks, rs, cts = ins[n:n + m], ins[n + m:n + m + r], ins[n + m + r:]
        _check_none(call, "bwd", fn(call.res_tree.unflatten(rs), cotangent(cts),
                                    out=out_of(outs), **call.kwargs(ks), **extra))
    return run


def transpose(call: Call, fn: Callable, lin, need, lead=(), symbolic: bool = False,
              input_shapes: bool = False) -> Callable:
    """transpose(ȳ, out=Aᵀ·ȳ)."""
    m = len(call.kw_avals)
    extra = {"needs": _needs(call, need)} if symbolic else {}
    if input_shapes:
        extra["input_shapes"] = call.input_shapes
    cotangent = _cotangent_maker(call, lin, np, lead, symbolic)
    out_of = cotangent_out(call, need)

    def run(ins, outs) -> None:
        ks, cts = ins[:m], ins[m:]
        _check_none(call, "transpose", fn(cotangent(cts), out=out_of(outs), **call.kwargs(ks),
                                          **extra))
    return run


def vmap_rule(call: Call, fn: Callable, batch: Batch) -> Callable:
    """rule(axis_size, in_batched, *args, out=f(x) for every row)."""
    n, mask = call.n_in, batch.mask
    in_batched = InBatched(call.args_tree.unflatten(mask[:n]))
    in_batched.kwargs = call.kw_tree.unflatten(mask[n:])
    out_of = (lambda outs: outs[0]) if call.leaf_out else call.out_tree.unflatten

    def run(ins, outs) -> None:
        args = [x if m else x[0] for x, m in zip(ins, mask)]
        _check_none(call, "vmap", fn(batch.size, in_batched, *call.args(args[:n]),
                                     out=out_of(outs), **call.kwargs(args[n:])))
    return run


def make_run(role: str, call: Call, rule, lin, need, lead) -> Callable:
    """The in-place runner of a derived role's host rule."""
    if role == "jvp":
        return jvp(call, rule.fn, lin, lead, rule.symbolic_zeros)
    if role == "vjp" and call.res_tree is not None:
        return bwd(call, rule.fn, lin, need, lead, rule.symbolic_zeros)
    if role == "vjp":
        return vjp(call, rule.fn, lin, need, lead, rule.symbolic_zeros)
    if role == "transpose":
        return transpose(call, rule.fn, lin, need, lead, rule.symbolic_zeros,
                         rule.input_shapes)
    raise TypeError(f"anybind op '{call.op.name}': the {ROLE_NAMES[role]} cannot be in place")
