"""Spherical harmonic synthesis on HEALPix and its adjoint, as linear ops.

Real maps have a_{l,−m} = (−1)^m conj(a_lm), so only m ≥ 0 is stored, and a
real-linear op needs real coordinates. As JAXbind does, the complex a_lm
(ducc0's layout: m = 0, 1, …, mmax, each for l = m … lmax) are packed into one
real vector: Re a_l0 for the lmax+1 entries with m = 0, then √2·(Re a_lm, Im a_lm)
interleaved for m > 0. With this packing

  map = Σ_l r_l0 Y_l0 + √2 Σ_{m>0} (r_re Re Y_lm − r_im Im Y_lm),

whose transpose is exactly ducc0's adjoint_synthesis repacked the same way:
synthesis and adjoint synthesis are each other's transpose, and both are linear,
so anybind gives derivatives of every order. Leading axes of ``alm`` or ``map``
are transformed together in one ducc0 call (``ntrans``), which also makes
``vmap`` one call. ducc0 writes the maps straight into XLA's buffer
(``out=True``, ducc0's ``map=``); the a_lm are (un)packed by two vectorised
passes over a complex view of the packed vector (m > 0 is already laid out
as (Re, Im) pairs).
"""
from __future__ import annotations

import functools

import jax
import numpy as np

import anybind as ab

from . import require, reshaped

ducc0 = require("ducc0", "anybind.contrib.ducc0")

__all__ = ["healpix_synthesis", "healpix_adjoint_synthesis", "nalm", "n_real_alm",
           "alm2realalm", "realalm2alm"]


def nalm(lmax: int, mmax: int | None = None) -> int:
    """Number of complex a_lm with m ≥ 0 for ``lmax`` and ``mmax`` (default lmax).

    >>> from anybind.contrib.ducc0 import nalm
    >>> nalm(2)
    6
    """
    mmax = lmax if mmax is None else mmax
    return ((mmax + 1) * (mmax + 2)) // 2 + (mmax + 1) * (lmax - mmax)


def n_real_alm(lmax: int, mmax: int | None = None) -> int:
    """Length of the packed real a_lm vector: 2·nalm − (lmax + 1).

    >>> from anybind.contrib.ducc0 import n_real_alm
    >>> n_real_alm(2)
    9
    """
    return 2 * nalm(lmax, mmax) - (lmax + 1)


_SQRT2 = float(np.sqrt(2.0))
# real dtype ↦ complex dtype (a dict lookup: np.result_type costs ≈ 0.7 µs a call)
_COMPLEX = {np.dtype(t): np.dtype(np.result_type(t, np.complex64))
            for t in (np.float32, np.float64)}


def _as_complex(a: np.ndarray) -> np.ndarray:
    """The (Re, Im) pairs along the last axis of a real array as one complex view."""
    return a.view(_COMPLEX[a.dtype])


def _pack_into(alm: np.ndarray, lmax: int, out: np.ndarray) -> None:
    """out = alm2realalm(alm) in two passes: m = 0, then the (Re, Im) pairs of m > 0."""
    np.copyto(out[..., :lmax + 1], alm[..., :lmax + 1].real)
    np.multiply(alm[..., lmax + 1:], _SQRT2, out=_as_complex(out[..., lmax + 1:]))


def _unpack_into(ralm: np.ndarray, lmax: int, out: np.ndarray) -> None:
    """out = realalm2alm(ralm) in two passes; ``ralm`` contiguous along its last axis."""
    np.copyto(out[..., :lmax + 1], ralm[..., :lmax + 1])
    np.multiply(_as_complex(ralm[..., lmax + 1:]), 1 / _SQRT2, out=out[..., lmax + 1:])


def alm2realalm(alm: np.ndarray, lmax: int) -> np.ndarray:
    """Pack complex a_lm (last axis) into real ones: Re a_l0, then √2·(Re, Im) for m > 0.

    >>> import numpy as np
    >>> from anybind.contrib.ducc0 import alm2realalm
    >>> alm2realalm(np.array([1.0, 2.0, 3.0 + 4.0j]), 1).round(3).tolist()
    [1.0, 2.0, 4.243, 5.657]
    """
    alm = np.asarray(alm)
    real = np.finfo(alm.dtype).dtype
    out = np.empty(alm.shape[:-1] + (2 * alm.shape[-1] - lmax - 1,), dtype=real)
    _pack_into(alm, lmax, out)
    return out


