"""ducc0's non-uniform FFT, differentiable in the values and in the points.

With α_d = s·i·2π/P_d (s = −1 for ``forward``, P the periodicity) and k the
integer frequencies of the uniform grid,

  type 1, ``nu2u``:  f_k = Σ_j c_j exp(α·k·x_j)      (points ↦ grid)
  type 2, ``u2nu``:  y_j = Σ_k g_k exp(α·k·x_j)      (grid ↦ points)

Both are linear in the values and nonlinear in the points x; they are bound
with ``linear=(0,)``, so ``jax.linear_transpose`` in the values works (given
the points). Their derivatives are NUFFTs again, of k-weighted data:

  ∂nu2u·(ċ, ẋ) = nu2u(ċ) + Σ_d α_d k_d ⊙ nu2u(c ⊙ ẋ_d)
  ∂u2nu·(ġ, ẋ) = u2nu(ġ) + Σ_d α_d ẋ_d ⊙ u2nu(k_d ⊙ g)

and, in JAX's convention (cotangents paired by Re Σ a·b, no conjugation),
the transpose of nu2u in its values is u2nu with the same sign and vice versa:

  vjp nu2u: c̄ = u2nu(ȳ),  x̄_d = Re(α_d c ⊙ u2nu(k_d ⊙ ȳ))
  vjp u2nu: ḡ = nu2u(ȳ),  x̄_d = Re(α_d ȳ ⊙ u2nu(k_d ⊙ g))

The rules are JAX code calling the two ops, so derivatives of every order
follow. Leading axes of the values share the points and go to ducc0 in one
call (``ntrans``); the D+1 transforms of a derivative are one call too, and so
is ``vmap`` when the points are not batched. ducc0 writes every result straight
into XLA's buffer (``out=True``, ducc0's ``out=``), except single precision
below ducc0's single-precision limit, computed in double and rounded into it.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require, reshaped

ducc0 = require("ducc0", "anybind.contrib.ducc0")

__all__ = ["nu2u", "u2nu"]

TWO_PI = 2 * math.pi


def _eps(dtype, epsilon) -> float:
    if epsilon is not None:
        return float(epsilon)
    return 1e-5 if np.dtype(dtype) == np.complex64 else 1e-10


def _periods(periodicity, ndim: int) -> tuple:
    if isinstance(periodicity, (int, float)):
        return (float(periodicity),) * ndim
    return tuple(float(p) for p in periodicity)


def _freqs(n: int, fft_order: bool) -> np.ndarray:
    """The integer frequencies of a grid axis of length n, in ducc0's order."""
    return np.fft.fftfreq(n, 1.0 / n) if fft_order else np.arange(n) - n // 2


def _kgrids(modes: Sequence[int], lead: int, kw: dict, real) -> list:
    """α_d·k_d for each grid axis d, shaped (1,)*lead + (…, n_d, …) to broadcast on a grid."""
    sign = -1.0 if kw.get("forward", True) else 1.0
    periods = _periods(kw.get("periodicity", TWO_PI), len(modes))
    out = []
    for d, n in enumerate(modes):
        shape = [1] * (lead + len(modes))
        shape[lead + d] = n
        k = _freqs(n, kw.get("fft_order", False)).astype(real).reshape(shape)
        out.append((sign * TWO_PI / periods[d], jnp.asarray(k)))
    return out


def _along_points(a, ndim: int):
    """A per-point array (M,) shaped (1,)*(ndim−1) + (M,) to broadcast on values."""
    return jnp.reshape(a, (1,) * (ndim - 1) + a.shape)


def _check(name: str, data, coord, ndim_grid: int | None):
    if not np.issubdtype(data.dtype, np.complexfloating):
        raise TypeError(f"anybind op '{name}': the values must be complex, got {data.dtype}")
    real = np.finfo(data.dtype).dtype
    if len(coord.shape) != 2 or coord.dtype != real:
        raise TypeError(f"anybind op '{name}': coord must be a ({'npoints'}, ndim) array of "
                        f"{real.name} (the precision of the values), got "
                        f"{coord.dtype}{list(coord.shape)}")
    if ndim_grid is not None and coord.shape[1] != ndim_grid:
        raise ValueError(f"anybind op '{name}': coord has {coord.shape[1]} dimensions but the "
                         f"grid has {ndim_grid}")
    if not 1 <= coord.shape[1] <= 3:
        raise ValueError(f"anybind op '{name}': ducc0 supports 1 to 3 dimensions, "
                         f"got {coord.shape[1]}")


# ------------------------------------------------------------------ host calls

