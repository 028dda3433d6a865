"""One family of primitives per bound function, registered in one block.

For an op named ``f`` there are four primitives, each with the parameters
``call`` (a ``Call``), ``batch`` (a ``Batch`` or None) and, for the derived
ones, ``lin`` (which linear operands are present rather than symbolic zeros)
and ``need`` (which input cotangents to produce):

- ``f``:           (xs, ks)     ↦ f(x)
- ``f_jvp``:       (xs, ks, ẋ)  ↦ ∂f(x)·ẋ          linear in ẋ; transpose is f_vjp
- ``f_vjp``:       (xs, ks, ȳ)  ↦ ∂f(x)ᵀ·ȳ         linear in ȳ; transpose is f_jvp
- ``f_transpose``: (ks, ȳ)      ↦ Aᵀ·ȳ             for linear=True ops; transpose is f

A multilinear op's ``f_transpose`` is its transpose in one argument (see
``_multilinear``), and those two primitives get their rules from there.

An op with ``shard=`` lowers its host roles per shard on multi-device programs
and types its outputs (vma, Explicit shardings) by its rule: see ``_partition``.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.core import ShapedArray
from jax.interpreters import ad, batching, mlir

from jax._src import dispatch, effects
from jax._src.interpreters import ad as _ad

from . import (_batching, _closures, _compiled, _derivatives, _gpu, _hostcall, _impls,
               _lifetime, _multilinear, _partition)
from ._roles import (ROLES, MissingRuleError, make_run, missing_rule_message, traced_run,
                     out_avals, out_names, role_name, rule_of)
from ._spec import Batch, Call, Rule


class HostCallEffect(effects.Effect):
    """A host call that must run exactly once per execution (has_side_effect=True)."""
    def __str__(self) -> str:
        return "AnybindHostCall"


HOST_EFFECT = HostCallEffect()
effects.lowerable_effects.add_type(HostCallEffect)
effects.control_flow_allowed_effects.add_type(HostCallEffect)
effects.custom_derivatives_allowed_effects.add_type(HostCallEffect)
effects.remat_allowed_effects.add_type(HostCallEffect)


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
            prim = jcore.Primitive(name)
            prim.multiple_results = True
            prim.def_impl(functools.partial(_lifetime.eager_impl, prim))
            prim.def_effectful_abstract_eval(functools.partial(_abstract_eval, role))
            mlir.register_lowering(prim, functools.partial(_lower, role))
            rules = _multilinear if op.multilinear and role in ("primal", "transpose") \
                else _derivatives  # a multilinear op's f and f_transpose: see _multilinear
            ad.primitive_jvps[prim] = functools.partial(rules.jvp_rule, role)
            ad.primitive_transposes[prim] = functools.partial(rules.transpose_rule, role)
            if role == "primal" and rules is _derivatives:  # keeps a fwd rule's residuals
                _ad.primitive_linearizations[prim] = functools.partial(
                    _derivatives.linearize_rule, role)
            batching.primitive_batchers[prim] = functools.partial(_batching.batch_rule, prim)
            if op.shard is not None:  # lowered per shard: needs the devices (_partition)
                dispatch.prim_requires_devices_during_lowering.add(prim)
            self.prims[role] = prim
        weakref.finalize(op, _lifetime.unregister, tuple(self.prims.values()))

    def __getitem__(self, role: str):
        return self.prims[role]



def _abstract_eval(role, *avals, call: Call, batch: Batch | None, lin=None, need=None):
    lead = () if batch is None else (batch.size,)
    outs = [ShapedArray(lead + a.shape, a.dtype) for a in out_avals(role, call, lin, need)]
    outs = _partition.typed(role, avals, outs, call, batch, lin, need)
    effectful = role in ("primal", "fwd") and call.op.has_side_effect
    effs = {HOST_EFFECT} if effectful else effects.no_effects
    return outs, effs


def _lower(role, ctx, *args, call: Call, batch: Batch | None, lin=None, need=None):
    op = call.op
    # A vmap rule replaces the batched primal; rules batch by their own or the op's mode.
    by_vmap_rule = batch is not None and role == "primal" and op.vmap_rule is not None
    rule = op.vmap_rule if by_vmap_rule else rule_of(role, call, need)
    if rule is None:
        raise MissingRuleError(missing_rule_message(role, op))
    avals = out_avals(role, call, lin, need)
    names = out_names(role, call, need)
    name = "vmap rule" if by_vmap_rule else role_name(role, call)
    if rule.device:  # GPU code: itself in a GPU program, its host fallback elsewhere
        rule = _gpu.for_platform(ctx, call, rule, name)
    # The route: compiled code through XLA's FFI, host code through a callback, or
    # traced code inline; on many devices, host and compiled code run per shard.
    effect = role in ("primal", "fwd") and op.has_side_effect
    per_shard = op.shard is not None and not rule.traced and _partition.partitioned(ctx)
    if _compiled.is_compiled(rule.fn):
        if per_shard:  # the same primitive on each shard's Call, by the compiled route
            return _partition.lower(ctx, *args, role=role, call=call, batch=batch, lin=lin,
                                    need=need, role_name=name, runner_for=None,
                                    has_side_effect=effect)
        return _compiled.lower(
            ctx, *args, role=role, kind=_compiled.kind_of_role(role, call, by_vmap_rule),
            call=call, rule=rule, batch=batch, lin=lin, need=need,
            mode="vectorized" if by_vmap_rule else op.vmap,
            has_side_effect=role in ("primal", "fwd") and op.has_side_effect)
    if not rule.traced:
        xp = _gpu.array_module(call) if rule.device else np
        if by_vmap_rule:
            mode = rule
        elif batch is not None:
            rule, mode = _batching.host_mode(role, rule, op)
        else:
            mode = None

        def runner_for(call: Call, batch: Batch | None) -> Callable:
            return _hostcall.make_host_runner(
                call, name,
                lambda lead: make_run(role, call, rule, lin, need, xp, lead),
                out_avals(role, call, lin, need), names, batch, mode,
                inplace=rule.out, xp=xp)
        if per_shard:
            return _partition.lower(ctx, *args, role=role, call=call, batch=batch, lin=lin,
                                    need=need, role_name=name, runner_for=runner_for,
                                    has_side_effect=effect)
        return _hostcall.lower_host(ctx, *args, runner=runner_for(call, batch), call=call,
                                    role_name=name, has_side_effect=effect,
                                    device=rule.device, xp=xp)
    if by_vmap_rule:
        if call.n_closure:
            raise _closures.vmap_rule_error(call)
        fn = _traced_vmap_rule(call, rule, batch)
    else:
        fn = traced_run(role, call, rule, lin, need)
        if batch is not None:
            fn = _batching.vmapped(fn, batch.mask, batch.size)
    return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


def _traced_vmap_rule(call: Call, rule: Rule, batch: Batch) -> Callable[..., list]:
    avals = [ShapedArray((batch.size,) + a.shape, a.dtype) for a in call.out_avals]
    names = [call.out_name(j) for j in range(len(avals))]

    def run(*ops):
        leaves, flags = _impls.call_vmap_rule(call, rule.fn, batch, ops)
        outs = [l if f else jnp.broadcast_to(l, (batch.size,) + jnp.shape(l))
                for l, f in zip(leaves, flags)]
        return _impls.check_traced_outputs(call, "vmap", outs, avals, names)
    return run
