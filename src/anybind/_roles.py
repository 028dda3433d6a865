"""The four roles an op's primitives play, and what implements each.

=========  ===========================  ================================
role       operands                     computes
=========  ===========================  ================================
primal     (xs, ks)                     f(x)
fwd        (xs, ks)                     f(x) and residuals r (fwd rule)
jvp        (xs, ks, [rs], ẋ)            ∂f(x)·ẋ, linear in ẋ
vjp        (xs, ks, [rs], ȳ)            ∂f(x)ᵀ·ȳ, linear in ȳ (bwd rule on r, if any)
transpose  (ks, ȳ)                      Aᵀ·ȳ for a linear op f(x) = A·x
=========  ===========================  ================================

A ``symmetric=True`` op has ∂f(x)ᵀ = ∂f(x): its vjp role runs the jvp rule
with ȳ as the tangent, and a linear one is its own transpose. "Transpose" is
JAX's: no complex conjugation, ⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩ with ⟨a, b⟩ = Re Σ a·b.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun

from . import _impls, _inplace
from ._spec import Call, Rule


class MissingRuleError(NotImplementedError):
    """A transformation needs a rule the op does not have."""


ROLES = ("primal", "fwd", "jvp", "vjp", "transpose")


class Layout:
    """Where a role's operands stand: inputs x, keyword operands k, the linear ones."""

    def __init__(self, role: str, call: Call, n_operands: int):
        n, m = call.n_in, len(call.kw_avals)
        self.xs = range(0) if role == "transpose" else range(0, n)
        self.ks = range(self.xs.stop, self.xs.stop + m)
        stop = self.ks.stop
        self.rs = range(stop, stop + len(call.res_avals)) if role in ("jvp", "vjp") \
            else range(stop, stop)
        if role == "primal" and call.op.linear:
            self.lin, self.nonlin = self.xs, self.ks
        else:
            self.lin = range(self.rs.stop, n_operands)
            self.nonlin = range(0, self.rs.stop)


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
        return _impls.ROLE_NAMES["symmetric"]
    return _impls.ROLE_NAMES["bwd" if role == "vjp" and uses_residuals(call) else role]


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
        from ._spec import fmt_aval
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


def _jax_jvp_rule(fn: Callable) -> Callable:
    """JAX's own jvp of a traced function, as a jvp rule."""
    def jvp(primals, tangents, **kw):
        return jax.jvp(lambda *a: fn(*a, **kw), primals, tangents)[1]
    return jvp


def _self_transpose(fn: Callable) -> Callable:
    """A symmetric linear function as its own transpose rule."""
    return lambda ct, **kw: (fn(ct, **kw),)


def rule_of(role: str, call: Call, need=None) -> Rule | None:
    """The user's code that implements a role, or None when it is missing."""
    op = call.op
    if role == "transpose" and op.multilinear:
        return _multilinear_rule(call, need)
    if role == "primal":
        return Rule(op.fn, op.traced, out=op.inplace, device=op.device, host=op.host)
    if role == "fwd":
        return op.fwd_rule
    if role == "jvp":
        if op.jvp_rule is None and derives_jvp(call):  # f_jvp transposes the traced vjp
            return op.vjp_rule
        if op.jvp_rule is None and op.symmetric and op.traced:
            return Rule(_jax_jvp_rule(op.fn), True)
        return op.jvp_rule
    if role == "vjp":
        if op.symmetric:  # the jvp rule, run with ȳ as its tangent
            return rule_of("jvp", call)
        return op.bwd_rule if uses_residuals(call) else op.vjp_rule
    if op.transpose_rule is not None:
        return op.transpose_rule
    if op.linear and op.symmetric and not op.inplace:
        return Rule(_self_transpose(op.fn), op.traced, device=op.device,
                    host=op.host and _self_transpose(op.host))
    if op.linear and op.traced:  # JAX transposes the traced function itself
        return Rule(op.fn, True)
    return None


def make_run(role: str, call: Call, rule: Rule, lin, need, xp, lead) -> Callable[..., list]:
    if rule.traced and call.converted is not None:  # code closing over tracers, hoisted
        run = call.converted.run(role, call, lin, need)
        if run is not None:
            return run
    if role == "primal":
        return _impls.primal(call, rule.fn, xp, lead, inplace=rule.out)
    if rule.out:  # a host rule that writes into XLA's buffers: run(ins, outs) -> None
        return _inplace.make_run(role, call, rule, lin, need, lead)
    if role == "fwd":
        return _impls.fwd(call, rule.fn, xp, lead)
    if role == "jvp" and derives_jvp(call):
        return _transposed_vjp(call, lin)
    if role == "jvp":
        return _impls.jvp(call, rule.fn, lin, xp, lead, rule.symbolic_zeros)
    if role == "vjp" and call.op.symmetric:
        return _impls.symmetric_vjp(call, rule.fn, lin, need, xp, lead, rule.symbolic_zeros)
    if role == "vjp" and uses_residuals(call):
        return _impls.bwd(call, rule.fn, lin, need, xp, lead, rule.symbolic_zeros)
    if role == "vjp":
        return _impls.vjp(call, rule.fn, lin, need, xp, lead, rule.symbolic_zeros)
    if call.op.multilinear:
        from . import _multilinear
        return _multilinear.run_transpose(call, rule, need, xp, lead)
    if call.op.transpose_rule is None and call.op.symmetric:  # its own transpose
        return _impls.transpose(call, rule.fn, lin, need, xp, lead)
    if call.op.transpose_rule is None:  # derived from a traced linear function
        return _traced_linear_transpose(call, lin, need)
    return _impls.transpose(call, rule.fn, lin, need, xp, lead, rule.symbolic_zeros,
                            rule.input_shapes)


def _multilinear_rule(call: Call, need) -> Rule:
    """The transpose rule in the argument whose leaves ``need`` marks."""
    from . import _multilinear
    op, i = call.op, _multilinear.index_of("transpose", call, need)
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


def _traced_linear_transpose(call: Call, lin, need) -> Callable[..., list]:
    m = len(call.kw_avals)
    fwd = make_run("primal", call, Rule(call.op.fn, True), None, None, jnp, ())
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in call.in_avals]

    def run(*ops):
        ks, cts = ops[:m], ops[m:]
        full = _impls.fill(lin, cts, call.out_avals, call.float_out, jnp, (), False)
        t = jax.linear_transpose(lambda *xs: fwd(*xs, *ks), *sds)(full)
        return [c for c, k in zip(t, need) if k]
    return run


def _transposed_vjp(call: Call, lin) -> Callable[..., list]:
    """ẋ ↦ ∂f(x)·ẋ as the transpose of the traced vjp rule ȳ ↦ ∂f(x)ᵀ·ȳ.

    Built only when ``f_jvp`` itself is evaluated (forward mode); reverse mode
    transposes ``f_jvp`` into ``f_vjp``, which runs the rule as given, so a vjp
    rule that is not linear in ȳ (clipping, straight-through) serves reverse mode.
    """
    vr = call.op.vjp_rule
    n, m = call.n_in, len(call.kw_avals)
    run = traced_run("vjp", call, vr, call.float_out, lin)
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals("jvp", call, None, None)]

    def run_jvp(*ops):
        fixed, ts = ops[:n + m], ops[n + m:]
        vjp_jaxpr = jax.make_jaxpr(lambda *cts: run(*fixed, *cts))(*sds)  # the rule's errors
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


def checked(call: Call, role: str, run: Callable, avals, names) -> Callable[..., list]:
    def f(*ops):
        return _impls.check_traced_outputs(call, role, run(*ops), avals, names)
    return f


