"""The five roles an op's primitives play, and what implements each.

=========  ===========================  ================================
role       operands                     computes
=========  ===========================  ================================
primal     (xs, ks)                     f(x)
fwd        (xs, ks)                     f(x) and residuals r (fwd rule)
jvp        (xs, ks, [rs], ẋ)            ∂f(x)·ẋ, linear in ẋ
vjp        (xs, ks, [rs], ȳ)            ∂f(x)ᵀ·ȳ, linear in ȳ (bwd rule on r, if any)
transpose  (ks, ȳ)                      Aᵀ·ȳ for a linear op f(x) = A·x
=========  ===========================  ================================

Each role's forms (plain, in place, symmetric, multilinear, derived from
another rule) are side by side in its own module:

=============  =====================================================================
module         forms
=============  =====================================================================
``_primal``    the function (plain, in place), the fwd rule, the vmap rule
``_jvp``       plain, in place, derived from a traced vjp rule, JAX's jvp of traced f
``_vjp``       plain, in place, bwd rule (plain, in place), symmetric
``_transpose`` plain, in place, self (symmetric), JAX's of traced f, multilinear
``_common``    zeros, operand layout and output checks they share
=============  =====================================================================

``rule_of`` says whose code implements a role, ``make_run`` builds its runner
``run(*operands) -> leaves`` (in place: ``run(ins, outs) -> None``).

A ``symmetric=True`` op has ∂f(x)ᵀ = ∂f(x): its vjp role runs the jvp rule
with ȳ as the tangent, and a linear one is its own transpose. "Transpose" is
JAX's: no complex conjugation, ⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩ with ⟨a, b⟩ = Re Σ a·b.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._errors import MissingRuleError
from .._spec import Call, Rule, fmt_aval
from . import _jvp, _op_rule, _primal, _transpose, _vjp
from ._common import (
    ROLE_NAMES,
    ROLES,
    Layout,
    check_traced_outputs,
    out_avals,
    out_names,
    role_name,
    uses_residuals,
)

__all__ = ["ROLES", "ROLE_NAMES", "Layout", "MissingRuleError", "check_symmetric", "derives_jvp",
           "make_run", "missing_rule_message", "out_avals", "out_names", "role_name",
           "rule_of", "traced_run", "traced_tangents", "uses_residuals"]


def derives_jvp(call: Call) -> bool:
    """Whether the jvp is the transpose of a traced vjp rule (the op has no jvp rule)."""
    vr = call.op.vjp_rule
    return (call.op.jvp_rule is None and vr is not None and vr.traced
            and not uses_residuals(call))


def check_symmetric(call: Call) -> None:
    """A symmetric Jacobian is square: one positional argument, an output like it."""
    op = call.op
    if call.n_args != 1 or call.out_tree != call.arg_trees[0] \
            or call.out_avals != call.in_avals or not all(call.float_in):
        raise TypeError(
            f"anybind op '{op.name}' is declared symmetric=True, so its Jacobian must be "
            f"square: one positional argument of floating or complex leaves and an output of "
            f"the same structure, shapes and dtypes; got {call.n_args} positional "
            f"argument(s) with leaves {[fmt_aval(a) for a in call.in_avals]} and outputs "
            f"{[fmt_aval(a) for a in call.out_avals]}")
    given = [k for k in ("vjp", "fwd", "bwd") if getattr(op, f"{k}_rule") is not None]
    if given:
        raise TypeError(
            f"anybind op '{op.name}' is declared symmetric=True, so its jvp rule serves as "
            f"the vjp; it cannot also have a {' or '.join(given)} rule. Drop symmetric=True "
            f"to use them")


def rule_of(role: str, call: Call, need=None) -> Rule | None:
    """The user's code that implements a role, or None when it is missing."""
    op = call.op
    if role == "transpose" and op.multilinear:
        return _transpose.multilinear_rule(call, need)
    if role == "primal":
        return Rule(op.fn, op.traced, out=op.inplace, device=op.device, host=op.host)
    if role == "fwd":
        return op.fwd_rule
    if role == "jvp":
        if op.jvp_rule is None and derives_jvp(call):  # f_jvp transposes the traced vjp
            return op.vjp_rule
        if op.jvp_rule is None and op.symmetric and op.traced:
            return Rule(_jvp.jax_jvp_rule(op.fn), True)
        return op.jvp_rule
    if role == "vjp":
        if op.symmetric:  # the jvp rule, run with ȳ as its tangent
            return rule_of("jvp", call)
        return op.bwd_rule if uses_residuals(call) else op.vjp_rule
    if op.transpose_rule is not None:
        return op.transpose_rule
    if op.linear and op.symmetric and not op.inplace:
        return Rule(_transpose.self_transpose(op.fn), op.traced, device=op.device,
                    host=op.host and _transpose.self_transpose(op.host))
    if op.linear and op.traced:  # JAX transposes the traced function itself
        return Rule(op.fn, True)
    return None


