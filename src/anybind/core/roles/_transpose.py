"""The transpose role: ȳ ↦ Aᵀ·ȳ for a linear op f(x) = A·x.

==========================  ==============================================================
form                        what runs
==========================  ==============================================================
plain                       ``transpose(ct, **kw) -> one cotangent per argument``
in place (``out=True``)     ``transpose(ct, out=out, **kw) -> None``
traced linear, no rule      JAX's transpose of the traced function
symmetric linear, no rule   the function itself (A = Aᵀ)
multilinear                 the rule of one argument i, ``rule(primals, ct, **kw)``
                            with ``primals[i]`` None, or JAX's transpose in argument i
==========================  ==============================================================

Operands: ks, ȳ (present ones, by ``lin``); for a multilinear op, the other
arguments too (see ``_multilinear``). Outputs: the cotangent leaves ``need``
marks. ``symbolic_zeros`` and ``out=True`` as for the vjp role.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from .._errors import MissingRuleError
from .._multilinear import index_of, need_of, owners, split
from .._spec import Call, Rule
from ._common import (
    Layout,
    cotangent_maker,
    cotangent_out,
    fill,
    flatten_per_arg,
    form,
    needs,
    selector,
    zeros_of,
)
from ._primal import primal


def transpose(call: Call, fn: Callable, lin, need, xp, lead=(), symbolic: bool = False,
              input_shapes: bool = False, inplace: bool = False) -> Callable:
    """``transpose(ȳ, **kw)``; ``inplace``: ``transpose(ȳ, out=Aᵀ·ȳ, **kw)``."""
    extra = {"needs": needs(call, need)} if symbolic else {}
    if input_shapes:
        extra["input_shapes"] = call.input_shapes
    lay = Layout("transpose", call)
    cotangent = cotangent_maker(call, lin, np if inplace else xp, lead, symbolic)

    def args_of(ops):
        _, ks, _, cts = lay.split(ops)
        return (cotangent(cts),), {**call.kwargs(ks), **extra}
    if inplace:
        return form(call, "transpose", fn, args_of, None, cotangent_out(call, need))
    select = selector(need, call.in_avals, xp, lead)
    return form(call, "transpose", fn, args_of,
                lambda out: select(flatten_per_arg(call, "transpose", out)))


def self_transpose(fn: Callable) -> Callable:
    """A symmetric linear function as its own transpose rule."""
    return lambda ct, **kw: (fn(ct, **kw),)


def traced_linear_transpose(call: Call, lin, need, primal_run: Callable) -> Callable[..., list]:
    lay = Layout("transpose", call)
    fwd = primal_run
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in call.in_avals]

    def run(*ops):
        _, ks, _, cts = lay.split(ops)
        full = fill(lin, cts, call.out_avals, call.float_out, jnp, (), False)
        t = jax.linear_transpose(lambda *xs: fwd(*xs, *ks), *sds)(full)
        return [c for c, k in zip(t, need) if k]
    return run


def multilinear_rule(call: Call, need) -> Rule:
    """The transpose rule in the argument whose leaves ``need`` marks."""
    op, i = call.op, index_of("transpose", call, need)
    rule = op.transpose_rules.get(i)
    if rule is not None:
        return rule
    if op.traced:  # JAX transposes the traced function in argument i
        return Rule(op.fn, True)
    raise MissingRuleError(
        f"anybind op '{op.name}' is multilinear but has no transpose rule for argument {i}, "
        f"so reverse mode (grad, vjp, jacrev) or linear_transpose in it cannot run; add one "
        f"with op.def_transpose(rule, argnum={i}), rule(primals, ct, **kw) returning the "
        f"cotangent of argument {i}")


def multilinear(call: Call, rule, need, xp, lead) -> Callable[..., list]:
    """The operands of f_transpose in argument i ↦ the leaves of x̄ᵢ, by the user's rule
    ``rule(primals, ct, **kw)`` (primals[i] None), or by JAX for a traced function."""
    i = index_of("transpose", call, need)
    if call.op.transpose_rules.get(i) is None:
        return multilinear_traced(call, i)
    owner = owners(call, i)
    sub = call.arg_trees[i]
    avals = [a for a, k in zip(call.in_avals, need) if k]
    zeros = [zeros_of(xp, lead, a) for a in avals]

    def run(*ops):
        z, ks = split(owner, ops)
        primals = tuple(None if j == i else call.arg_trees[j].unflatten(z[j])
                        for j in range(call.n_args))
        ct = z[call.n_args][0] if call.leaf_out else call.out_tree.unflatten(z[call.n_args])
        out = rule.fn(primals, ct, **call.kwargs(ks))
        if out is None:
            return list(zeros)
        try:
            leaves = sub.flatten_up_to(out)
        except (ValueError, TypeError) as e:
            raise TypeError(
                f"anybind op '{call.op.name}': the transpose rule for argument {i} must return "
                f"the cotangent of argument {i}, structured like it ({sub}); got structure "
                f"{tree_util.tree_structure(out)} ({e})") from None
        return [zr if l is None else l for l, zr in zip(leaves, zeros)]
    return run


def multilinear_traced(call: Call, i: int) -> Callable[..., list]:
    """JAX's transpose of a traced function in argument i, the others fixed."""
    owner, n = owners(call, i), call.n_args
    fwd = primal(call, call.op.fn, jnp)
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype)
           for a, k in zip(call.in_avals, need_of(call, i)) if k]

    def run(*ops):
        z, ks = split(owner, ops)

        def f(*xi):
            z[i] = list(xi)
            return fwd(*[leaf for j in range(n) for leaf in z[j]], *ks)
        return list(jax.linear_transpose(f, *sds)(list(z[n])))
    return run