def realalm2alm(ralm: np.ndarray, lmax: int) -> np.ndarray:
    """Unpack real a_lm (last axis) into complex ones; inverse of ``alm2realalm``.

    >>> import numpy as np
    >>> from anybind.contrib.ducc0 import alm2realalm, realalm2alm
    >>> realalm2alm(alm2realalm(np.array([1.0, 2.0, 3.0 + 4.0j]), 1), 1).tolist()
    [(1+0j), (2+0j), (3+4j)]
    """
    ralm = np.ascontiguousarray(ralm)
    n = (ralm.shape[-1] + lmax + 1) // 2
    out = np.empty(ralm.shape[:-1] + (n,), dtype=np.result_type(ralm.dtype, np.complex64))
    _unpack_into(ralm, lmax, out)
    return out


@functools.lru_cache(maxsize=32)
def _geometry(nside: int) -> dict:
    info = ducc0.healpix.Healpix_Base(nside, "RING").sht_info()
    return {k: info[k] for k in ("theta", "phi0", "nphi", "ringstart")}


def _check(name: str, x, last: int, what: str, nside: int, lmax: int, mmax, spin: int,
           kind) -> int:
    if not isinstance(nside, int) or nside < 1 or not isinstance(lmax, int) or lmax < 0:
        raise ValueError(f"anybind op '{name}': nside must be a positive int and lmax a "
                         f"non-negative int, got nside={nside!r}, lmax={lmax!r}")
    if mmax is not None and not 0 <= mmax <= lmax:
        raise ValueError(f"anybind op '{name}': mmax must lie in [0, lmax={lmax}], got {mmax}")
    if np.dtype(x.dtype) not in _COMPLEX:
        raise TypeError(f"anybind op '{name}': {what} must be float32 or float64, got {x.dtype}")
    ncomp = 1 if spin == 0 else 2
    if len(x.shape) < 2 or x.shape[-2:] != (ncomp, last):
        raise ValueError(f"anybind op '{name}': {what} must have shape (..., {ncomp}, {last}) "
                         f"for spin={spin}, lmax={lmax}, mmax={mmax}, nside={nside}; "
                         f"got {tuple(x.shape)}")
    return ncomp