def _options(dtype, kw: dict) -> dict:
    """ducc0's keywords: ours with their defaults, any other ducc0 option passed through."""
    kw = {k: v for k, v in kw.items() if k != "reverse_options"}
    return dict(kw, forward=kw.get("forward", True), epsilon=_eps(dtype, kw.get("epsilon")))


def reverse(kw: dict) -> dict:
    """The keywords of the transforms reverse mode runs: ``kw`` with its
    ``reverse_options`` (pairs of ducc0 keywords, possibly nesting their own
    ``reverse_options``) applied. Sign, precision and grid order stay the caller's."""
    base = {k: v for k, v in kw.items() if k != "reverse_options"}
    return dict(base, **dict(kw.get("reverse_options", ())))


@functools.lru_cache(maxsize=64)
def _best_single(ndim: int, sigma_min: float, sigma_max: float) -> float:
    return ducc0.nufft.bestEpsilon(ndim=ndim, singleprec=True, sigma_min=sigma_min,
                                   sigma_max=sigma_max)


def in_double(dtype, ndim: int, kw: dict, stages: int = 1) -> bool:
    """Whether single-precision data asks for an accuracy ducc0 reaches only in double.

    ``stages``: 2 for type 3, which spends half its ``epsilon`` on each of its two
    spreading stages, so that its single-precision limit is twice type 1's and 2's."""
    return np.dtype(dtype) == np.complex64 and _eps(dtype, kw.get("epsilon")) < stages * (
        _best_single(ndim, float(kw.get("sigma_min", 1.19)), float(kw.get("sigma_max", 2.51))))


def run(transform, dtype, ndim: int, kw: dict, out, stages: int = 1, **arrays) -> None:
    """``transform(**arrays, **ducc0 keywords)`` into ``out`` (the keyword named by
    ``out``'s only key), in double precision where ``in_double``, then rounded."""
    (out_name, target), = out.items()
    if in_double(dtype, ndim, kw, stages):
        arrays = {k: a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
                  for k, a in arrays.items()}
        wide = np.empty(target.shape, np.complex128)
        transform(**arrays, **{out_name: wide}, **_options(np.complex128, kw))
        target[...] = wide
    else:
        transform(**arrays, **{out_name: target}, **_options(dtype, kw))


def not_finite(coord) -> np.ndarray:
    """Which points (rows of coord (M, D)) have a NaN or infinite coordinate."""
    return ~np.isfinite(coord).all(axis=1)


def source_points(out, coord) -> bool:
    """Whether a transform from the points of coord (M, D) into ``out`` runs in ducc0.

    The direct sum's answers where ducc0 has none: nothing to write (an empty
    ``out``), zero (no points: an empty sum, which ducc0 refuses), NaN everywhere
    (a NaN or infinite point: each term it adds is NaN, for a zero value too)."""
    if out.size == 0:
        return False
    if coord.shape[0] == 0:
        out[...] = 0
        return False
    if not_finite(coord).any():
        out[...] = complex(np.nan, np.nan)
        return False
    return True


def target_points(out, coord):
    """``(coord, bad)``: the points of a transform's output, those that are NaN or
    infinite moved to 0 for ducc0; ``bad`` marks them, whose outputs are NaN."""
    bad = not_finite(coord)
    return (np.where(bad[:, None], 0, coord) if bad.any() else coord), bad


def _nu2u_fn(values, coord, *, out, n_modes: tuple, **kw) -> None:
    """Type 1: values (..., M) at coord (M, D) ↦ grid (..., *n_modes), into out."""
    if source_points(out, coord):
        run(ducc0.nufft.nu2u, values.dtype, coord.shape[1], kw,
            {"out": reshaped(out, (-1,) + tuple(n_modes))},
            points=values.reshape((-1, values.shape[-1])), coord=coord)


def _u2nu_fn(grid, coord, *, out, **kw) -> None:
    """Type 2: grid (..., *n_modes) ↦ values (..., M) at coord (M, D), into out."""
    if out.size == 0:
        return
    nd = coord.shape[1]
    coord, bad = target_points(out, coord)
    run(ducc0.nufft.u2nu, grid.dtype, nd, kw, {"out": reshaped(out, (-1, coord.shape[0]))},
        grid=grid.reshape((-1,) + grid.shape[grid.ndim - nd:]), coord=coord)
    out[..., bad] = complex(np.nan, np.nan)


def _vmap_points(fn):
    """In-place vmap rule: shared points → one call, the batch a leading values axis;
    else a loop over the rows."""
    def rule(size, in_batched, data, coord, *, out, **kw) -> None:
        if not in_batched[1]:
            if not in_batched[0]:
                data = np.broadcast_to(data, (size,) + data.shape)
            fn(data, coord, out=out, **kw)
            return
        for b in range(size):
            fn(data[b] if in_batched[0] else data, coord[b], out=out[b], **kw)
    return rule


