"""jax-finufft's ``nufft1``/``nufft2``/``nufft3``, run by the ducc0 ops.

Each function brings its inputs to one layout (``_finufft_shapes``: values
(B, S, …), points (B, M)), stacks the D point arrays into ducc0's (M, D)
coordinates and calls ``nu2u``/``u2nu``/``nu2nu``: directly when B = 1, under
``jax.vmap`` over B otherwise (one ducc0 call per set of points, each for the S
transforms that share them). Their rules give every derivative; ``vmap`` of
these functions is ``vmap`` of those ops.

Conventions mapped: ``iflag`` ≥ 0 is ducc0's ``forward=False`` (exponent +i);
the period is 2π; ``eps`` below what ducc0 reaches in double is raised to it
(as FINUFFT does); single precision below ducc0's single-precision limit is
computed in double inside the op (see ``_ducc0_nufft.in_double``).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import require
from ._ducc0_nufft import nu2u, u2nu
from ._ducc0_nufft3 import nu2nu
from ._finufft_options import NestedOpts, Opts, ducc0_keywords, unpack_opts
from ._finufft_shapes import broadcast_and_flatten_inputs

ducc0 = require("ducc0", "anybind.contrib.finufft")

__all__ = ["nufft1", "nufft2", "nufft3", "keywords"]

ArrayLike = jax.typing.ArrayLike
Options = Opts | NestedOpts | None
_REVERSE_DEPTH = 8  # per-direction options are followed this many derivative orders deep
_TRANSPOSED = {1: 2, 2: 1, 3: 3}


@functools.lru_cache(maxsize=64)
def _best_double(ndim: int, sigma_min: float, sigma_max: float) -> float:
    return ducc0.nufft.bestEpsilon(ndim=ndim, singleprec=False, sigma_min=sigma_min,
                                   sigma_max=sigma_max)


def _level(where: str, opts, nufft_type: int, ndim: int, eps: float, iflag: int) -> dict:
    # every keyword explicit, so that one level's never leaks into the next (``reverse``)
    kw = dict(sigma_min=1.19, sigma_max=2.51, verbosity=0)
    kw.update(ducc0_keywords(unpack_opts(opts, nufft_type, True), where))
    # type 3 spends half its epsilon on each of its two spreading stages
    best = _best_double(ndim, kw["sigma_min"], kw["sigma_max"]) * (2 if nufft_type == 3 else 1)
    kw.update(forward=iflag < 0, epsilon=max(float(eps), 1.01 * best))
    if nufft_type == 3:
        kw.pop("fft_order")  # no grid
    return kw


def keywords(where: str, opts, nufft_type: int, ndim: int, eps: float, iflag: int) -> dict:
    """The ducc0 keywords of one call: its own options, and under ``reverse_options``
    those of the transposed transforms its reverse mode runs (jax-finufft's
    ``NestedOpts.backward``), nested a few orders deep. The grid order and the
    sign are the call's at every depth: they define the transform."""
    chain, state = [], (opts, nufft_type)
    for _ in range(_REVERSE_DEPTH + 1):
        chain.append(_level(where, state[0], state[1], ndim, eps, iflag))
        state = (unpack_opts(state[0], state[1], False), _TRANSPOSED[state[1]])
    top = chain[0]
    below = None
    for kw in reversed(chain[1:]):
        kw = dict(kw, **{k: top[k] for k in ("fft_order", "forward") if k in top})
        if below is not None and below != kw:
            kw["reverse_options"] = tuple(sorted(below.items()))
        below = kw
    if below != top:
        top = dict(top, reverse_options=tuple(sorted(below.items())))
    return top


def _check(where: str, source, points) -> tuple:
    """source and points as arrays of one precision, complex and real."""
    source = jnp.asarray(source)
    points = [jnp.asarray(p) for p in points]
    if not jnp.issubdtype(source.dtype, jnp.complexfloating):
        raise TypeError(f"{where}: the source must be complex (complex64 or complex128), "
                        f"got {source.dtype}")
    real = jnp.finfo(source.dtype).dtype
    for i, p in enumerate(points):
        if p.dtype != real:
            raise TypeError(f"{where}: point array {i} must be {real} (the precision of the "
                            f"{source.dtype} source), got {p.dtype}")
    return source, points


def _ndim(where: str, ndim: int) -> None:
    if not 1 <= ndim <= 3:
        raise ValueError(f"{where}: only 1-, 2- and 3-dimensional transforms are supported, "
                         f"got {ndim} point arrays per point set")


def _per_batch(op, source, coords, **kw):
    """``op`` on (S, …) values and (M, D) coordinates, for each of the B sets."""
    if source.shape[0] == 1:
        return op(source[0], *(c[0] for c in coords), **kw)[None]
    return jax.vmap(functools.partial(op, **kw))(source, *coords)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("iflag", "eps", "opts"))