def _synthesis(alm, *, out, nside: int, lmax: int, mmax: int | None = None, spin: int = 0,
               nthreads: int = 1) -> None:
    """Packed real a_lm (..., ncomp, n_real_alm) ↦ maps (..., ncomp, 12·nside²), into out."""
    alm = np.ascontiguousarray(alm.reshape((-1,) + alm.shape[-2:]))
    a = np.empty(alm.shape[:-1] + ((alm.shape[-1] + lmax + 1) // 2,), _COMPLEX[alm.dtype])
    _unpack_into(alm, lmax, a)
    ducc0.sht.experimental.synthesis(
        alm=a, map=reshaped(out, (-1,) + out.shape[-2:]), lmax=lmax,
        mmax=lmax if mmax is None else mmax, spin=spin, nthreads=nthreads, **_geometry(nside))


def _adjoint_synthesis(map, *, out, nside: int, lmax: int, mmax: int | None = None,
                       spin: int = 0, nthreads: int = 1) -> None:
    """Maps (..., ncomp, 12·nside²) ↦ packed real a_lm (..., ncomp, n_real_alm), into out."""
    alm = ducc0.sht.experimental.adjoint_synthesis(
        map=map.reshape((-1,) + map.shape[-2:]), lmax=lmax,
        mmax=lmax if mmax is None else mmax, spin=spin, nthreads=nthreads, **_geometry(nside))
    _pack_into(alm, lmax, reshaped(out, (-1,) + out.shape[-2:]))


def _synthesis_spec(alm, *, nside: int, lmax: int, mmax=None, spin: int = 0, **_):
    ncomp = _check("healpix_synthesis", alm, n_real_alm(lmax, mmax), "alm", nside, lmax, mmax,
                   spin, np.floating)
    return jax.ShapeDtypeStruct(alm.shape[:-2] + (ncomp, 12 * nside**2), alm.dtype)


def _adjoint_spec(map, *, nside: int, lmax: int, mmax=None, spin: int = 0, **_):
    ncomp = _check("healpix_adjoint_synthesis", map, 12 * nside**2, "map", nside, lmax, mmax,
                   spin, np.floating)
    return jax.ShapeDtypeStruct(map.shape[:-2] + (ncomp, n_real_alm(lmax, mmax)), map.dtype)


def _example_alm():
    lmax = 5
    return ((np.random.default_rng(0).normal(size=(2, 1, n_real_alm(lmax))),),
            {"nside": 2, "lmax": lmax})


def _example_map():
    return ((np.random.default_rng(0).normal(size=(2, 2, 48)),),
            {"nside": 2, "lmax": 4, "mmax": 3, "spin": 2})


def _synthesis_transpose(ct, *, out, **kw) -> None:
    """transpose of synthesis Y: ȳ ↦ Yᵀ·ȳ = pack(adjoint_synthesis(ȳ)) (real packing)."""
    _adjoint_synthesis(ct, out=out[0], **kw)


def _adjoint_transpose(ct, *, out, **kw) -> None:
    """transpose of the adjoint Yᵀ: ā ↦ Y·ā = synthesis(unpack(ā))."""
    _synthesis(ct, out=out[0], **kw)


healpix_synthesis = ab.bind(
    _synthesis, shape=_synthesis_spec, linear=True, vmap="expand_dims", out=True,
    shard="... c a -> ... c q", replicated=("c",),  # leading axes split; E/B mix into Q/U
    name="ducc0_healpix_synthesis", examples=_example_alm)
healpix_synthesis.def_transpose(_synthesis_transpose, out=True)
healpix_adjoint_synthesis = ab.bind(
    _adjoint_synthesis, shape=_adjoint_spec, linear=True, vmap="expand_dims", out=True,
    shard="... c q -> ... c a", replicated=("c",),
    name="ducc0_healpix_adjoint_synthesis", examples=_example_map)
healpix_adjoint_synthesis.def_transpose(_adjoint_transpose, out=True)

healpix_synthesis.__doc__ = """Spherical harmonic synthesis on a HEALPix grid (RING order), linear.

``healpix_synthesis(alm, *, nside, lmax, mmax=None, spin=0, nthreads=1)``:
packed real a_lm of shape (..., ncomp, n_real_alm(lmax, mmax)) ↦ maps of shape
(..., ncomp, 12·nside²), ncomp = 1 for spin 0, else 2 (E/B ↦ Q/U).
Transpose: ``healpix_adjoint_synthesis``. Derivatives of every order.

>>> import numpy as np
>>> from anybind.contrib.ducc0 import healpix_synthesis, n_real_alm
>>> alm = np.zeros((1, n_real_alm(2)))
>>> alm[0, 0] = np.sqrt(4 * np.pi)             # a_00: the constant map 1
>>> bool(np.allclose(healpix_synthesis(alm, nside=1, lmax=2), 1.0))
True
"""
healpix_adjoint_synthesis.__doc__ = """Adjoint spherical harmonic synthesis on HEALPix, linear.

``healpix_adjoint_synthesis(map, *, nside, lmax, mmax=None, spin=0, nthreads=1)``:
maps (..., ncomp, 12·nside²) ↦ packed real a_lm (..., ncomp, n_real_alm(lmax,
mmax)); the transpose of ``healpix_synthesis``, and the other way round.

>>> import numpy as np
>>> from anybind.contrib.ducc0 import healpix_adjoint_synthesis
>>> healpix_adjoint_synthesis(np.ones((1, 12)), nside=1, lmax=2).shape
(1, 9)
"""