def _nu2u_spec(values, coord, *, n_modes, **_):
    if not (isinstance(n_modes, tuple) and all(isinstance(n, int) and n > 0 for n in n_modes)):
        raise TypeError(f"anybind op 'nu2u': n_modes must be a tuple of positive ints, "
                        f"got {n_modes!r}")
    _check("nu2u", values, coord, len(n_modes))
    if values.shape[-1:] != coord.shape[:1]:
        raise ValueError(f"anybind op 'nu2u': values {tuple(values.shape)} do not end in the "
                         f"number of points {coord.shape[0]} of coord")
    return jax.ShapeDtypeStruct(values.shape[:-1] + n_modes, values.dtype)


def _u2nu_spec(grid, coord, **_):
    _check("u2nu", grid, coord, None)
    nd = coord.shape[1]
    if len(grid.shape) < nd or 0 in grid.shape[len(grid.shape) - nd:]:
        raise ValueError(f"anybind op 'u2nu': a {nd}-dimensional grid needs at least {nd} "
                         f"axes, its last {nd} (the modes) of at least one entry each, got "
                         f"{tuple(grid.shape)}")
    return jax.ShapeDtypeStruct(grid.shape[:len(grid.shape) - nd] + coord.shape[:1], grid.dtype)


def _example(kind: str):
    r = np.random.default_rng(0)
    coord = r.uniform(-np.pi, np.pi, size=(7, 2))
    if kind == "nu2u":
        return (r.normal(size=(2, 7)) + 1j * r.normal(size=(2, 7)), coord), {"n_modes": (4, 5)}
    return (r.normal(size=(4, 5)) + 1j * r.normal(size=(4, 5)), coord), {"forward": False}


def _nu2u_shard(values, coord, *, n_modes, **_):
    """Leading axes split; points summed over, modes whole."""
    return "... p, p d -> ... " + " ".join(f"m{i}" for i in range(len(n_modes)))


def _u2nu_shard(grid, coord, **_):
    """Leading axes and points split; the grid whole."""
    grid_axes = " ".join(f"g{i}" for i in range(coord.shape[1]))
    return f"... {grid_axes}, p d -> ... p"


nu2u = ab.bind(_nu2u_fn, shape=_nu2u_spec, linear=(0,), out=True, shard=_nu2u_shard,
               name="ducc0_nu2u", examples=lambda: _example("nu2u"))
u2nu = ab.bind(_u2nu_fn, shape=_u2nu_spec, linear=(0,), out=True, shard=_u2nu_shard,
               name="ducc0_u2nu", examples=lambda: _example("u2nu"))
nu2u.def_vmap(_vmap_points(_nu2u_fn), out=True)
u2nu.def_vmap(_vmap_points(_u2nu_fn), out=True)


# ----------------------------------------------------------------------- rules

@nu2u.def_jvp(traced=True, symbolic_zeros=True)
def _nu2u_jvp(primals, tangents, *, n_modes, **kw):
    """jvp: (c, x; ċ, ẋ) ↦ nu2u(ċ) + Σ_d α_d k_d ⊙ nu2u(c ⊙ ẋ_d)."""
    (c, x), (dc, dx) = primals, tangents
    stack = [] if dc is None else [dc]
    if dx is not None:
        stack += [c * _along_points(dx[:, d], c.ndim) for d in range(x.shape[1])]
    if not stack:
        return None
    out = nu2u(jnp.stack(stack), x, n_modes=n_modes, **kw)
    res = out[0] if dc is not None else None
    if dx is not None:
        parts = out[1:] if dc is not None else out
        for (alpha, k), part in zip(_kgrids(n_modes, c.ndim - 1, kw, x.dtype), parts):
            term = (alpha * 1j) * k * part
            res = term if res is None else res + term
    return res


@nu2u.def_vjp(traced=True, symbolic_zeros=True)
def _nu2u_vjp(primals, ct, *, n_modes, needs, **kw):
    """vjp: ȳ ↦ (u2nu(ȳ), Re(α_d c ⊙ u2nu(k_d ⊙ ȳ)) for each d)."""
    c, x = primals
    if ct is None or not any(needs):
        return None, None
    lead = c.ndim - 1
    ks = _kgrids(n_modes, lead, kw, x.dtype)
    stack = ([ct] if needs[0] else []) + ([k * ct for _, k in ks] if needs[1] else [])
    out = u2nu(jnp.stack(stack), x, **reverse(kw))
    dc = out[0] if needs[0] else None
    dx = None
    if needs[1]:
        parts = out[1:] if needs[0] else out
        axes = tuple(range(lead))
        dx = jnp.stack([jnp.real((alpha * 1j) * c * p).sum(axis=axes)
                        for (alpha, _), p in zip(ks, parts)], axis=-1)
    return dc, dx


