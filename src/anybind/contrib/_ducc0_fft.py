"""ducc0's FFTs as linear ops: ``c2c``, ``r2c``, ``c2r`` and the Hartley transform.

Each transform is linear, so the op and its transpose give derivatives of
every order. JAX transposes complex-linear maps, it does not take adjoints:
the cotangent map of ẋ ↦ A·ẋ is ȳ ↦ Aᵀ·ȳ under the pairing ⟨a, b⟩ = Re Σ a·b.

- c2c: the DFT matrix F (any sign, any normalisation) is symmetric, Fᵀ = F, so
  c2c is its own transpose.
- Hartley: Re F − Im F is real and symmetric, so it is its own transpose.
- r2c (real n ↦ complex n//2+1 on the last transformed axis): ȳ ↦ Re(F_halfᵀ·ȳ)
  = c2r(W·ȳ) with the Hermitian weights W_k = 1 at k = 0 and k = n/2, ½ else,
  because c2r counts every interior frequency twice and keeps only Re of the
  k = 0 and k = n/2 terms.
- c2r (complex m ↦ real n): ȳ ↦ (2/W)·r2c(ȳ), the transpose of the same identity.

All take ``axes`` (a tuple; default all axes), ``forward``, ``inorm`` (0: none,
1: 1/√N, 2: 1/N) and ``nthreads`` as static keywords; ``vmap`` runs one ducc0
call on the whole batch (the batch axis is left out of ``axes``). ducc0 writes
every result straight into XLA's output buffer (``out=True`` and ducc0's ``out=``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require

ducc0 = require("ducc0", "anybind.contrib.ducc0")

__all__ = ["c2c", "r2c", "c2r", "hartley"]


@functools.lru_cache(maxsize=256)
def _axes(name: str, ndim: int, axes) -> tuple:
    """``axes`` as a tuple of distinct non-negative axes of an ``ndim``-array (cached:
    it runs on every call)."""
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"anybind op '{name}': axis {a} is out of range for an input "
                             f"with {ndim} dimensions")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out) or not out:
        raise ValueError(f"anybind op '{name}': axes must be distinct and not empty, got {axes}")
    return tuple(out)


def _check_dtype(name: str, x, kind: str) -> None:
    if not np.issubdtype(x.dtype, kind):
        what = "complex" if kind is np.complexfloating else "real floating"
        raise TypeError(f"anybind op '{name}': the input must be {what}, got {x.dtype}")


def _vmap_fft(name: str, fn: Callable) -> Callable:
    """In-place vmap rule: one ducc0 call, the batch axis (0) left out of the transformed axes."""
    def rule(size, in_batched, x, *, out, axes=None, **kw):
        del size, in_batched
        fn(x, out=out, axes=_shifted(name, x.ndim - 1, axes), **kw)
    return rule


def _shard_fft(name: str, last_changes: bool = False) -> Callable:
    """shard= rule: untransformed axes split, transformed axes whole (the last one changes
    length in r2c and c2r, so its input and output are different factors)."""
    def rule(x, *, axes=None, **_):
        ax = _axes(name, len(x.shape), axes)
        ins = [f"a{i}" for i in range(len(x.shape))]
        outs = [f"o{i}" if last_changes and i == ax[-1] else a for i, a in enumerate(ins)]
        return f"{' '.join(ins)} -> {' '.join(outs)}", tuple(ins[i] for i in ax)
    return rule


@functools.lru_cache(maxsize=256)
def _shifted(name: str, ndim: int, axes) -> tuple:
    return tuple(a + 1 for a in _axes(name, ndim, axes))


def _bind_fft(fn: Callable, spec: Callable, name: str, examples: Callable,
              last_changes: bool = False) -> ab.Op:
    """A linear op whose function and vmap rule write into XLA's buffers."""
    op = ab.bind(fn, shape=spec, linear=True, name=f"ducc0_{name}", examples=examples,
                 out=True, shard=_shard_fft(name, last_changes))
    op.def_vmap(_vmap_fft(name, fn), out=True)
    return op


def _complex(dtype) -> np.dtype:
    return np.result_type(dtype, np.complex64)


def _real(dtype) -> np.dtype:
    return np.finfo(dtype).dtype


