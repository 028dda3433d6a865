"""Batching: every primitive of an op carries at most one batch axis.

``vmap`` of a primitive moves the mapped axis to the front and records it in
the ``batch`` parameter (see ``Batch``); a nested ``vmap`` merges its axis into
the existing one. What runs then depends on the op's mode: one host call that
loops over the batch (``"sequential"``), one host call on the batched arrays
(``"vectorized"``), the user's vmap rule, or ``jax.vmap`` of traced code.
Derivatives of a batched primitive are ``jax.vmap`` of the derivatives of the
unbatched one, so ``vmap`` never removes a custom rule.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from ._spec import Batch


def vmapped(fn: Callable[..., list], mask: Sequence[bool], size: int) -> Callable[..., list]:
    """``fn`` on unbatched operands, lifted to operands in ``Batch`` layout."""
    in_axes = [0 if m else None for m in mask]

    def run(*ops):
        squeezed = [o if m else lax.squeeze(o, (0,)) for o, m in zip(ops, mask)]
        return jax.vmap(lambda *a: list(fn(*a)), in_axes=in_axes, axis_size=size)(*squeezed)
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


def batch_rule(prim, args, dims, *, batch: Batch | None, **params):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    old = None if batch is None else batch.size
    before = (False,) * len(args) if batch is None else batch.mask
    merged = [_merge(a, d, b, size, old) for a, d, b in zip(args, dims, before)]
    new = Batch(size if old is None else size * old, tuple(m for _, m in merged))
    outs = prim.bind(*[a for a, _ in merged], batch=new, **params)
    if old is not None:
        outs = [lax.reshape(o, (size, old) + o.shape[1:]) for o in outs]
    return outs, [0] * len(outs)


def sum_unbatched(x, batched: bool):
    """Transpose of broadcasting an unbatched operand over the batch."""
    return x if batched else x.sum(axis=0, keepdims=True)


def host_mode(role: str, rule, op) -> tuple:
    """(the rule to run, its mode) for a host role under ``vmap``.

    The function batches by the op's mode; a rule by its own ``vmap`` if given
    (a string, or a batched variant run as a vectorized rule), else by the op's
    mode, which is ``"vectorized"`` once the function has a vmap rule.
    """
    if role == "primal" or rule.vmap is None:
        return rule, op.vmap
    if isinstance(rule.vmap, str):
        return rule, rule.vmap
    return dataclasses.replace(rule, fn=rule.vmap, vmap=None), "vectorized"
