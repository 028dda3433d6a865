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

from collections.abc import Callable

import numpy as np

from .._spec import Call
from ._common import (
    Layout,
    check_none,
    cotangent_maker,
    cotangent_out,
    filler,
    flatten_outputs,
    flatten_per_arg,
    form,
    needs,
    selector,
    simple,
    zeros_of,
)


def vjp(call: Call, fn: Callable, lin, need, xp, lead=(), symbolic: bool = False,
        inplace: bool = False) -> Callable:
    """``vjp(primals, ȳ, **kw)``; ``inplace``: ``vjp(primals, ȳ, out=∂f(x)ᵀ·ȳ, **kw)``."""
    n = call.n_in
    extra = {"needs": needs(call, need)} if symbolic else {}
    if simple(call) and all(lin) and (inplace or xp is np):  # the hot path: x1, … ↦ one array
        if inplace:
            out_of = cotangent_out(call, need)

            def run_simple_inplace(ins, outs) -> None:
                check_none(call, "vjp", fn(tuple(ins[:n]), ins[n], out=out_of(outs), **extra))
            return run_simple_inplace
        picked = [(i, zeros_of(xp, lead, a)) for i, (k, a) in enumerate(zip(need, call.in_avals))
                  if k]

        def run_simple(*ops):
            out = fn(ops[:n], ops[n], **extra)
            if type(out) is not tuple or len(out) != n:
                flatten_per_arg(call, "vjp", out)  # raises the error
            return [z if out[i] is None else out[i] for i, z in picked]
        return run_simple
    lay = Layout("vjp", call)
    cotangent = cotangent_maker(call, lin, np if inplace else xp, lead, symbolic)

    def args_of(ops):
        xs, ks, _, cts = lay.split(ops)
        return (call.args(xs), cotangent(cts)), {**call.kwargs(ks), **extra}
    return _per_arg(call, "vjp", fn, args_of, need, xp, lead, inplace)


def bwd(call: Call, fn: Callable, lin, need, xp, lead=(), symbolic: bool = False,
        inplace: bool = False) -> Callable:
    """``bwd(residuals, ȳ, **kw)``; ``inplace``: ``bwd(residuals, ȳ, out=∂f(x)ᵀ·ȳ, **kw)``."""
    extra = {"needs": needs(call, need)} if symbolic else {}
    lay = Layout("vjp", call)
    cotangent = cotangent_maker(call, lin, np if inplace else xp, lead, symbolic)

    def args_of(ops):
        _, ks, rs, cts = lay.split(ops)
        return (call.res_tree.unflatten(rs), cotangent(cts)), {**call.kwargs(ks), **extra}
    return _per_arg(call, "bwd", fn, args_of, need, xp, lead, inplace)


def _per_arg(call: Call, role: str, fn: Callable, args_of: Callable, need, xp, lead,
             inplace: bool) -> Callable:
    """A rule returning one cotangent per positional argument (or writing them)."""
    if inplace:
        return form(call, role, fn, args_of, None, cotangent_out(call, need))
    select = selector(need, call.in_avals, xp, lead)
    return form(call, role, fn, args_of, lambda out: select(flatten_per_arg(call, role, out)))


def symmetric_vjp(call: Call, fn: Callable, lin, need, xp, lead=(),
                  symbolic: bool = False) -> Callable[..., list]:
    """∂f(x)ᵀ·ȳ = ∂f(x)·ȳ: the jvp rule with the cotangent ȳ as its tangent.

    The output is structured like the one positional argument, so ȳ's leaves
    are that argument's tangent leaves and the rule's output leaves are its
    cotangent leaves.
    """
    lay = Layout("vjp", call)
    fill = filler(lin, call.out_avals, call.float_out, xp, lead, symbolic)
    select = selector(need, call.in_avals, xp, lead)

    def args_of(ops):
        xs, ks, _, cts = lay.split(ops)
        return (call.args(xs), call.args(fill(cts))), call.kwargs(ks)
    return form(call, "symmetric", fn, args_of,
                lambda out: select(flatten_outputs(call, "symmetric", out)))
