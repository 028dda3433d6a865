"""The radio-interferometric wgridder of ducc0: dirty image ↔ visibilities, as linear ops.

``dirty2vis`` maps a real image to complex visibilities, vis = A·dirty;
``vis2dirty`` is its adjoint, dirty = Re(Aᴴ·vis). JAX pairs cotangents by
Re Σ a·b without conjugation, so the transposes are

  dirty2vis: ȳ ↦ Re(Aᵀ·ȳ) = Re(Aᴴ·conj ȳ) = vis2dirty(conj ȳ)
  vis2dirty: ȳ ↦ conj(A·ȳ) = conj(dirty2vis(ȳ))

and, both being linear, derivatives of every order follow. ``uvw`` (nrow, 3)
and ``freq`` (nchan,) are non-differentiable array keywords (as are the
optional ``wgt`` and ``mask``); everything else is static and passed to ducc0.
ducc0 cannot batch images, so ``vmap`` loops in one host call. ducc0 writes
every result straight into XLA's buffers (``out=True``, ducc0's ``vis=`` and
``dirty=``), the transposes' too.
"""
from __future__ import annotations

import jax
import numpy as np

import anybind as ab

from . import require

ducc0 = require("ducc0", "anybind.contrib.ducc0")

__all__ = ["dirty2vis", "vis2dirty"]

_REQUIRED = ("uvw", "freq", "pixsize_x", "pixsize_y")


def _require_keywords(name: str, kw: dict) -> None:
    missing = [k for k in _REQUIRED if k not in kw]
    if missing:
        raise TypeError(f"anybind op '{name}': missing keyword argument(s) {missing}")


def _options(name: str, dtype, kw: dict) -> dict:
    """ducc0's keywords: float64 coordinates whatever the image's precision, default epsilon."""
    _require_keywords(name, kw)
    kw = dict(kw, uvw=np.asarray(kw["uvw"], np.float64), freq=np.asarray(kw["freq"], np.float64))
    if kw.get("epsilon") is None:
        kw["epsilon"] = 2e-5 if np.dtype(dtype) == np.float32 else 1e-10
    return kw


def _dirty2vis_fn(dirty, *, out, **kw) -> None:
    """Host function: image (npix_x, npix_y) ↦ visibilities (nrow, nchan), into out."""
    ducc0.wgridder.experimental.dirty2vis(
        dirty=dirty, vis=out, **_options("dirty2vis", dirty.dtype, kw))


def _vis2dirty_fn(vis, *, out, npix_x: int, npix_y: int, **kw) -> None:
    """Host function: visibilities (nrow, nchan) ↦ image (npix_x, npix_y), into out."""
    real = np.finfo(vis.dtype).dtype
    ducc0.wgridder.experimental.vis2dirty(
        vis=vis, dirty=out, npix_x=npix_x, npix_y=npix_y, **_options("vis2dirty", real, kw))


def _check_uvw(name: str, kw: dict):
    _require_keywords(name, kw)
    uvw, freq = kw["uvw"], kw["freq"]
    if len(uvw.shape) != 2 or uvw.shape[1] != 3 or len(freq.shape) != 1:
        raise ValueError(f"anybind op '{name}': uvw must have shape (nrow, 3) and freq "
                         f"(nchan,); got {tuple(uvw.shape)} and {tuple(freq.shape)}")
    return uvw.shape[0], freq.shape[0]


def _dirty2vis_spec(dirty, **kw):
    nrow, nchan = _check_uvw("dirty2vis", kw)
    if not np.issubdtype(dirty.dtype, np.floating) or len(dirty.shape) != 2:
        raise TypeError(f"anybind op 'dirty2vis': dirty must be a real 2-d image, got "
                        f"{dirty.dtype}{list(dirty.shape)}")
    complex_ = np.result_type(dirty.dtype, np.complex64)
    return jax.ShapeDtypeStruct((nrow, nchan), complex_)


def _vis2dirty_spec(vis, *, npix_x: int, npix_y: int, **kw):
    nrow, nchan = _check_uvw("vis2dirty", kw)
    if not np.issubdtype(vis.dtype, np.complexfloating) or tuple(vis.shape) != (nrow, nchan):
        raise TypeError(f"anybind op 'vis2dirty': vis must be complex of shape ({nrow}, "
                        f"{nchan}), got {vis.dtype}{list(vis.shape)}")
    return jax.ShapeDtypeStruct((npix_x, npix_y), np.finfo(vis.dtype).dtype)


