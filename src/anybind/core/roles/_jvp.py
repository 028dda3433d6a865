"""The jvp role: (x, ẋ) ↦ ∂f(x)·ẋ, linear in ẋ.

==========================  ==============================================================
form                        what runs
==========================  ==============================================================
plain                       ``jvp(primals, tangents, **kw) -> tangent of the output``
in place (``out=True``)     ``jvp(primals, tangents, out=out, **kw) -> None``; ``out``
                            holds the tangent buffer of each floating output leaf
derived from a traced vjp   ẋ ↦ the transpose of the traced vjp rule ȳ ↦ ∂f(x)ᵀ·ȳ
traced, symmetric, no rule  JAX's own jvp of the traced function
==========================  ==============================================================

Operands: xs, ks, [rs], ẋ (the present tangents, by ``lin``); outputs: the
tangents of the floating output leaves.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from .._errors import MissingRuleError
from .._jax import jaxpr_as_fun
from .._spec import Call
from ._common import Layout, filler, flatten_outputs, form, out_avals, selector


def jvp(call: Call, fn: Callable, lin: Sequence[bool], xp, lead=(),
        symbolic: bool = False, keep_none: bool = False,
        inplace: bool = False) -> Callable:
    """``jvp(primals, tangents, **kw)``; ``keep_none``: a None the rule returns stays None
    (a zero JAX keeps symbolic); ``inplace``: ``jvp(primals, tangents, out=∂f(x)·ẋ)``."""
    lay = Layout("jvp", call)
    fill = filler(lin, call.in_avals, call.float_in, np if inplace else xp, lead, symbolic)

    def args_of(ops):
        xs, ks, _, ts = lay.split(ops)
        return (call.args(xs), call.args(fill(ts))), call.kwargs(ks)

    if inplace:
        return form(call, "jvp", fn, args_of, None, tangent_out(call))
    if keep_none:
        floats = [j for j, f in enumerate(call.float_out) if f]
        select = lambda leaves: [leaves[j] for j in floats]  # noqa: E731
    else:
        select = selector(call.float_out, call.out_avals, xp, lead)
    return form(call, "jvp", fn, args_of, lambda out: select(flatten_outputs(call, "jvp", out)))


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


def jax_jvp_rule(fn: Callable) -> Callable:
    """JAX's own jvp of a traced function, as a jvp rule."""
    def jvp(primals, tangents, **kw):
        return jax.jvp(lambda *a: fn(*a, **kw), primals, tangents)[1]
    return jvp


def transposed_vjp(call: Call, lin, vjp_run: Callable) -> Callable[..., list]:
    """ẋ ↦ ∂f(x)·ẋ as the transpose of the traced vjp rule ȳ ↦ ∂f(x)ᵀ·ȳ.

    Built only when ``f_jvp`` itself is evaluated (forward mode); reverse mode
    transposes ``f_jvp`` into ``f_vjp``, which runs the rule as given, so a vjp
    rule that is not linear in ȳ (clipping, straight-through) serves reverse mode.
    """
    lay = Layout("jvp", call)
    run = vjp_run
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals("jvp", call, None, None)]

    def run_jvp(*ops):
        xs, ks, _, ts = lay.split(ops)
        vjp_jaxpr = jax.make_jaxpr(lambda *cts: run(*xs, *ks, *cts))(*sds)  # the rule's errors
        try:
            return list(jax.linear_transpose(jaxpr_as_fun(vjp_jaxpr), *sds)(list(ts)))
        except Exception as e:  # JAX raises NotImplementedError, AssertionError, RuntimeError
            raise MissingRuleError(
                f"anybind op '{call.op.name}' has no jvp rule, and its traced vjp rule is not "
                f"linear in the cotangent, so forward mode (jvp, jacfwd, linearize) cannot "
                f"derive one by transposing it ({type(e).__name__}: {e}). Such a vjp rule "
                f"(clipping, straight-through, gradient reversal) serves reverse mode only; "
                f"give a jvp rule (op.def_jvp(rule, traced=True)) for forward mode") from e
    return run_jvp