@u2nu.def_jvp(traced=True, symbolic_zeros=True)
def _u2nu_jvp(primals, tangents, **kw):
    """jvp: (g, x; ġ, ẋ) ↦ u2nu(ġ) + Σ_d α_d ẋ_d ⊙ u2nu(k_d ⊙ g)."""
    (g, x), (dg, dx) = primals, tangents
    nd = x.shape[1]
    lead = g.ndim - nd
    ks = _kgrids(g.shape[lead:], lead, kw, x.dtype)
    stack = ([] if dg is None else [dg]) + ([] if dx is None else [k * g for _, k in ks])
    if not stack:
        return None
    out = u2nu(jnp.stack(stack), x, **kw)
    res = out[0] if dg is not None else None
    if dx is not None:
        parts = out[1:] if dg is not None else out
        for d, ((alpha, _), part) in enumerate(zip(ks, parts)):
            term = (alpha * 1j) * _along_points(dx[:, d], lead + 1) * part
            res = term if res is None else res + term
    return res


@u2nu.def_vjp(traced=True, symbolic_zeros=True)
def _u2nu_vjp(primals, ct, *, needs, **kw):
    """vjp: ȳ ↦ (nu2u(ȳ), Re(α_d ȳ ⊙ u2nu(k_d ⊙ g)) for each d)."""
    g, x = primals
    if ct is None or not any(needs):
        return None, None
    nd = x.shape[1]
    lead = g.ndim - nd
    modes = tuple(g.shape[lead:])
    dg = nu2u(ct, x, n_modes=modes, **reverse(kw)) if needs[0] else None
    dx = None
    if needs[1]:
        ks = _kgrids(modes, lead, kw, x.dtype)
        parts = u2nu(jnp.stack([k * g for _, k in ks]), x, **kw)  # a forward transform
        axes = tuple(range(lead))
        dx = jnp.stack([jnp.real((alpha * 1j) * ct * p).sum(axis=axes)
                        for (alpha, _), p in zip(ks, parts)], axis=-1)
    return dg, dx


nu2u.__doc__ = """Type 1 NUFFT (non-uniform points ↦ uniform grid), ducc0.nufft.nu2u.

``nu2u(values, coord, *, n_modes, forward=True, epsilon=None, nthreads=1,
periodicity=2π, fft_order=False, reverse_options=())``: ``values`` complex
(..., M) at points ``coord`` (M, D) of the same precision; returns (...,
*n_modes). ``epsilon`` defaults to 1e-10 (double) or 1e-5 (single); single
precision below ducc0's single-precision limit runs in double and is rounded.
Other ducc0 keywords (``sigma_min``, ``sigma_max``, ``verbosity``) pass
through; ``reverse_options`` are pairs of ducc0 keywords for the transforms
reverse mode runs. Differentiable in both arguments to every order; linear in
``values``, where ``jax.linear_transpose`` gives ``u2nu`` with the same sign.

>>> import numpy as np
>>> from anybind.contrib.ducc0 import nu2u
>>> x = np.array([[0.0], [1.0]]); c = np.array([1.0 + 0j, 2.0])
>>> f = nu2u(c, x, n_modes=(3,))
>>> bool(np.allclose(f, [(c * np.exp(-1j * k * x[:, 0])).sum() for k in (-1, 0, 1)]))
True
"""
u2nu.__doc__ = """Type 2 NUFFT (uniform grid ↦ non-uniform points), ducc0.nufft.u2nu.

``u2nu(grid, coord, *, forward=True, epsilon=None, nthreads=1, periodicity=2π,
fft_order=False, reverse_options=())``: ``grid`` complex (..., *modes), D =
coord.shape[1] trailing axes; ``coord`` (M, D); returns (..., M). Keywords
and precision as for ``nu2u``. Differentiable in both arguments to every
order; linear in ``grid``, where ``jax.linear_transpose`` gives ``nu2u`` with
the same sign.

>>> import numpy as np
>>> from anybind.contrib.ducc0 import u2nu
>>> g = np.array([1.0 + 0j, 2.0, 3.0]); x = np.array([[0.5]])
>>> bool(np.allclose(u2nu(g, x), (g * np.exp(-0.5j * np.arange(-1, 2))).sum()))
True
"""