def _setup(seed: int = 0, nrow: int = 6, nchan: int = 2) -> dict:
    """A small observation: uvw in metres, frequencies in Hz, 1-arcmin pixels."""
    r = np.random.default_rng(seed)
    return {"uvw": r.uniform(-300.0, 300.0, size=(nrow, 3)) * np.array([1.0, 1.0, 0.1]),
            "freq": np.linspace(1.0e9, 1.2e9, nchan), "pixsize_x": 3e-4, "pixsize_y": 2e-4}


_FACTORS = {"uvw": "r k", "freq": "f", "wgt": "r f", "mask": "r f"}  # r rows, f channels


def _operands(kw: dict) -> list:
    """The factors of the keyword array operands, in their (sorted) order."""
    return [_FACTORS[k] for k in sorted(kw) if isinstance(kw[k], jax.ShapeDtypeStruct)]


def _dirty2vis_shard(dirty, **kw):
    """shard= rule: the image whole; rows and channels split."""
    return ", ".join(["x y"] + _operands(kw)) + " -> r f"


def _vis2dirty_shard(vis, **kw):
    """shard= rule: rows and channels summed over, the image whole."""
    return ", ".join(["r f"] + _operands(kw)) + " -> x y"


dirty2vis = ab.bind(
    _dirty2vis_fn, shape=_dirty2vis_spec, linear=True, name="ducc0_dirty2vis", out=True,
    shard=_dirty2vis_shard,
    examples=lambda: ((np.random.default_rng(1).normal(size=(32, 32)),),
                      dict(_setup(), do_wgridding=True)))
vis2dirty = ab.bind(
    _vis2dirty_fn, shape=_vis2dirty_spec, linear=True, name="ducc0_vis2dirty", out=True,
    shard=_vis2dirty_shard,
    examples=lambda: ((np.random.default_rng(1).normal(size=(6, 2)) + 1j,),
                      dict(_setup(), npix_x=32, npix_y=34)))


@dirty2vis.def_transpose(input_shapes=True, out=True)
def _dirty2vis_transpose(ct, *, out, input_shapes, **kw) -> None:
    """transpose: ȳ ↦ Re(Aᵀ·ȳ) = vis2dirty(conj ȳ); the image size comes from the input."""
    (dirty,) = input_shapes
    _vis2dirty_fn(np.conj(ct), out=out[0], npix_x=dirty.shape[0], npix_y=dirty.shape[1], **kw)


@vis2dirty.def_transpose(out=True)
def _vis2dirty_transpose(ct, *, out, npix_x: int, npix_y: int, **kw) -> None:
    """transpose: ȳ ↦ conj(A·ȳ) = conj(dirty2vis(ȳ))."""
    (vis,) = out
    _dirty2vis_fn(ct, out=vis, **kw)
    np.conjugate(vis, out=vis)


dirty2vis.__doc__ = """Dirty image ↦ visibilities (ducc0.wgridder.experimental.dirty2vis), linear.

``dirty2vis(dirty, *, uvw, freq, pixsize_x, pixsize_y, epsilon=None,
do_wgridding=False, nthreads=1, **ducc0_options)``: ``dirty`` real (npix_x,
npix_y), both even and ≥ 32; ``uvw`` (nrow, 3) in metres and ``freq`` (nchan,)
in Hz are non-differentiable array keywords; returns complex (nrow, nchan).
``epsilon`` defaults to 1e-10 (double) or 2e-5 (single). Transpose:
ȳ ↦ vis2dirty(conj ȳ).

>>> import numpy as np
>>> from anybind.contrib.ducc0 import dirty2vis
>>> img = np.zeros((32, 32)); img[16, 16] = 1.0   # a point source at the phase centre
>>> vis = dirty2vis(img, uvw=np.ones((3, 3)), freq=np.array([1e9]), pixsize_x=1e-4,
...                 pixsize_y=1e-4)
>>> bool(np.allclose(vis, 1.0))
True
"""
vis2dirty.__doc__ = """Visibilities ↦ dirty image (ducc0.wgridder.experimental.vis2dirty), linear.

``vis2dirty(vis, *, uvw, freq, npix_x, npix_y, pixsize_x, pixsize_y,
epsilon=None, do_wgridding=False, nthreads=1, **ducc0_options)``: the adjoint
of ``dirty2vis``; ``vis`` complex (nrow, nchan) ↦ real (npix_x, npix_y).
Transpose: ȳ ↦ conj(dirty2vis(ȳ)).

>>> import numpy as np
>>> from anybind.contrib.ducc0 import vis2dirty
>>> img = vis2dirty(np.ones((3, 1), complex), uvw=np.zeros((3, 3)), freq=np.array([1e9]),
...                 npix_x=32, npix_y=32, pixsize_x=1e-4, pixsize_y=1e-4)
>>> bool(np.allclose(img, 3.0))
True
"""
