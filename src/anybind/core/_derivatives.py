"""JVP and transpose rules of every primitive in an op's family.

The JVP of ``f`` emits ``f_jvp`` (or inlines a traced rule); ``f_jvp`` and
``f_vjp`` are linear in their last operands and transpose into each other;
``f`` of a linear op and ``f_transpose`` transpose into each other. A derived
primitive's JVP in its non-linear operands is JAX's own derivative of a traced
rule; a host rule cannot be differentiated and says so.

Zeros: a symbolic-zero tangent or cotangent is never materialised here; it
is left out of the operands and recorded in ``lin``. An output whose tangent
is known to be zero leaves as ``ad.Zero``.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from . import _jax
from ._batching import sum_unbatched, vmapped
from ._code import higher_order_way
from ._errors import MissingRuleError
from ._sharding import vary_like
from ._spec import Call, Rule, is_float
from .roles import Layout, make_run, role_name, rule_of, traced_run, traced_tangents, uses_residuals


def _nonzero(t) -> bool:
    return type(t) is not _jax.Zero and _jax.dtype_of(t) != _jax.float0


def _keyword_error(call: Call, i: int, role: str, action: str) -> TypeError:
    if call.is_closure(i):
        return TypeError(
            f"anybind op '{call.op.name}': its traced code closes over a value of an enclosing "
            f"transformation ({call.kw_name(i)}), but {action} through the "
            f"{role_name(role, call)}, whose custom rules give no derivative with respect to "
            f"it. Pass it to the op as a positional argument to differentiate with respect "
            f"to it, or wrap it in jax.lax.stop_gradient")
    return TypeError(
        f"anybind op '{call.op.name}': {call.kw_name(i)} is a non-differentiable operand, but "
        f"{action} through the {role_name(role, call)}. Pass it as a positional argument "
        f"to differentiate with respect to it, or wrap it in jax.lax.stop_gradient")


def _params(role, call, batch, lin, need) -> dict:
    p = dict(call=call, batch=batch)
    if role != "primal":
        p.update(lin=lin, need=need)
    return p


# --------------------------------------------------------------------------- JVP

def jvp_rule(role, primals, tangents, *, call: Call, batch, lin=None, need=None,
             linearizing: bool = False):
    """(x, ẋ) ↦ (f(x), ∂f(x)·ẋ) for any primitive of the family.

    Zero tangents arrive as ``ad.Zero``; if all are zero the output tangents
    leave as ``ad.Zero`` and no rule runs. Forward mode (``jax.jvp``,
    ``jacfwd``) never runs a fwd rule; ``linearizing`` (reverse mode and
    ``linearize``, see ``linearize_rule``) runs it to keep its residuals.
    """
    fam = call.op._family
    params = _params(role, call, batch, lin, need)
    saved, kept = [], False  # kept: the fwd rule ran, its residuals (maybe none) saved
    if role == "primal" and uses_residuals(call) and (
            linearizing or not _jax.direct_linearize()):  # f and residuals at once
        outs = fam["fwd"].bind(*primals, call=call, batch=batch)
        outs, saved, kept = outs[:len(call.out_avals)], outs[len(call.out_avals):], True
    else:
        outs = fam[role].bind(*primals, **params)
    lay = Layout(role, call, len(primals))
    dropped = _closure_tangents(role, call, lay, tangents)
    sel = [i for i in range(len(primals)) if _nonzero(tangents[i]) and i not in dropped]
    out_float = [is_float(o.aval) for o in outs]
    if not sel or not any(out_float):  # nothing to differentiate: no rule is needed
        return outs, [_jax.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    traced = True  # core runs traced JAX code (not one primitive of the family)
    if any(i in lay.ks for i in sel):  # a closed-over value: JAX differentiates the code
        core = _traced_rule_tangent(role, call, lin, need, sel)
    elif role == "primal" and not call.op.linear:
        tcall = call if kept or not uses_residuals(call) else call.without_residuals
        core, traced = _primal_tangent(fam, tcall, tuple(i in sel for i in range(call.n_in)))
    elif any(i in lay.nonlin for i in sel):
        core = _traced_rule_tangent(role, call, lin, need, sel)
    else:
        core, traced = _linear_tangent(fam, role, call, lin, need, lay, sel), False
    ts = [tangents[i] for i in sel]
    if batch is not None:
        core = vmapped(core, batch.mask + (True,) * len(saved) + tuple(batch.mask[i] for i in sel),
                       batch.size, batch.axes)
    if traced and not any(isinstance(p, _jax.Tracer) for p in (*primals, *saved)):
        core = fam.eager.compiled(("tangent", role, call, batch, lin, need, tuple(sel), kept),
                                  core)
    t_out = iter(core(*primals, *saved, *ts))
    tangents = [next(t_out) if f else None for f in out_float]
    return outs, [_jax.Zero(jax.typeof(o).to_tangent_aval()) if t is None
                  else vary_like(t, jax.typeof(o)) for o, t in zip(outs, tangents)]


def _closure_tangents(role, call: Call, lay: Layout, tangents) -> set:
    """Check the tangents of keyword operands; return those to drop as zero.

    Keyword operands are not differentiable. A closed-over value is, where
    JAX differentiates the code that uses it (a traced rule of a derived
    primitive, a traced function without derivative rules); code that does not
    use it does not depend on it; for f with custom rules it is an error.
    """
    dropped = set()
    for k, i in enumerate(lay.ks):
        if not _nonzero(tangents[i]):
            continue
        if not call.is_closure(k):
            raise _keyword_error(call, k, role, "a tangent flows into it")
        if k - call.n_kw not in call.converted.uses(role):
            dropped.add(i)
        elif role == "primal" and not _jax_differentiates(role, call):
            raise _keyword_error(call, k, role, "a tangent flows into it")
    return dropped


def _jax_differentiates(role, call: Call) -> bool:
    """Whether f's derivative is JAX's own: a traced function without derivative rules."""
    op = call.op
    return (role == "primal" and op.traced and op.jvp_rule is None and op.vjp_rule is None
            and op.transpose_rule is None and op.fwd_rule is None)


def linearize_rule(role, is_vjp, nonzeros, *primals, **params):
    """Linearization (vjp, grad, linearize): the JVP, with the fwd rule's residuals.

    JAX's own fallback is ``linearize_from_jvp`` of the primitive's JVP rule;
    this one differs only in that an op with ``def_fwd``/``def_bwd`` computes
    f and its residuals in one fwd call, for its tangent's transpose (the bwd
    rule) to use.
    """
    del is_vjp
    jvp = functools.partial(jvp_rule, role, linearizing=True)
    dbg = _jax.debug_info("linearize_prim_jvp", jvp, primals, params)
    return _jax.linearize_from_jvp(_jax.wrap_init(jvp, debug_info=dbg), True, nonzeros, False,
                                 False, primals, params)


def _primal_tangent(fam, call: Call, present) -> tuple[Callable[..., list], bool]:
    """∂f(x)·ẋ for the float outputs, from whichever rules the op has; and whether it
    runs traced code (JAX's derivative of the function, a traced jvp rule)."""
    op = call.op
    jr, vr = op.jvp_rule, op.vjp_rule
    # Reverse mode runs the bwd rule on the fwd rule's residuals; forward mode's f_jvp (no
    # residuals kept: under checkpoint, say) transposes into the fwd rule run again, then bwd.
    if uses_residuals(call) or (call.with_residuals is not None and vr is None):
        return _bound(fam, call, present), False
    if jr is None and vr is None and not op.traced:
        raise MissingRuleError(
            f"anybind op '{op.name}' has no derivative rules; add op.def_jvp(rule) for forward "
            f"mode and op.def_vjp(rule) for reverse mode, a traced rule from which the other "
            f"follows, or declare linear=True with a transpose rule")

    if op.symmetric:  # a primitive, so that reverse mode transposes it into the jvp rule
        return _bound(fam, call, present), False
    if jr is not None and jr.traced and vr is None:  # None: a zero kept symbolic
        return traced_tangents(call, jr, present), True
    if jr is not None or vr is not None:
        # f_jvp; with a traced vjp rule and no jvp rule, lowering f_jvp transposes the vjp
        # rule, while reverse mode transposes f_jvp into f_vjp and runs the rule as given
        return _bound(fam, call, present), False
    lay = Layout("jvp", call)

    def core(*ops):  # JAX's own derivative of a traced function
        xs, ks, _, ts = lay.split(ops)
        return _jax_jvp(call, present, xs, ks, ts)
    return core, True


def _bound(fam, call: Call, present) -> Callable[..., list]:
    """f_jvp, one primitive of the family."""
    return lambda *ops: fam["jvp"].bind(*ops, call=call, batch=None, lin=present, need=None)


def _jax_jvp(call: Call, present, xs, ks, ts) -> list:
    fwd = make_run("primal", call, Rule(call.op.fn, True), None, None, jnp, ())
    fidx = [i for i, f in enumerate(call.float_in) if f]
    f = _in_operands(lambda *x: fwd(*x, *ks), xs, fidx, call.float_out)
    it = iter(ts)
    tangents = [next(it) if present[i] else jnp.zeros_like(xs[i]) for i in fidx]
    return jax.jvp(f, [xs[i] for i in fidx], tangents)[1]


def _traced_rule_tangent(role, call: Call, lin, need, sel) -> Callable[..., list]:
    """JVP of a primitive in its non-linear operands: JAX differentiates the traced rule
    (or, for f itself, the traced function, closed-over values included)."""
    op = call.op
    rule = rule_of(role, call)
    if rule is None or not rule.traced:
        kind = "jvp" if op.symmetric else role
        if rule is not None:
            raise MissingRuleError(higher_order_way(rule.fn, op.name, kind,
                                                    role_name(role, call)))
        raise MissingRuleError(
            f"anybind op '{op.name}': a higher-order derivative differentiates its "
            f"{role_name(role, call)}, which is missing; for higher orders register the "
            f"rule as traced JAX code (op.def_{kind}(rule, traced=True)), calling other "
            f"bound ops where needed")
    run = traced_run(role, call, rule, lin, need)
    if role == "primal":  # tangents of the float outputs only
        run_all = run
        run = lambda *ops: [o for o, f in zip(run_all(*ops), call.float_out) if f]

    def core(*ops):
        n_ops = len(ops) - len(sel)
        base = list(ops[:n_ops])

        def g(*dv):
            full = list(base)
            for i, v in zip(sel, dv):
                full[i] = v
            return run(*full)
        return jax.jvp(g, [base[i] for i in sel], list(ops[n_ops:]))[1]
    return core


def _linear_tangent(fam, role, call: Call, lin, need, lay: Layout, sel) -> Callable[..., list]:
    """A primitive linear in its last operands is its own JVP in them."""
    prim = fam[role]
    n_nonlin = len(lay.nonlin)
    if role == "primal":  # a linear op: f(ẋ), with zeros where ẋ is symbolic
        def linear_core(*ops):
            ts = dict(zip(sel, ops[len(ops) - len(sel):]))
            xs = [ts[i] if i in ts else jnp.zeros(a.shape, a.dtype)
                  for i, a in enumerate(call.in_avals)]
            return prim.bind(*xs, *ops[call.n_in:len(ops) - len(sel)], call=call, batch=None)
        return linear_core
    positions = [p for p, b in enumerate(lin) if b]
    chosen = {positions[i - n_nonlin] for i in sel}
    new_lin = tuple(p in chosen for p in range(len(lin)))

    def core(*ops):
        n_ops = len(ops) - len(sel)
        return prim.bind(*ops[:n_nonlin], *ops[n_ops:], call=call, batch=None,
                         lin=new_lin, need=need)
    return core


# --------------------------------------------------------------------- transpose

def transpose_rule(role, cts, *operands, call: Call, batch, lin=None, need=None):
    """ȳ ↦ Aᵀ·ȳ for the linear operands (``ad.UndefinedPrimal``) of a primitive.

    Zero cotangents arrive as ``ad.Zero`` and are left out; operands that are
    not linear inputs get ``None``.
    """
    op, fam = call.op, call.op._family
    lay = Layout(role, call, len(operands))
    undefined = [isinstance(o, _jax.UndefinedPrimal) for o in operands]
    linear_leaves = set()
    if role == "primal" and not op.linear and any(undefined):
        linear_leaves = call.leaves_of(op.linear_argnums) if op.linear_argnums else set()
        if linear_leaves and all(i in linear_leaves for i, u in enumerate(undefined) if u):
            return _transpose_partially_linear(fam, call, batch, cts, operands, undefined)
        if op.traced and not any(undefined[i] for i in lay.ks):
            # JAX code, custom rules or not: its transpose is JAX's, as for custom_jvp
            return _transpose_traced(call, batch, cts, operands, undefined)
    for i in lay.nonlin:
        if undefined[i] and i not in linear_leaves:
            if i in lay.ks:
                raise _keyword_error(call, i - lay.ks.start, role, "a transpose was asked")
            declared = (f"it is declared linear in positional argument(s) {op.linear_argnums} "
                        f"only" if op.linear_argnums else
                        "declare linear=True for an op linear in all positional arguments, or "
                        "linear=(i, ...) for one linear in some of them (given the others)")
            raise TypeError(
                f"anybind op '{op.name}': its {role_name(role, call)} is not declared linear "
                f"in positional input leaf {i - lay.xs.start}, but linear_transpose (or a "
                f"transpose in reverse mode) treated it as linear; {declared}")
    und = [undefined[i] for i in lay.lin]
    present = tuple(type(c) is not _jax.Zero for c in cts)
    res = [None] * len(operands)
    if not any(und) or not any(present):
        return res
    core = _TRANSPOSES[role](fam, call, lin, need, und, present)
    nonlin = [operands[i] for i in lay.nonlin]
    pcts = [c for c, p in zip(cts, present) if p]
    lin_idx = [i for i, u in zip(lay.lin, und) if u]
    if batch is None:
        out = core(*nonlin, *pcts)
    else:
        out = vmapped(core, tuple(batch.mask[i] for i in lay.nonlin) + (True,) * len(pcts),
                      batch.size, batch.axes)(*nonlin, *pcts)
        out = [sum_unbatched(c, batch.mask[i]) for c, i in zip(out, lin_idx)]
    for i, c in zip(lin_idx, out):
        res[i] = c
    return res


def _in_operands(run, operands, und, float_out):
    """``run`` as a function of the operands at ``und`` alone (the others fixed), with
    its floating outputs."""
    def f(*u):
        full = list(operands)
        for i, v in zip(und, u):
            full[i] = v
        return [o for o, fl in zip(run(*full), float_out) if fl]
    return f


def _transpose_traced(call: Call, batch, cts, operands, undefined):
    """A traced function transposes as the JAX code it is, in the operands being
    transposed, the others fixed (JAX raises if it is not linear in them); its custom
    rules define derivatives, not transposes, as for ``jax.custom_jvp``."""
    run = traced_run("primal", call, Rule(call.op.fn, True), None, None)
    if batch is not None:
        run = vmapped(run, batch.mask, batch.size, batch.axes)
    und = [i for i, u in enumerate(undefined) if u]
    fo = call.float_out
    f = _in_operands(run, operands, und, fo)
    sds = [jax.ShapeDtypeStruct(operands[i].aval.shape, operands[i].aval.dtype) for i in und]
    try:
        out = jax.linear_transpose(f, *sds)([_jax.instantiate_zeros(c)
                                             for c, fl in zip(cts, fo) if fl])
    except (AssertionError, NotImplementedError, ValueError) as e:  # JAX's, naming nothing
        raise TypeError(
            f"anybind op '{call.op.name}': linear_transpose (or a transpose in reverse mode) "
            f"treated its traced function as linear in positional input leaves {und}, but "
            f"JAX cannot transpose it in them ({type(e).__name__}: {e}); transpose only in "
            f"arguments the function is linear in") from e
    res = [None] * len(operands)
    for i, c in zip(und, out):
        res[i] = c
    return res


def _transpose_partially_linear(fam, call: Call, batch, cts, operands, undefined):
    """An op linear in some arguments: its transpose there is its VJP (at zero, say)."""
    und = [i for i, u in enumerate(undefined) if u]
    fo = call.float_out
    f = _in_operands(lambda *ops: fam["primal"].bind(*ops, call=call, batch=batch),
                     operands, und, fo)
    zeros = [jnp.zeros(operands[i].aval.shape, operands[i].aval.dtype) for i in und]
    _, pullback = jax.vjp(f, *zeros)
    out = pullback([_jax.instantiate_zeros(c) for c, fl in zip(cts, fo) if fl])
    res = [None] * len(operands)
    for i, c in zip(und, out):
        res[i] = c
    return res


def _t_primal(fam, call: Call, lin, need, und, present):
    """f linear: ȳ ↦ f_transpose(ȳ)."""
    def core(*ops):
        return fam["transpose"].bind(*ops, call=call, batch=None, lin=present,
                                     need=tuple(und))
    return core


def _t_transpose(fam, call: Call, lin, need, und, present):
    """f_transpose: x̄ ↦ f(x̄) at the present ȳ positions."""
    positions = [p for p, b in enumerate(lin) if b]
    wanted = [p for p, u in zip(positions, und) if u]
    got = [i for i, k in enumerate(need) if k]
    given = {i for i, p in zip(got, present) if p}

    def core(*ops):
        m = len(call.kw_avals)
        ks, cts = ops[:m], iter(ops[m:])
        xs = [next(cts) if i in given else jnp.zeros(a.shape, a.dtype)
              for i, a in enumerate(call.in_avals)]
        outs = fam["primal"].bind(*xs, *ks, call=call, batch=None)
        return [outs[p] for p in wanted]
    return core


def _t_jvp(fam, call: Call, lin, need, und, present):
    """f_jvp: ȳ ↦ f_vjp(x, ȳ) for the undefined ẋ."""
    positions = [p for p, b in enumerate(lin) if b]
    wanted = {p for p, u in zip(positions, und) if u}
    need_x = tuple(p in wanted for p in range(len(lin)))
    it = iter(present)
    ct_lin = tuple(next(it) if f else False for f in call.float_out)

    full = call.with_residuals
    if full is not None and call.op.vjp_rule is None:
        # forward mode's tangent (no residuals kept) transposed, as under checkpoint: the
        # fwd rule runs again for the bwd rule's residuals
        n = call.n_in + len(call.kw_avals)

        def refwd_core(*ops):
            saved = fam["fwd"].bind(*ops[:n], call=full, batch=None)[len(full.out_avals):]
            return fam["vjp"].bind(*ops[:n], *saved, *ops[n:], call=full, batch=None,
                                   lin=ct_lin, need=need_x)
        return refwd_core

    def core(*ops):
        return fam["vjp"].bind(*ops, call=call, batch=None, lin=ct_lin, need=need_x)
    return core


def _t_vjp(fam, call: Call, lin, need, und, present):
    """f_vjp: x̄ ↦ f_jvp(x, x̄) for the undefined ȳ."""
    positions = [p for p, b in enumerate(lin) if b]
    got = [i for i, k in enumerate(need) if k]
    given = {i for i, p in zip(got, present) if p}
    ct_lin = tuple(i in given for i in range(call.n_in))
    float_pos = [j for j, f in enumerate(call.float_out) if f]
    wanted = [float_pos.index(p) for p, u in zip(positions, und) if u]

    def core(*ops):
        outs = fam["jvp"].bind(*ops, call=call, batch=None, lin=ct_lin, need=None)
        return [outs[k] for k in wanted]
    return core


_TRANSPOSES = {"primal": _t_primal, "transpose": _t_transpose, "jvp": _t_jvp, "vjp": _t_vjp}