def make_run(role: str, call: Call, rule: Rule, lin, need, xp, lead) -> Callable:
    """The runner of ``role`` by ``rule``: ``run(*operands) -> leaves``, or for a host rule
    registered with ``out=True``, ``run(ins, outs) -> None``."""
    if rule.traced and call.converted is not None:  # code closing over tracers, hoisted
        run = call.converted.run(role, call, lin, need)
        if run is not None:
            return run
    op, zeros_as_none = call.op, rule.symbolic_zeros
    if _op_rule.is_op(rule.fn) and role in _op_rule.ROLES and not (
            role == "jvp" and derives_jvp(call)):  # an op as the rule: a rule of the rule
        if role == "vjp" and uses_residuals(call):
            raise TypeError(f"anybind op '{op.name}': an op as the bwd rule is not supported; "
                            f"give it as the vjp rule (def_vjp), without def_fwd")
        return _op_rule.run(role, call, rule.fn, lin, need)
    if role == "primal":
        return _primal.primal(call, rule.fn, xp, lead, inplace=rule.out)
    if role == "fwd":
        if rule.out:
            raise TypeError(f"anybind op '{op.name}': the fwd rule cannot be in place")
        return _primal.fwd(call, rule.fn, xp, lead)
    if role == "jvp":
        if derives_jvp(call) and not rule.out:
            return _jvp.transposed_vjp(
                call, lin, traced_run("vjp", call, op.vjp_rule, call.float_out, lin))
        return _jvp.jvp(call, rule.fn, lin, xp, lead, zeros_as_none, inplace=rule.out)
    if role == "vjp":
        if uses_residuals(call):
            return _vjp.bwd(call, rule.fn, lin, need, xp, lead, zeros_as_none, inplace=rule.out)
        if op.symmetric and not rule.out:
            return _vjp.symmetric_vjp(call, rule.fn, lin, need, xp, lead, zeros_as_none)
        return _vjp.vjp(call, rule.fn, lin, need, xp, lead, zeros_as_none, inplace=rule.out)
    if rule.out:
        return _transpose.transpose(call, rule.fn, lin, need, xp, lead, zeros_as_none,
                                    rule.input_shapes, inplace=True)
    if op.multilinear:
        return _transpose.multilinear(call, rule, need, xp, lead)
    if op.transpose_rule is None and op.symmetric:  # its own transpose
        return _transpose.transpose(call, rule.fn, lin, need, xp, lead)
    if op.transpose_rule is None:  # derived from a traced linear function
        primal = make_run("primal", call, Rule(op.fn, True), None, None, jnp, ())
        return _transpose.traced_linear_transpose(call, lin, need, primal)
    return _transpose.transpose(call, rule.fn, lin, need, xp, lead, zeros_as_none,
                                rule.input_shapes)


def missing_rule_message(role: str, op) -> str:
    if role == "jvp":
        return (f"anybind op '{op.name}' has no jvp rule, so forward-mode differentiation "
                f"(jvp, jacfwd, linearize) cannot evaluate its tangent; add one with "
                f"op.def_jvp(rule), or give a traced vjp rule (def_vjp(rule, traced=True)), "
                f"from which the jvp is derived by transposition")
    if role == "vjp" and op.symmetric:
        return (f"anybind op '{op.name}' is declared symmetric=True, so reverse mode runs its "
                f"jvp rule, but it has none; add one with op.def_jvp(rule)")
    if role == "vjp":
        return (f"anybind op '{op.name}' has no vjp rule, so reverse-mode differentiation "
                f"(grad, vjp, jacrev, linear_transpose of its tangent map) cannot run; add one "
                f"with op.def_vjp(rule), or make its jvp rule traced "
                f"(def_jvp(rule, traced=True)) so that JAX can transpose it")
    return (f"anybind op '{op.name}' is linear but has no transpose rule, so reverse mode "
            f"(grad, vjp, linear_transpose) cannot run; add one with op.def_transpose(rule)")


def traced_run(role: str, call: Call, rule: Rule, lin, need) -> Callable[..., list]:
    """A role run by traced code: ``make_run`` on jax.numpy, its outputs checked and
    conformed by ``check_traced_outputs``."""
    run = make_run(role, call, rule, lin, need, jnp, ())
    return checked(call, role, run, out_avals(role, call, lin, need), out_names(role, call, need))


def traced_tangents(call: Call, rule: Rule, lin) -> Callable[..., list]:
    """The tangents of f's floating outputs by a traced jvp rule, None where the rule
    returned None: a zero that JAX keeps symbolic, so that the next rule sees None too."""
    if call.converted is not None:
        return traced_run("jvp", call, rule, lin, None)
    run = _jvp.jvp(call, rule.fn, lin, jnp, (), rule.symbolic_zeros, keep_none=True)
    avals, names = out_avals("jvp", call, lin, None), out_names("jvp", call, None)

    def f(*ops):
        outs = concrete_errors_named(call, "jvp", run, ops)
        kept = [j for j, o in enumerate(outs) if o is not None]
        good = check_traced_outputs(call, "jvp", [outs[j] for j in kept],
                                    [avals[j] for j in kept], [names[j] for j in kept])
        res = [None] * len(outs)
        for j, o in zip(kept, good):
            res[j] = o
        return res
    return f


def checked(call: Call, role: str, run: Callable, avals, names) -> Callable[..., list]:
    def f(*ops):
        return check_traced_outputs(call, role, concrete_errors_named(call, role, run, ops),
                                    avals, names)
    return f


_CONCRETE = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError)


def concrete_errors_named(call: Call, role: str, run: Callable, ops) -> list:
    """``run(*ops)`` for traced code; NumPy or a Python branch on a traced value in it
    is an error naming the op and the rule (JAX's own names neither)."""
    try:
        return run(*ops)
    except _CONCRETE as e:
        what = role_name(role, call)
        hint = ("give it as a host rule (op.def_" + role + "(rule), traced=False: it "
                "receives NumPy arrays), or write it in jax.numpy"
                if role != "primal" else
                "write it in jax.numpy, or bind it without traced=True as host code")
        raise TypeError(
            f"anybind op '{call.op.name}': its {what} is traced (JAX code: traced=True, "
            f"which rules given to ab.bind share with the function) but needs a concrete "
            f"value ({type(e).__name__}): {hint}") from e
