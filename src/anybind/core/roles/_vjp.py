"""The vjp role: (x, ȳ) ↦ ∂f(x)ᵀ·ȳ, linear in ȳ; with residuals, the bwd rule.

==========================  ==============================================================
form                        what runs
==========================  ==============================================================
plain                       ``vjp(primals, ct, **kw) -> one cotangent per argument``
in place (``out=True``)     ``vjp(primals, ct, out=out, **kw) -> None``
bwd rule                    ``bwd(residuals, ct, **kw) -> one cotangent per argument``
bwd rule in place           ``bwd(residuals, ct, out=out, **kw) -> None``
symmetric (∂f = ∂fᵀ)        the jvp rule, run with ȳ as its tangent
==========================  ==============================================================

Operands: xs, ks, [rs], ȳ (the present cotangents, by ``lin``); outputs: the
cotangent leaves ``need`` marks. With ``symbolic_zeros=True`` the rule also
gets ``needs``, one bool per positional argument, and may return None for
arguments nobody asked for. In place, ``out`` is a tuple with one entry per
positional argument (None for an argument with no cotangent needed) and a
zero cotangent is written as zeros.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._spec import Call
from ._common import (check_none, cotangent_maker, cotangent_out, filler, flatten_outputs,
                      flatten_per_arg, needs, selector, simple, zeros_of)


def vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m = call.n_in, len(call.kw_avals)
    extra = {"needs": needs(call, need)} if symbolic else {}
    if simple(call) and all(lin) and xp is np:  # the hot path: x1, x2, ... ↦ one array
        picked = [(i, zeros_of(xp, lead, a)) for i, (k, a) in enumerate(zip(need, call.in_avals))
                  if k]

        def run_simple(*ops):
            out = fn(ops[:n], ops[n], **extra)
            if type(out) is not tuple or len(out) != n:
                flatten_per_arg(call, "vjp", out)  # raises the error
            return [z if out[i] is None else out[i] for i, z in picked]
        return run_simple
    cotangent = cotangent_maker(call, lin, xp, lead, symbolic)
    select = selector(need, call.in_avals, xp, lead)

    def run(*ops):
        xs, ks, cts = ops[:n], ops[n:n + m], ops[n + m:]
        out = fn(call.args(xs), cotangent(cts), **call.kwargs(ks), **extra)
        return select(flatten_per_arg(call, "vjp", out))
    return run


def vjp_inplace(call: Call, fn: Callable, lin, need, lead=(), symbolic: bool = False) -> Callable:
    """vjp(primals, ȳ, out=∂f(x)ᵀ·ȳ)."""
    n, m = call.n_in, len(call.kw_avals)
    extra = {"needs": needs(call, need)} if symbolic else {}
    out_of = cotangent_out(call, need)
    if simple(call) and all(lin):  # the hot path: x1, x2, ... ↦ one array
        def run_simple(ins, outs) -> None:
            check_none(call, "vjp", fn(tuple(ins[:n]), ins[n], out=out_of(outs), **extra))
        return run_simple
    cotangent = cotangent_maker(call, lin, np, lead, symbolic)

    def run(ins, outs) -> None:
        xs, ks, cts = ins[:n], ins[n:n + m], ins[n + m:]
        check_none(call, "vjp", fn(call.args(xs), cotangent(cts), out=out_of(outs),
                                    **call.kwargs(ks), **extra))
    return run


def bwd(call: Call, fn: Callable, lin, need, xp, lead=(),
        symbolic: bool = False) -> Callable[..., list]:
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    extra = {"needs": needs(call, need)} if symbolic else {}
    cotangent = cotangent_maker(call, lin, xp, lead, symbolic)
    select = selector(need, call.in_avals, xp, lead)

    def run(*ops):
        ks, rs, cts = ops[n:n + m], ops[n + m:n + m + r], ops[n + m + r:]
        out = fn(call.res_tree.unflatten(rs), cotangent(cts), **call.kwargs(ks), **extra)
        return select(flatten_per_arg(call, "bwd", out))
    return run


def bwd_inplace(call: Call, fn: Callable, lin, need, lead=(), symbolic: bool = False) -> Callable:
    """bwd(residuals, ȳ, out=∂f(x)ᵀ·ȳ)."""
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    extra = {"needs": needs(call, need)} if symbolic else {}
    cotangent = cotangent_maker(call, lin, np, lead, symbolic)
    out_of = cotangent_out(call, need)

    def run(ins, outs) -> None:
        ks, rs, cts = ins[n:n + m], ins[n + m:n + m + r], ins[n + m + r:]
        check_none(call, "bwd", fn(call.res_tree.unflatten(rs), cotangent(cts),
                                    out=out_of(outs), **call.kwargs(ks), **extra))
    return run


def symmetric_vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
                  symbolic: bool = False) -> Callable[..., list]:
    """∂f(x)ᵀ·ȳ = ∂f(x)·ȳ: the jvp rule with the cotangent ȳ as its tangent.

    The output is structured like the one positional argument, so ȳ's leaves
    are that argument's tangent leaves and the rule's output leaves are its
    cotangent leaves.
    """
    n, m = call.n_in, len(call.kw_avals)
    fill = filler(lin, call.out_avals, call.float_out, xp, lead, symbolic)
    select = selector(need, call.in_avals, xp, lead)

    def run(*ops):
        xs, ks, cts = ops[:n], ops[n:n + m], ops[n + m:]
        out = fn(call.args(xs), call.args(fill(cts)), **call.kwargs(ks))
        return select(flatten_outputs(call, "symmetric", out))
    return run
