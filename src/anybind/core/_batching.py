"""Batching: every primitive of an op carries at most one batch axis.

``vmap`` of a primitive moves the mapped axis to the front and records it in
the ``batch`` parameter (see ``Batch``); a nested ``vmap`` merges its axis into
the existing one. What runs then depends on the op's mode: one host call that
loops over the batch (``"sequential"``), one host call on the batched arrays
(``"expand_dims"``, or ``"broadcast_all"``), the user's vmap rule, or ``jax.vmap`` of traced code.
Derivatives of a batched primitive are ``jax.vmap`` of the derivatives of the
unbatched one, so ``vmap`` never removes a custom rule.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _jax
from ._spec import Batch, InBatched


def vmapped(fn: Callable[..., list], mask: Sequence[bool], size: int,
            axes: tuple = ()) -> Callable[..., list]:
    """``fn`` on unbatched operands, lifted to operands in ``Batch`` layout.

    With ``axes`` (``Batch.axes``), the merged axis is split into its factors
    and ``fn`` runs under one ``jax.vmap`` per factor, named as the user's vmap
    was, so that its collectives (``lax.psum``, ``lax.axis_index``) find them.
    """
    in_axes = [0 if m else None for m in mask]

    def run(*ops):
        squeezed = [o if m else lax.squeeze(o, (0,)) for o, m in zip(ops, mask)]
        f = lambda *a: list(fn(*a))  # noqa: E731
        if not axes:
            return jax.vmap(f, in_axes=in_axes, axis_size=size)(*squeezed)
        sizes = tuple(n for _, n in axes)
        split = [lax.reshape(o, sizes + o.shape[1:]) if m else o
                 for o, m in zip(squeezed, mask)]
        for name, n in reversed(axes):  # the innermost factor is the innermost vmap
            f = jax.vmap(f, in_axes=in_axes, axis_size=n, axis_name=name)
        return [lax.reshape(o, (size,) + o.shape[len(axes):]) for o in f(*split)]
    return run


def _merge(x, dim, batched_before: bool, size: int, old: int | None):
    """Bring ``x`` into the merged layout: one leading axis of size*old, or 1."""
    if old is None:  # first vmap: batched operands lead with the axis, others with 1
        return (jnp.moveaxis(x, dim, 0), True) if dim is not None \
            else (lax.expand_dims(x, (0,)), False)
    if dim is None:
        if not batched_before:
            return x, False
        x = lax.broadcast(x, (size,))
    else:
        x = jnp.moveaxis(x, dim, 0)
        if not batched_before:
            x = lax.broadcast_in_dim(x, (size, old) + x.shape[2:],
                                     (0, 1) + tuple(range(2, x.ndim)))
    return lax.reshape(x, (size * old,) + x.shape[2:]), True


def batch_rule(prim, role, code, axis_data, args, dims, *, batch: Batch | None, **params):
    """The vmap rule of every primitive of an op (JAX's batcher, given the axis).

    ``code(role, batch, params)`` is the traced code a primitive of the role
    inlines, or None for host code. Operands none of which vary over this axis
    leave the primitive unbatched, unless its traced code uses the axis's name
    (a psum over it, its axis_index): then it is batched to run under the named
    vmap, and the outputs that do not vary over the axis come back unbatched.
    """
    name = _jax.axis_name(axis_data)
    size = axis_data.size
    varying = None  # which outputs vary over the axis, when none of the operands does
    if all(d is None for d in dims):
        if name is not None:
            varying = _varying(role, code, axis_data, name, args, batch, params)
        if varying is None:
            outs = prim.bind(*args, batch=batch, **params)
            return outs, [None] * len(outs)
    old = None if batch is None else batch.size
    before = (False,) * len(args) if batch is None else batch.mask
    merged = [_merge(a, d, b, size, old) for a, d, b in zip(args, dims, before)]
    axes = ((name, size),) + (() if batch is None else batch.axes or ((None, old),))
    new = Batch(size if old is None else size * old, tuple(m for _, m in merged),
                axes if any(n is not None for n, _ in axes) else ())
    outs = prim.bind(*[a for a, _ in merged], batch=new, **params)
    if old is not None:
        outs = [lax.reshape(o, (size, old) + o.shape[1:]) for o in outs]
    flags = out_batched(prim, params["call"], new, params.get("lin"))
    if varying is not None:
        flags = varying if flags is None else [f and v for f, v in zip(flags, varying)]
    if flags is None:
        return outs, [0] * len(outs)
    # Outputs a vmap rule leaves unbatched are broadcast over the batch; take one row.
    return ([o if f else o[0] for o, f in zip(outs, flags)],
            [0 if f else None for f in flags])


def _varying(role, code, axis_data, name, args, batch, params) -> list[bool] | None:
    """Which outputs vary over a named axis that no operand varies over, if the
    traced code uses its name; None if it does not.

    For the primal, the tangent's code (a traced jvp rule, or one derived from a
    traced vjp rule) is looked in too: differentiation above this vmap runs it on
    these same unbatched operands, outside the vmap, so the primal must be batched
    for it to find the axis; an output whose tangent varies then varies too.
    """
    avals = [jax.typeof(a) for a in args]
    found = _uses(code(role, batch, params), avals, axis_data, name)
    call = params["call"]
    if role == "primal" and any(call.float_in):
        call = call.without_residuals if call.res_avals or call.res_tree else call
        lin = tuple(call.float_in)
        jvp_params = dict(call=call, lin=lin, need=None)
        tangent_avals = [a for a, f in zip(avals[:call.n_in], lin) if f]
        jvp_batch = batch and dataclasses.replace(
            batch, mask=batch.mask + tuple(m for m, f in zip(batch.mask, lin) if f))
        try:  # a probe: if the rule cannot be traced here, it raises where it runs
            tangent = _uses(code("jvp", jvp_batch, jvp_params), avals + tangent_avals,
                            axis_data, name)
        except Exception:  # noqa: BLE001
            tangent = None
        if tangent is not None:
            ts = iter(tangent)
            tangent = [f and next(ts) for f in call.float_out]
            found = tangent if found is None else [a or b for a, b in zip(found, tangent)]
    return found


def _uses(fn, avals, axis_data, name) -> list[bool] | None:
    """Which outputs of ``fn`` vary over the axis when no input does, if ``fn`` uses the
    axis's name; None if it does not (or ``fn`` is None: host code)."""
    if fn is None:
        return None
    closed = jax.make_jaxpr(lambda *a: list(fn(*a)))(*avals)
    if not any(isinstance(e, _jax.NamedAxisEffect) and e.name == name
               for e in closed.effects):
        return None
    return list(_jax.batch_jaxpr(closed, axis_data, [False] * len(avals), False)[1])


