"""jax-finufft's batching convention: leading axes of points and values.

Every point array has shape (*batch, M); the values have (*batch', M) (types
1 and 3) or (*batch', *modes) (type 2). Leading axes are matched from the
left; where the points have size 1 and the values more, those values share the
points (a "stacked" transform, ducc0's ``ntrans``); where they match, each
index is its own transform with its own points. The points may also omit the
values' last leading axes (implicit size-1 axes before M): jax-finufft allows
one, here any number, so points (M,) serve values (..., M) of any shape.

``broadcast_and_flatten_inputs`` brings every case to one layout: values
(B, S, …) and points (B, M), B the independent transforms and S those that
share points; ``BroadcastIndex.unflatten`` puts the result's axes back.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

__all__ = ["BroadcastIndex", "broadcast_and_flatten_inputs"]


@dataclass
class BroadcastIndex:
    """Where the shared (broadcast) axes went, and the result's expected shape."""
    broadcast_from: Sequence[int]
    broadcast_to: Sequence[int]
    expected_output_shape: Sequence[int]

    def unflatten(self, result):
        result = jnp.reshape(result, self.expected_output_shape)
        if len(self.broadcast_to):
            return jnp.moveaxis(result, self.broadcast_to, self.broadcast_from)
        return result


def broadcast_and_flatten_inputs(nufft_type: int, output_shape, source, *points):
    """(index, source (B, S, …), *points (B, M)) for a transform of ``nufft_type``.

    Type 3's points are the D source point arrays and then the D targets; the
    targets' leading axes broadcast with the sources' (their M may differ).
    """
    nd = len(points) // 2 if nufft_type == 3 else len(points)
    targets = points[nd:] if nufft_type == 3 else ()
    points = jnp.broadcast_arrays(*points[:nd])
    *lead, m = points[0].shape
    lead = tuple(lead)
    if targets:
        targets = jnp.broadcast_arrays(*targets)
        *lead_t, n_out = targets[0].shape
        lead = tuple(np.broadcast_shapes(lead, tuple(lead_t)))
        points = [jnp.broadcast_to(p, lead + (m,)) for p in points]
        targets = [jnp.broadcast_to(t, lead + (n_out,)) for t in targets]

    core = nd if nufft_type == 2 else 1  # the values' trailing axes: modes or points
    missing = source.ndim - core - len(lead)
    if missing > 0:  # points without the values' last leading axes: implicit, of size 1
        lead = lead + (1,) * missing
        points = [jnp.reshape(p, p.shape[:-1] + (1,) * missing + p.shape[-1:]) for p in points]
        targets = [jnp.reshape(t, t.shape[:-1] + (1,) * missing + t.shape[-1:])
                   for t in targets]

    target = tuple(np.broadcast_shapes(tuple(source.shape[:len(lead)]), lead))
    shared_from = tuple(i for i, (a, b) in enumerate(zip(lead, target)) if a != b)
    shared_to = tuple(len(target) - len(shared_from) + i for i in range(len(shared_from)))
    source = jnp.broadcast_to(source, target + tuple(source.shape[len(target):]))
    if shared_to:  # the axes whose values share points go just before the core axes
        source = jnp.moveaxis(source, shared_from, shared_to)
        points = [jnp.moveaxis(p, shared_from, shared_to) for p in points]
        targets = [jnp.moveaxis(t, shared_from, shared_to) for t in targets]

    n_lead = len(target)
    n_own = n_lead - len(shared_from)
    size_own = int(np.prod(source.shape[:n_own], dtype=int))
    size_shared = int(np.prod(source.shape[n_own:n_lead], dtype=int))
    if nufft_type == 2:
        core_shape = tuple(source.shape[n_lead:])
        out_core = (m,)
    else:
        if source.shape[-1] != m:
            raise ValueError(f"anybind.contrib.finufft.nufft{nufft_type}: the source has "
                             f"{source.shape[-1]} values per transform but the points "
                             f"number {m}")
        core_shape = (m,)
        out_core = tuple(output_shape) if nufft_type == 1 else (targets[0].shape[-1],)
    index = BroadcastIndex(shared_from, shared_to, tuple(source.shape[:n_lead]) + out_core)
    source = jnp.reshape(source, (size_own, size_shared) + core_shape)
    points = tuple(jnp.reshape(p, (size_own, m)) for p in points)
    targets = tuple(jnp.reshape(t, (size_own, t.shape[-1])) for t in targets)
    return (index, source, *points, *targets)