def nufft1(output_shape: int | Sequence[int], source: ArrayLike, *points: ArrayLike,
           eps: float = 1e-6, iflag: int = 1, opts: Options = None) -> jax.Array:
    """Type 1 NUFFT, points ↦ modes: f_k = Σ_j c_j exp(i·sign(iflag)·k·x_j).

    ``nufft1(output_shape, source, *points, eps=1e-6, iflag=1, opts=None)``, as in
    jax-finufft: ``output_shape`` an int or one int per dimension; ``source``
    complex (..., M); ``points`` D real arrays (..., M) of the source's precision,
    in [−π, π) or any period-2π shift of it. Returns (..., *output_shape), modes
    from −N/2 (``Opts(modeord=True)``: FFT order). Leading axes follow
    jax-finufft's batching (see the module). Differentiable in the source and the
    points, to every order; usable under ``jit`` and ``vmap``.

    >>> import numpy as np
    >>> from anybind.contrib.finufft import nufft1
    >>> x = np.array([0.0, 1.0]); c = np.array([1.0 + 0j, 2.0])
    >>> f = nufft1(3, c, x, eps=1e-12)
    >>> bool(np.allclose(f, [(c * np.exp(1j * k * x)).sum() for k in (-1, 0, 1)]))
    True
    """
    where = "anybind.contrib.finufft.nufft1"
    iflag, eps, ndim = int(iflag), float(eps), len(points)
    _ndim(where, ndim)
    shape = tuple(int(n) for n in np.atleast_1d(output_shape))
    if len(shape) != ndim or min(shape) < 1:
        raise ValueError(f"{where}: output_shape must give {ndim} positive sizes (one per "
                         f"point array), got {output_shape!r}")
    source, points = _check(where, source, points)
    index, source, *points = broadcast_and_flatten_inputs(1, shape, source, *points)
    kw = keywords(where, opts, 1, ndim, eps, iflag)
    out = _per_batch(nu2u, source, [jnp.stack(points, axis=-1)], n_modes=shape, **kw)
    return index.unflatten(out)


@functools.partial(jax.jit, static_argnames=("iflag", "eps", "opts"))
def nufft2(source: ArrayLike, *points: ArrayLike, eps: float = 1e-6, iflag: int = -1,
           opts: Options = None) -> jax.Array:
    """Type 2 NUFFT, modes ↦ points: c_j = Σ_k f_k exp(i·sign(iflag)·k·x_j).

    ``nufft2(source, *points, eps=1e-6, iflag=-1, opts=None)``, as in jax-finufft:
    ``source`` complex (..., *modes), D trailing axes; ``points`` D real arrays
    (..., M). Returns (..., M). Differentiable in the source and the points, to
    every order; usable under ``jit`` and ``vmap``.

    >>> import numpy as np
    >>> from anybind.contrib.finufft import nufft2
    >>> f = np.array([1.0 + 0j, 2.0, 3.0]); x = np.array([0.5])
    >>> bool(np.allclose(nufft2(f, x, eps=1e-12), (f * np.exp(-0.5j * np.arange(-1, 2))).sum()))
    True
    """
    where = "anybind.contrib.finufft.nufft2"
    iflag, eps, ndim = int(iflag), float(eps), len(points)
    _ndim(where, ndim)
    source, points = _check(where, source, points)
    if source.ndim < ndim:
        raise ValueError(f"{where}: a {ndim}-dimensional transform needs a source with at "
                         f"least {ndim} axes (the modes), got shape {source.shape}")
    if 0 in source.shape[source.ndim - ndim:]:
        raise ValueError(f"{where}: the source's {ndim} trailing axes are the modes, each of "
                         f"at least one, got shape {source.shape}")
    index, source, *points = broadcast_and_flatten_inputs(2, None, source, *points)
    kw = keywords(where, opts, 2, ndim, eps, iflag)
    out = _per_batch(u2nu, source, [jnp.stack(points, axis=-1)], **kw)
    return index.unflatten(out)


@functools.partial(jax.jit, static_argnames=("iflag", "eps", "opts"))
def nufft3(source: ArrayLike, *points: ArrayLike, eps: float = 1e-6, iflag: int = -1,
           opts: Options = None) -> jax.Array:
    """Type 3 NUFFT, points ↦ points: f_k = Σ_j c_j exp(i·sign(iflag)·s_k·x_j).

    ``nufft3(source, *points, eps=1e-6, iflag=-1, opts=None)``, as in jax-finufft:
    ``points`` are the D source point arrays and then the D target arrays
    (``x, s``, ``x, y, s, t`` or ``x, y, z, s, t, u``); ``source`` complex (..., M)
    at the sources; returns (..., N) at the targets. Differentiable in the source
    and both point sets, to every order; usable under ``jit`` and ``vmap``.

    >>> import numpy as np
    >>> from anybind.contrib.finufft import nufft3
    >>> x = np.array([0.0, 1.0]); s = np.array([0.5, 2.5]); c = np.array([1.0 + 0j, 2.0])
    >>> bool(np.allclose(nufft3(c, x, s, eps=1e-12), np.exp(-1j * np.outer(s, x)) @ c))
    True
    """
    where = "anybind.contrib.finufft.nufft3"
    iflag, eps = int(iflag), float(eps)
    if len(points) % 2:
        raise ValueError(f"{where}: needs the source points and then as many target point "
                         f"arrays (x, s / x, y, s, t / x, y, z, s, t, u), got {len(points)} "
                         f"arrays")
    ndim = len(points) // 2
    _ndim(where, ndim)
    source, points = _check(where, source, points)
    index, source, *points = broadcast_and_flatten_inputs(3, None, source, *points)
    kw = keywords(where, opts, 3, ndim, eps, iflag)
    coords = [jnp.stack(points[:ndim], axis=-1), jnp.stack(points[ndim:], axis=-1)]
    out = _per_batch(nu2nu, source, coords, **kw)
    return index.unflatten(out)