def in_batched(call, mask) -> InBatched:
    """The ``in_batched`` a vmap rule (and an ``out_batched`` declaration) receives."""
    n = call.n_in
    flags = InBatched(call.args_tree.unflatten(mask[:n]))
    flags.kwargs = call.kw_tree.unflatten(mask[n:])
    return flags


def out_batched(prim, call, batch: Batch, lin=None) -> list[bool] | None:
    """Which outputs of the batched primitive vary over the batch, if known while tracing.

    Known for the primal under a vmap rule: a traced rule is traced abstractly
    to read its ``out_batched``; a host rule's is its ``out_batched=``
    declaration. Also for its tangent: if output j is unbatched when the
    inputs batched are those whose primal or tangent is, it depends only on
    inputs unbatched in both, so ∂f_j(x)·ẋ is unbatched too. None (all
    batched) otherwise.
    """
    op = call.op
    if op.vmap_rule is None:
        return None
    if prim is op._family["jvp"] and not call.res_avals and lin is not None:
        n = call.n_in + len(call.kw_avals)
        tangent = iter(batch.mask[n:])
        mask = list(batch.mask[:n])
        for i, present in enumerate(lin):
            mask[i] = mask[i] or (present and next(tangent))
        flags = out_batched(op._family["primal"], call, Batch(batch.size, tuple(mask)))
        return None if flags is None else [f for f, fl in zip(flags, call.float_out) if fl]
    if prim is not op._family["primal"]:
        return None
    if op.vmap_rule.traced:
        cache = op._family.out_batched
        key = (call, batch)
        if key not in cache:
            cache[key] = _traced_out_batched(call, op.vmap_rule.fn, batch)
        return cache[key]
    return declared_out_batched(call, batch)


def declared_out_batched(call, batch: Batch) -> list[bool] | None:
    """A host vmap rule's declared ``out_batched`` for this batch, one bool per output leaf."""
    decl = call.op.vmap_out_batched
    if decl is None:
        return None
    if callable(decl):
        decl = decl(in_batched(call, batch.mask))
    return _flags(call, decl, "out_batched declaration")


def _traced_out_batched(call, fn, batch: Batch) -> list[bool]:
    from .roles._primal import call_vmap_rule
    seen = []

    def run(*ops):
        leaves, flags = call_vmap_rule(call, fn, batch, ops)
        seen.append(flags)
        return leaves

    lead = [(batch.size,) if m else (1,) for m in batch.mask]
    jax.eval_shape(run, *[jax.ShapeDtypeStruct(l + a.shape, a.dtype) for l, a in
                          zip(lead, call.in_avals + call.kw_avals)])
    return _flags(call, seen[0], "vmap rule's out_batched")


def _flags(call, flags, what: str) -> list[bool]:
    if isinstance(flags, (bool, np.bool_)):
        return [bool(flags)] * len(call.out_avals)
    try:
        leaves = call.out_tree.flatten_up_to(flags) if not isinstance(flags, list) or \
            len(flags) != len(call.out_avals) else flags
    except (ValueError, TypeError) as e:
        raise TypeError(f"anybind op '{call.op.name}': the {what} {flags!r} does not match "
                        f"the output's structure {call.out_tree} ({e})") from None
    if not all(isinstance(f, (bool, np.bool_)) for f in leaves):
        raise TypeError(f"anybind op '{call.op.name}': the {what} must hold Python bools "
                        f"(known while tracing), got {leaves!r}")
    return [bool(f) for f in leaves]


def sum_unbatched(x, batched: bool):
    """Transpose of broadcasting an unbatched operand over the batch."""
    return x if batched else x.sum(axis=0, keepdims=True)


def host_mode(role: str, rule, op) -> tuple:
    """(the rule to run, its mode) for a host role under ``vmap``.

    The function batches by the op's mode; a rule by its own ``vmap`` if given
    (a string, or a batched variant run as a vectorized rule), else by the op's
    mode, which is ``"expand_dims"`` once the function has a vmap rule.
    """
    if role == "primal" or rule.vmap is None:
        return rule, op.vmap
    if isinstance(rule.vmap, str):
        return rule, rule.vmap
    return dataclasses.replace(rule, fn=rule.vmap, vmap=None), "expand_dims"
