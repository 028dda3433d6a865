"""ducc0's type 3 non-uniform FFT, differentiable in the values and both point sets.

With σ = −1 for ``forward`` (+1 otherwise), values c_j at source points x_j and
target points s_k (both (·, D), any real coordinates),

  type 3, ``nu2nu``:  y_k = Σ_j c_j exp(iσ s_k·x_j)      (points ↦ points)

It is linear in the values and nonlinear in both point sets; bound with
``linear=(0,)``. Its derivatives are type 3 transforms again:

  ∂nu2nu·(ċ, ẋ, ṡ) = nu2nu(ċ) + Σ_d iσ s_d ⊙ nu2nu(c ⊙ ẋ_d) + Σ_d iσ ṡ_d ⊙ nu2nu(x_d ⊙ c)

and, in JAX's convention (no conjugation), the transpose in the values runs
from the targets back to the sources with the same sign:

  vjp: c̄ = nu2nu_{s→x}(ȳ),  x̄_d = Re(iσ c ⊙ nu2nu_{s→x}(s_d ⊙ ȳ)),
       s̄_d = Re(iσ ȳ ⊙ nu2nu_{x→s}(x_d ⊙ c))

(x̄ and s̄ summed over the values' leading axes). The rules are JAX code
calling the op, so derivatives of every order follow; the transforms a rule
needs are stacked into one ducc0 call. Leading axes of the values share the
points (ducc0's ``ntrans``), and ducc0 writes into XLA's buffer (``out=True``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require, reshaped
from ._ducc0_nufft import _eps, reverse, run, source_points, target_points

ducc0 = require("ducc0", "anybind.contrib.ducc0")

__all__ = ["nu2nu"]


def _check(data, coord_in, coord_out) -> None:
    if not np.issubdtype(data.dtype, np.complexfloating):
        raise TypeError(f"anybind op 'nu2nu': the values must be complex, got {data.dtype}")
    real = np.finfo(data.dtype).dtype
    for name, c in (("coord_in", coord_in), ("coord_out", coord_out)):
        if len(c.shape) != 2 or c.dtype != real:
            raise TypeError(f"anybind op 'nu2nu': {name} must be a (npoints, ndim) array of "
                            f"{real.name} (the precision of the values), got "
                            f"{c.dtype}{list(c.shape)}")
    if coord_in.shape[1] != coord_out.shape[1] or not 1 <= coord_in.shape[1] <= 3:
        raise ValueError(f"anybind op 'nu2nu': coord_in and coord_out need the same number of "
                         f"dimensions, 1 to 3; got {coord_in.shape[1]} and {coord_out.shape[1]}")
    if data.shape[-1:] != coord_in.shape[:1]:
        raise ValueError(f"anybind op 'nu2nu': values {tuple(data.shape)} do not end in the "
                         f"number of source points {coord_in.shape[0]} of coord_in")


def _nu2nu_fn(values, coord_in, coord_out, *, out, **kw) -> None:
    """values (..., M) at coord_in (M, D) ↦ (..., N) at coord_out (N, D), into out."""
    if not source_points(out, coord_in):
        return
    coord_out, bad = target_points(out, coord_out)
    run(ducc0.nufft.experimental.nu2nu, values.dtype, coord_in.shape[1], kw,
        {"points_out": reshaped(out, (-1, coord_out.shape[0]))}, stages=2,
        points_in=values.reshape((-1, values.shape[-1])), coord_in=coord_in,
        coord_out=coord_out)
    out[..., bad] = complex(np.nan, np.nan)


def _nu2nu_spec(values, coord_in, coord_out, **_):
    if not hasattr(getattr(ducc0.nufft, "experimental", None), "nu2nu"):
        raise NotImplementedError(f"anybind op 'nu2nu' needs ducc0.nufft.experimental.nu2nu, "
                                  f"which ducc0 {ducc0.__version__} lacks; upgrade ducc0 "
                                  f"(0.42 has it)")
    _check(values, coord_in, coord_out)
    return jax.ShapeDtypeStruct(values.shape[:-1] + coord_out.shape[:1], values.dtype)


def _vmap(size, in_batched, values, coord_in, coord_out, *, out, **kw) -> None:
    """Shared points: one call, the batch a leading values axis; else a loop over rows."""
    if not (in_batched[1] or in_batched[2]):
        if not in_batched[0]:
            values = np.broadcast_to(values, (size,) + values.shape)
        _nu2nu_fn(values, coord_in, coord_out, out=out, **kw)
        return
    for b in range(size):
        _nu2nu_fn(values[b] if in_batched[0] else values,
                  coord_in[b] if in_batched[1] else coord_in,
                  coord_out[b] if in_batched[2] else coord_out, out=out[b], **kw)


def _example():
    r = np.random.default_rng(0)
    c = r.normal(size=(2, 6)) + 1j * r.normal(size=(2, 6))
    return (c, r.uniform(-2, 2, size=(6, 2)), r.uniform(-3, 3, size=(5, 2))), {"epsilon": 1e-13}


def _shard(values, coord_in, coord_out, **_):
    """Leading axes and targets split; sources summed over."""
    return "... p, p d, q d -> ... q"


nu2nu = ab.bind(_nu2nu_fn, shape=_nu2nu_spec, linear=(0,), out=True, shard=_shard,
                name="ducc0_nu2nu", examples=_example)
nu2nu.def_vmap(_vmap, out=True)


def _sign(kw: dict) -> float:
    return -1.0 if kw.get("forward", True) else 1.0


def _per_point(a, ndim: int):
    """A per-point array (N,) shaped (1,)*(ndim−1) + (N,) to broadcast on values."""
    return jnp.reshape(a, (1,) * (ndim - 1) + a.shape)


@nu2nu.def_jvp(traced=True, symbolic_zeros=True)
def _nu2nu_jvp(primals, tangents, **kw):
    """jvp: ċ, ẋ, ṡ ↦ nu2nu(ċ) + Σ_d iσ s_d ⊙ nu2nu(c ⊙ ẋ_d) + Σ_d iσ ṡ_d ⊙ nu2nu(x_d ⊙ c)."""
    (c, x, s), (dc, dx, ds) = primals, tangents
    nd, n = x.shape[1], c.ndim
    stack, scales = [], []
    if dc is not None:
        stack.append(dc)
        scales.append(None)
    if dx is not None:
        for d in range(nd):
            stack.append(c * _per_point(dx[:, d], n))
            scales.append(_per_point(s[:, d], n))
    if ds is not None:
        for d in range(nd):
            stack.append(c * _per_point(x[:, d], n))
            scales.append(_per_point(ds[:, d], n))
    if not stack:
        return None
    parts = nu2nu(jnp.stack(stack), x, s, **kw)
    res = None
    for part, scale in zip(parts, scales):
        term = part if scale is None else (1j * _sign(kw)) * scale * part
        res = term if res is None else res + term
    return res


@nu2nu.def_vjp(traced=True, symbolic_zeros=True)
def _nu2nu_vjp(primals, ct, *, needs, **kw):
    """vjp: ȳ ↦ (nu2nu_{s→x}(ȳ), Re(iσ c ⊙ nu2nu_{s→x}(s_d ⊙ ȳ)), Re(iσ ȳ ⊙ nu2nu(x_d ⊙ c)))."""
    c, x, s = primals
    if ct is None or not any(needs):
        return None, None, None
    nd, n, i_sigma = x.shape[1], c.ndim, 1j * _sign(kw)
    axes = tuple(range(n - 1))
    back = ([ct] if needs[0] else []) + \
        ([_per_point(s[:, d], n) * ct for d in range(nd)] if needs[1] else [])
    dc = dx = ds = None
    if back:
        out = nu2nu(jnp.stack(back), s, x, **reverse(kw))
        dc = out[0] if needs[0] else None
        if needs[1]:
            parts = out[1:] if needs[0] else out
            dx = jnp.stack([jnp.real(i_sigma * c * p).sum(axis=axes) for p in parts], axis=-1)
    if needs[2]:  # a forward transform of the primal values: the primal's keywords
        parts = nu2nu(jnp.stack([c * _per_point(x[:, d], n) for d in range(nd)]), x, s, **kw)
        ds = jnp.stack([jnp.real(i_sigma * ct * p).sum(axis=axes) for p in parts], axis=-1)
    return dc, dx, ds


nu2nu.__doc__ = f"""Type 3 NUFFT (non-uniform points ↦ non-uniform points), ducc0's nu2nu.

``nu2nu(values, coord_in, coord_out, *, forward=True, epsilon=None, nthreads=1,
sigma_min=1.19, sigma_max=2.51, reverse_options=())``: ``values`` complex
(..., M) at source points ``coord_in`` (M, D); returns (..., N) at the target
points ``coord_out`` (N, D), y_k = Σ_j c_j exp(∓i s_k·x_j). ``epsilon``
defaults to {_eps(np.complex128, None):g} (double) or {_eps(np.complex64, None):g} (single).
Differentiable in all three arguments to every order; linear in ``values``,
where ``jax.linear_transpose`` gives the transform from ``coord_out`` back to
``coord_in`` with the same sign. ``reverse_options``: pairs of ducc0 keywords
for the transforms reverse mode runs.

>>> import numpy as np
>>> from anybind.contrib.ducc0 import nu2nu
>>> x = np.array([[0.0], [1.0]]); s = np.array([[0.5], [2.5]]); c = np.array([1.0 + 0j, 2.0])
>>> y = nu2nu(c, x, s, epsilon=1e-12)
>>> bool(np.allclose(y, np.exp(-1j * s * x[:, 0]) @ c))
True
"""
