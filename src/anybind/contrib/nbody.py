"""Direct-summation gravity as compiled code: a Numba kernel with compiled derivative rules.

``accelerations(x, m)`` gives every body's acceleration from positions ``x``
(float64[n, 3]) and masses ``m`` (float64[n]), with Plummer softening ε:

    a_i = Σ_j m_j·d_ij / s_ij³,   d_ij = x_j − x_i,   s_ij² = |d_ij|² + ε²

Its three kernels are Numba ``@cfunc``s of anybind's C calling convention, so
the op, its jvp and its vjp run as XLA FFI calls with no Python and no GIL:

- jvp:  ȧ_i = Σ_j ṁ_j·d/s³ + m_j·(ḋ/s³ − 3(d·ḋ)·d/s⁵),   ḋ = ẋ_j − ẋ_i
- vjp:  with d̄ = m_j·(ā_i/s³ − 3(d·ā_i)·d/s⁵):  x̄_j += d̄,  x̄_i −= d̄,  m̄_j += d·ā_i/s³

Under ``vmap`` the shim loops over the batch inside one FFI call. Derivatives
are first order (the rules are compiled code, which JAX cannot differentiate).

>>> import numpy as np, jax
>>> from anybind.contrib.nbody import accelerations, accelerations_ref
>>> x, m = np.random.default_rng(0).normal(size=(5, 3)), np.ones(5)
>>> bool(np.allclose(accelerations(x, m), accelerations_ref(x, m)))
True
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require

numba = require("numba", "anybind.contrib.nbody")

SOFTENING = 0.05
_EPS2 = SOFTENING**2
_MESSAGE = np.frombuffer(b"accelerations expects x float64[n, 3] and m float64[n]\0", np.uint8)

__all__ = ["accelerations", "accelerations_ref", "SOFTENING"]


@numba.njit(inline="always")
def _checked(shapes, ranks, dtypes, n_in, n_out, err, err_size) -> bool:
    """Operands are x[n, 3], m[n] (then tangents or cotangents of the same), all float64."""
    n = shapes[0][0]
    for i in range(n_in + n_out):
        if dtypes[i] != 12 or ranks[i] < 1 or ranks[i] > 2 or shapes[i][0] != n:
            break
        if ranks[i] == 2 and shapes[i][1] != 3:
            break
    else:
        return True
    for k in range(min(err_size, _MESSAGE.size)):
        err[k] = _MESSAGE[k]
    return False


@numba.cfunc(ab.numba_signature(), cache=True)
def _accel(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    if not _checked(shapes, ranks, dtypes, n_in, n_out, err, err_size):
        return 1
    n = shapes[0][0]
    x = numba.carray(ins[0], (n, 3), np.float64)
    m = numba.carray(ins[1], n, np.float64)
    a = numba.carray(outs[0], (n, 3), np.float64)
    for i in range(n):
        a0 = a1 = a2 = 0.0
        for j in range(n):
            d0, d1, d2 = x[j, 0] - x[i, 0], x[j, 1] - x[i, 1], x[j, 2] - x[i, 2]
            s2 = d0 * d0 + d1 * d1 + d2 * d2 + _EPS2
            w = m[j] / (s2 * np.sqrt(s2))
            a0 += w * d0
            a1 += w * d1
            a2 += w * d2
        a[i, 0], a[i, 1], a[i, 2] = a0, a1, a2
    return 0


@numba.cfunc(ab.numba_signature(), cache=True)
def _accel_jvp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    if not _checked(shapes, ranks, dtypes, n_in, n_out, err, err_size):
        return 1
    n = shapes[0][0]
    x = numba.carray(ins[0], (n, 3), np.float64)
    m = numba.carray(ins[1], n, np.float64)
    dx = numba.carray(ins[2], (n, 3), np.float64)
    dm = numba.carray(ins[3], n, np.float64)
    t = numba.carray(outs[0], (n, 3), np.float64)
    for i in range(n):
        t0 = t1 = t2 = 0.0
        for j in range(n):
            d0, d1, d2 = x[j, 0] - x[i, 0], x[j, 1] - x[i, 1], x[j, 2] - x[i, 2]
            e0, e1, e2 = dx[j, 0] - dx[i, 0], dx[j, 1] - dx[i, 1], dx[j, 2] - dx[i, 2]
            s2 = d0 * d0 + d1 * d1 + d2 * d2 + _EPS2
            inv3 = 1.0 / (s2 * np.sqrt(s2))
            c = 3.0 * m[j] * (d0 * e0 + d1 * e1 + d2 * e2) * inv3 / s2
            u = dm[j] * inv3
            v = m[j] * inv3
            t0 += u * d0 + v * e0 - c * d0
            t1 += u * d1 + v * e1 - c * d1
            t2 += u * d2 + v * e2 - c * d2
        t[i, 0], t[i, 1], t[i, 2] = t0, t1, t2
    return 0


@numba.cfunc(ab.numba_signature(), cache=True)
def _accel_vjp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    if not _checked(shapes, ranks, dtypes, n_in, n_out, err, err_size):
        return 1
    n = shapes[0][0]
    x = numba.carray(ins[0], (n, 3), np.float64)
    m = numba.carray(ins[1], n, np.float64)
    g = numba.carray(ins[2], (n, 3), np.float64)
    xb = numba.carray(outs[0], (n, 3), np.float64)
    mb = numba.carray(outs[1], n, np.float64)
    xb[:] = 0.0
    mb[:] = 0.0
    for i in range(n):
        for j in range(n):
            d0, d1, d2 = x[j, 0] - x[i, 0], x[j, 1] - x[i, 1], x[j, 2] - x[i, 2]
            s2 = d0 * d0 + d1 * d1 + d2 * d2 + _EPS2
            inv3 = 1.0 / (s2 * np.sqrt(s2))
            dg = d0 * g[i, 0] + d1 * g[i, 1] + d2 * g[i, 2]
            mb[j] += dg * inv3
            c = 3.0 * m[j] * dg * inv3 / s2
            b0 = m[j] * inv3 * g[i, 0] - c * d0
            b1 = m[j] * inv3 * g[i, 1] - c * d1
            b2 = m[j] * inv3 * g[i, 2] - c * d2
            xb[j, 0] += b0
            xb[j, 1] += b1
            xb[j, 2] += b2
            xb[i, 0] -= b0
            xb[i, 1] -= b1
            xb[i, 2] -= b2
    return 0


def _examples():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(16, 3)), rng.uniform(0.5, 1.5, size=16)), {}


def _spec(x, m):
    """The output spec, which also checks the inputs when the program is traced."""
    n = x.shape[0] if len(x.shape) == 2 else -1
    if x.shape != (n, 3) or m.shape != (n,) or x.dtype != np.float64 or m.dtype != np.float64:
        raise TypeError(f"accelerations expects x float64[n, 3] and m float64[n], got "
                        f"{x.dtype}{list(x.shape)} and {m.dtype}{list(m.shape)}")
    return x


accelerations = ab.bind(_accel, shape=_spec, jvp=_accel_jvp, vjp=_accel_vjp,
                        name="nbody_accelerations", examples=_examples)


def accelerations_ref(x, m):
    """The same sum in plain ``jax.numpy`` (O(n²) memory), for comparison."""
    d = x[None, :, :] - x[:, None, :]
    s2 = jnp.sum(d * d, axis=-1) + _EPS2
    return jnp.einsum("ij,ijk->ik", m[None, :] / (s2 * jnp.sqrt(s2)), d)