def _hermitian_weights(n: int, m: int, dtype, ndim: int, axis: int):
    """W_k (k < m = n//2+1): 1 at k = 0 and k = n/2, ½ else, shaped to broadcast on ``axis``."""
    w = np.full(m, 0.5, dtype=dtype)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * ndim
    shape[axis] = m
    return jnp.asarray(w.reshape(shape))


# ------------------------------------------------------------------------ c2c

def _c2c_fn(x, *, out, axes=None, forward: bool = True, inorm: int = 0, nthreads: int = 1):
    """Host function of ``c2c``: out = F·x with F_jk = exp(∓2πi jk/N) / N^(inorm/2)."""
    ducc0.fft.c2c(x, out=out, axes=_axes("c2c", x.ndim, axes), forward=forward, inorm=inorm,
                  nthreads=nthreads)


def _c2c_spec(x, *, axes=None, **_):
    _check_dtype("c2c", x, np.complexfloating)
    _axes("c2c", len(x.shape), axes)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _example_c2c():
    r = np.random.default_rng(0)
    return (r.normal(size=(4, 6)) + 1j * r.normal(size=(4, 6)),), {"axes": (1,), "inorm": 1}


c2c = _bind_fft(_c2c_fn, _c2c_spec, "c2c", _example_c2c)


@c2c.def_transpose(traced=True)
def _c2c_transpose(ct, **kw):
    """transpose: ȳ ↦ Fᵀ·ȳ = F·ȳ (the DFT matrix is symmetric)."""
    return (c2c(ct, **kw),)


c2c.__doc__ = """Complex FFT over ``axes`` (ducc0.fft.c2c), a linear op.

``c2c(x, *, axes=None, forward=True, inorm=0, nthreads=1)``; ``x`` complex.
Transpose: itself (Fᵀ = F). Derivatives of every order.

>>> import numpy as np, jax.numpy as jnp
>>> from anybind.contrib.ducc0 import c2c
>>> x = np.arange(4.0) + 1j
>>> bool(jnp.allclose(c2c(x), jnp.fft.fft(x)))
True
"""

# ----------------------------------------------------------------- r2c, c2r


def _r2c_fn(x, *, out, axes=None, forward: bool = True, inorm: int = 0, nthreads: int = 1):
    """Host function of ``r2c``: the first n//2+1 rows of F·x on the last transformed axis."""
    ducc0.fft.r2c(x, out=out, axes=_axes("r2c", x.ndim, axes), forward=forward, inorm=inorm,
                  nthreads=nthreads)


def _r2c_spec(x, *, axes=None, **_):
    _check_dtype("r2c", x, np.floating)
    ax = _axes("r2c", len(x.shape), axes)[-1]
    shape = list(x.shape)
    shape[ax] = x.shape[ax] // 2 + 1
    return jax.ShapeDtypeStruct(tuple(shape), _complex(x.dtype))


def _c2r_fn(x, *, out, lastsize: int | None = None, axes=None, forward: bool = True,
            inorm: int = 0, nthreads: int = 1):
    """Host function of ``c2r``."""
    ax = _axes("c2r", x.ndim, axes)
    n = 2 * (x.shape[ax[-1]] - 1) if lastsize is None else lastsize
    ducc0.fft.c2r(x, out=out, axes=ax, lastsize=n, forward=forward, inorm=inorm,
                  nthreads=nthreads)


def _c2r_spec(x, *, lastsize: int | None = None, axes=None, **_):
    _check_dtype("c2r", x, np.complexfloating)
    ax = _axes("c2r", len(x.shape), axes)[-1]
    m = x.shape[ax]
    n = 2 * (m - 1) if lastsize is None else lastsize
    if n < 1 or n // 2 + 1 != m:
        raise ValueError(f"anybind op 'c2r': lastsize={lastsize} does not fit an input of "
                         f"length {m} along axis {ax}; it must be {2 * m - 2} or {2 * m - 1}")
    shape = list(x.shape)
    shape[ax] = n
    return jax.ShapeDtypeStruct(tuple(shape), _real(x.dtype))


r2c = _bind_fft(_r2c_fn, _r2c_spec, "r2c",
                lambda: ((np.random.default_rng(0).normal(size=(4, 5)),), {"axes": (1,)}),
                last_changes=True)
c2r = _bind_fft(_c2r_fn, _c2r_spec, "c2r",
                lambda: ((_example_c2c()[0][0][:3, :4],), {"axes": (1,), "lastsize": 7}),
                last_changes=True)


