"""One family of primitives per bound function, registered in one block.

For an op named ``f`` there are five primitives, each with the parameters
``call`` (a ``Call``), ``batch`` (a ``Batch`` or None) and, for the derived
ones, ``lin`` (which linear operands are present rather than symbolic zeros)
and ``need`` (which input cotangents to produce):

- ``f``:           (xs, ks)     ↦ f(x)
- ``f_fwd``:       (xs, ks)     ↦ f(x) and residuals r   by a fwd rule (``def_fwd``)
- ``f_jvp``:       (xs, ks, ẋ)  ↦ ∂f(x)·ẋ          linear in ẋ; transpose is f_vjp
- ``f_vjp``:       (xs, ks, ȳ)  ↦ ∂f(x)ᵀ·ȳ         linear in ȳ; transpose is f_jvp
- ``f_transpose``: (ks, ȳ)      ↦ Aᵀ·ȳ             for linear=True ops; transpose is f

A multilinear op's ``f_transpose`` is its transpose in one argument (see
``_multilinear``), and those two primitives get their rules from there.

Lowering: traced code is inlined here; host, compiled and device code are
lowered by the first route that claims the role (``_lowering``; the routes
are in ``anybind.routes``). An op with ``shard=`` types its outputs (vma,
Explicit shardings) by its rule: see ``_sharding``.
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp

from . import (
    _batching,
    _closures,
    _derivatives,
    _jax,
    _lifetime,
    _lowering,
    _multilinear,
    _sharding,
)
from ._errors import MissingRuleError
from ._jax import ShapedArray
from ._spec import Batch, Call, Rule
from .roles import ROLES, missing_rule_message, out_avals, role_name, rule_of, traced_run
from .roles._common import check_traced_outputs
from .roles._primal import call_vmap_rule


class HostCallEffect(_jax.Effect):
    """A host call that must run exactly once per execution (has_side_effect=True)."""
    def __str__(self) -> str:
        return "AnybindHostCall"


HOST_EFFECT = HostCallEffect()
_jax.lowerable_effects.add_type(HostCallEffect)
_jax.control_flow_allowed_effects.add_type(HostCallEffect)
_jax.custom_derivatives_allowed_effects.add_type(HostCallEffect)
_jax.remat_allowed_effects.add_type(HostCallEffect)


class Family:
    """The primitives of one op, with every rule registered right here.

    The registered rules find the op through their ``call`` parameter, never
    through a reference of their own, and eager calls compile into the op's
    own cache, so an op that nothing uses any more (no Python reference, no
    live program) is collected with what it closes over (see ``_lifetime``).
    """

    def __init__(self, op):
        base = op.name
        self.prims = {}
        self.eager = _lifetime.EagerCache()
        self.out_batched = {}  # (call, batch) -> a traced vmap rule's out_batched
        for role in ROLES:
            name = base if role == "primal" else f"{base}_{role}"
            prim = _jax.Primitive(name)
            prim.multiple_results = True
            prim.def_impl(functools.partial(_lifetime.eager_impl, prim))
            prim.def_effectful_abstract_eval(functools.partial(_abstract_eval, role))
            _jax.register_lowering(prim, functools.partial(_lower, role))
            rules = _multilinear if op.multilinear and role in ("primal", "transpose") \
                else _derivatives  # a multilinear op's f and f_transpose: see _multilinear
            _jax.primitive_jvps[prim] = functools.partial(rules.jvp_rule, role)
            _jax.primitive_transposes[prim] = functools.partial(rules.transpose_rule, role)
            if role == "primal" and rules is _derivatives:  # keeps a fwd rule's residuals
                _jax.primitive_linearizations[prim] = _jax.linearize_rule(
                    functools.partial(_derivatives.linearize_rule, role))
            _jax.fancy_primitive_batchers[prim] = functools.partial(
                _batching.batch_rule, prim, role, _traced_code)
            if op.shard is not None:  # lowered per shard: needs the devices
                _jax.requires_devices_during_lowering.add(prim)
            self.prims[role] = prim
        weakref.finalize(op, _lifetime.unregister, tuple(self.prims.values()))
        op.on_change(self.rules_changed)

    def rules_changed(self) -> None:
        """A rule of the op changed: every program traced with the old one goes."""
        self.eager.clear()
        self.out_batched.clear()
        jax.clear_caches()

    def __getitem__(self, role: str):
        return self.prims[role]


def _abstract_eval(role, *avals, call: Call, batch: Batch | None, lin=None, need=None):
    lead = () if batch is None else (batch.size,)
    outs = [ShapedArray(lead + a.shape, a.dtype) for a in out_avals(role, call, lin, need)]
    outs = _sharding.typed(role, avals, outs, call, batch, lin, need)
    effectful = role in ("primal", "fwd") and call.op.has_side_effect
    effs = {HOST_EFFECT} if effectful else _jax.no_effects
    return outs, effs


def _lower(role, ctx, *args, call: Call, batch: Batch | None, lin=None, need=None):
    op = call.op
    # A vmap rule replaces the batched primal; rules batch by their own or the op's mode.
    by_vmap_rule = batch is not None and role == "primal" and op.vmap_rule is not None
    rule = op.vmap_rule if by_vmap_rule else rule_of(role, call, need)
    if rule is None:
        raise MissingRuleError(missing_rule_message(role, op))
    if not rule.traced:  # host, compiled or device code: the first route that claims it
        site = _lowering.Site(
            ctx, role, call, batch, lin, need, rule,
            name="vmap rule" if by_vmap_rule else role_name(role, call),
            by_vmap_rule=by_vmap_rule,
            effect=role in ("primal", "fwd") and op.has_side_effect)
        return _lowering.lower(site, *args)
    if by_vmap_rule and call.n_closure:
        raise _closures.vmap_rule_error(call)
    fn = _traced(role, call, rule, batch, lin, need, by_vmap_rule)
    return _jax.lower_fun(fn, multiple_results=True)(ctx, *args)


def _traced(role, call, rule, batch, lin, need, by_vmap_rule) -> Callable[..., list]:
    """The traced code a primitive inlines: a traced rule, vmapped over ``batch``."""
    if by_vmap_rule:
        return _traced_vmap_rule(call, rule, batch)
    fn = traced_run(role, call, rule, lin, need)
    if batch is not None:
        fn = _batching.vmapped(fn, batch.mask, batch.size, batch.axes)
    return fn


def _traced_code(role, batch: Batch | None, params: dict) -> Callable[..., list] | None:
    """What ``_lower`` would inline for these parameters, or None for host code (the
    batching rule looks in it for the names of vmap axes)."""
    call, need = params["call"], params.get("need")
    by_vmap_rule = batch is not None and role == "primal" and call.op.vmap_rule is not None
    rule = call.op.vmap_rule if by_vmap_rule else rule_of(role, call, need)
    if rule is None or not rule.traced or (by_vmap_rule and call.n_closure):
        return None
    return _traced(role, call, rule, batch, params.get("lin"), need, by_vmap_rule)


def _traced_vmap_rule(call: Call, rule: Rule, batch: Batch) -> Callable[..., list]:
    avals = [ShapedArray((batch.size,) + a.shape, a.dtype) for a in call.out_avals]
    names = [call.out_name(j) for j in range(len(avals))]

    def run(*ops):
        leaves, flags = call_vmap_rule(call, rule.fn, batch, ops)
        outs = [l if f else jnp.broadcast_to(l, (batch.size,) + jnp.shape(l))
                for l, f in zip(leaves, flags)]
        return check_traced_outputs(call, "vmap", outs, avals, names)
    return run
