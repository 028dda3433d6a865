"""A rule that is itself an op (``op.def_vjp(vjp_op)``): a rule of the rule.

An op given as a jvp, vjp or transpose rule is called with that rule's buffers
of the compiled calling convention, as positional arguments, and returns what
the compiled rule would write (the table in ``routes/_compiled``):

=========  ==========================  ==========================
role       positional arguments        returns
=========  ==========================  ==========================
jvp        x…, k…, ẋ…                  ẏ…             ∂f(x)·ẋ
vjp        x…, k…, ȳ…                  x̄…             ∂f(x)ᵀ·ȳ
transpose  k…, ȳ…                      x̄…             Aᵀ·ȳ
=========  ==========================  ==========================

tangents and cotangents for floating leaves only, zeros where JAX has a
symbolic zero; one array, or a tuple, of the floating leaves. The rule runs
as traced code, so JAX differentiates it through the rule op's own rules: a
compiled vjp rule bound as an op with a compiled jvp rule of its own gives
``jax.hessian`` of the outer op.
"""
from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import tree_util

from .._spec import Call
from ._common import Layout

ROLES = ("jvp", "vjp", "transpose")


def is_op(fn) -> bool:
    """Whether ``fn`` is an anybind op (which, as a rule, is a rule of the rule)."""
    return getattr(fn, "anybind_op", False) is True


def run(role: str, call: Call, rule_op, lin, need) -> Callable[..., list]:
    """``run(*operands) -> leaves`` of ``role`` by ``rule_op``, as ``make_run`` gives."""
    lay = Layout(role, call)

    def filled(present, operands, avals, floats):
        it, res = iter(operands), []
        for p, a, f in zip(present, avals, floats):
            if p:
                res.append(next(it))
            elif f:
                res.append(jnp.zeros(a.shape, a.dtype))
        return res

    def f(*ops):
        xs, ks, _, rest = lay.split(list(ops))
        if role == "jvp":
            outs = rule_op(*xs, *ks, *filled(lin, rest, call.in_avals, call.float_in))
            return tree_util.tree_leaves(outs)
        cts = filled(lin, rest, call.out_avals, call.float_out)
        outs = tree_util.tree_leaves(rule_op(*xs, *ks, *cts) if role == "vjp"
                                     else rule_op(*ks, *cts))
        floats = [i for i, fl in enumerate(call.float_in) if fl]
        if len(outs) != len(floats):
            raise TypeError(
                f"anybind op '{call.op.name}': its {role} rule, the op "
                f"'{getattr(rule_op, 'name', rule_op)}', returned {len(outs)} arrays; it "
                f"returns one cotangent per floating input leaf, {len(floats)} here")
        return [outs[floats.index(i)] for i, k in enumerate(need) if k]
    return f