@r2c.def_transpose(traced=True, input_shapes=True)
def _r2c_transpose(ct, *, input_shapes, axes=None, **kw):
    """transpose: ȳ ↦ Re(F_halfᵀ·ȳ) = c2r(W·ȳ), W the Hermitian weights.

    The output length n//2+1 does not tell n, so the rule reads it from the input shape.
    """
    (x,) = input_shapes
    ax = _axes("r2c", ct.ndim, axes)
    n = x.shape[ax[-1]]
    w = _hermitian_weights(n, ct.shape[ax[-1]], _real(ct.dtype), ct.ndim, ax[-1])
    return (c2r(ct * w, lastsize=n, axes=ax, **kw),)


@c2r.def_transpose(traced=True)
def _c2r_transpose(ct, *, lastsize: int | None = None, axes=None, **kw):
    """transpose: ȳ ↦ (2/W)·r2c(ȳ): interior frequencies count twice in a real output."""
    ax = _axes("c2r", ct.ndim, axes)
    n = ct.shape[ax[-1]]
    w = _hermitian_weights(n, n // 2 + 1, _real(ct.dtype), ct.ndim, ax[-1])
    return (r2c(ct, axes=ax, **kw) * (1 / w),)


r2c.__doc__ = """Real-to-complex FFT over ``axes`` (ducc0.fft.r2c), a linear op.

``r2c(x, *, axes=None, forward=True, inorm=0, nthreads=1)``; ``x`` real; the
last axis in ``axes`` shrinks from n to n//2+1. Transpose: ȳ ↦ c2r(W·ȳ) with
the Hermitian weights W. Derivatives of every order.

>>> import numpy as np, jax.numpy as jnp
>>> from anybind.contrib.ducc0 import r2c
>>> x = np.arange(5.0)
>>> bool(jnp.allclose(r2c(x), jnp.fft.rfft(x)))
True
"""
c2r.__doc__ = """Complex-to-real FFT over ``axes`` (ducc0.fft.c2r), a linear op.

``c2r(x, *, lastsize=None, axes=None, forward=True, inorm=0, nthreads=1)``;
``x`` complex of length m on the last axis in ``axes``, which becomes
``lastsize`` (2m−2 by default, or 2m−1). As numpy's irfft with ``forward=False,
inorm=2``. Transpose: ȳ ↦ (2/W)·r2c(ȳ). Derivatives of every order.

>>> import numpy as np, jax.numpy as jnp
>>> from anybind.contrib.ducc0 import c2r
>>> y = np.fft.rfft(np.arange(5.0))
>>> bool(jnp.allclose(c2r(y, lastsize=5, forward=False, inorm=2), jnp.arange(5.0)))
True
"""

# -------------------------------------------------------------------- Hartley


def _hartley_fn(x, *, out, axes=None, inorm: int = 0, nthreads: int = 1):
    """Host function of ``hartley``: Re(F·x) − Im(F·x), F the forward DFT over ``axes``."""
    ducc0.fft.genuine_fht(x, out=out, axes=_axes("hartley", x.ndim, axes), inorm=inorm,
                          nthreads=nthreads)


def _hartley_spec(x, *, axes=None, **_):
    _check_dtype("hartley", x, np.floating)
    _axes("hartley", len(x.shape), axes)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


hartley = _bind_fft(_hartley_fn, _hartley_spec, "hartley",
                    lambda: ((np.random.default_rng(0).normal(size=(4, 6)),), {"axes": (1,)}))


@hartley.def_transpose(traced=True)
def _hartley_transpose(ct, **kw):
    """transpose: ȳ ↦ Hᵀ·ȳ = H·ȳ (H = Re F − Im F is symmetric)."""
    return (hartley(ct, **kw),)


hartley.__doc__ = """Full Hartley transform over ``axes`` (ducc0.fft.genuine_fht), a linear op.

``hartley(x, *, axes=None, inorm=0, nthreads=1)``; ``x`` real; the result is
Re(F·x) − Im(F·x) for the forward multi-dimensional DFT F. Its own transpose.

>>> import numpy as np, jax.numpy as jnp
>>> from anybind.contrib.ducc0 import hartley
>>> x = np.arange(4.0)
>>> f = jnp.fft.fft(x)
>>> bool(jnp.allclose(hartley(x), f.real - f.imag))
True
"""
