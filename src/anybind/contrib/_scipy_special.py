"""SciPy special functions with derivatives of every order.

Each op is a host call of ``scipy.special`` whose JVP rule is JAX code calling
another op of the family, so JAX can differentiate the rule again:

  gammaln' = digamma,   digamma' = polygamma(·, n=1),   polygamma(·, n)' = polygamma(·, n+1)
  erfcx'(x) = 2x·erfcx(x) − 2/√π
  J_v' = (J_{v−1} − J_{v+1})/2,   Y_v' = (Y_{v−1} − Y_{v+1})/2
  I_v' = (I_{v−1} + I_{v+1})/2,   K_v' = −(K_{v−1} + K_{v+1})/2

The VJP is the JAX transpose of the (linear in ẋ) JVP rule. The argument x is
real floating and differentiable; the Bessel order ``v`` is a number (static)
or an array (a non-differentiable operand broadcast against x); polygamma's
``n`` is a static non-negative int. Results have x's dtype. ``vmap`` is one
host call on the batched arrays.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require

special = require("scipy.special", "anybind.contrib.scipy")

__all__ = ["gammaln", "digamma", "polygamma", "erfcx", "jv", "yv", "iv", "kv"]


def _spec(name: str) -> Callable:
    def spec(x, **kw):
        if not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"anybind op '{name}': x must be real floating, got {x.dtype}")
        shapes = [x.shape]
        for key, a in kw.items():
            if hasattr(a, "shape"):
                if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(
                        a.dtype, np.integer):
                    raise TypeError(f"anybind op '{name}': {key} must be real, got {a.dtype}")
                shapes.append(a.shape)
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(f"anybind op '{name}': the shapes of x and "
                             f"{[k for k in kw if hasattr(kw[k], 'shape')]} do not broadcast: "
                             f"{shapes}") from None
        return jax.ShapeDtypeStruct(shape, x.dtype)
    return spec


def _host(fn: Callable) -> Callable:
    def run(x, **kw):
        return np.asarray(fn(x, **kw), dtype=x.dtype)
    run.__name__ = getattr(fn, "__name__", "special")
    return run


def _vmap_elementwise(fn: Callable) -> Callable:
    """vmap rule: each batched array's batch axis goes in front of the broadcast shape."""
    def rule(size, in_batched, x, **kw):
        kw = dict(kw)
        batched = {"x": bool(in_batched[0]), **{k: bool(b) for k, b in in_batched.kwargs.items()}}
        arrays = {"x": x, **{k: kw[k] for k in in_batched.kwargs}}
        nd = max(a.ndim - batched[k] for k, a in arrays.items())
        for k, a in arrays.items():
            if batched[k]:
                arrays[k] = a.reshape((size,) + (1,) * (nd - a.ndim + 1) + a.shape[1:])
        kw.update({k: a for k, a in arrays.items() if k != "x"})
        return fn(arrays["x"], **kw), True
    return rule


def _shard(x, **kw):
    """shard= rule: elementwise with broadcasting; an operand's length-1 (broadcast) axis
    is a factor of its own, so only the full-length axes split."""
    arrays = [x] + [kw[k] for k in sorted(kw) if isinstance(kw[k], jax.ShapeDtypeStruct)]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if not shape:
        return "elementwise"

    def names(i, a):
        off = len(shape) - len(a.shape)
        return " ".join(f"d{off + j}" if n == shape[off + j] else f"u{i}_{j}"
                        for j, n in enumerate(a.shape))
    out = " ".join(f"d{j}" for j in range(len(shape)))
    return ", ".join(names(i, a) for i, a in enumerate(arrays)) + " -> " + out


def _elementwise(fn: Callable, name: str, example: Callable, derivative: Callable) -> ab.Op:
    """Bind ``fn(x, **kw)`` with the traced jvp (x, ẋ) ↦ derivative(x, **kw)·ẋ."""
    host = _host(fn)
    op = ab.bind(host, shape=_spec(name), vmap=_vmap_elementwise(host), name=f"scipy_{name}",
                 examples=example, shard=_shard)

    @op.def_jvp(traced=True)
    def _jvp(primals, tangents, **kw):
        (x,), (dx,) = primals, tangents
        d = derivative(x, **kw)
        return d * jnp.broadcast_to(dx, d.shape)
    _jvp.__doc__ = f"jvp: (x, ẋ) ↦ {name}'(x)·ẋ, {name}' written with ops of this family."
    return op


def _points(lo: float = 0.3, hi: float = 4.0, n: int = 5):
    return lambda **kw: ((np.linspace(lo, hi, n),), kw)


gammaln = _elementwise(special.gammaln, "gammaln", _points(),
                       lambda x: digamma(x))
digamma = _elementwise(special.digamma, "digamma", _points(),
                       lambda x: polygamma(x, n=1))
polygamma = _elementwise(lambda x, *, n: special.polygamma(n, x), "polygamma",
                         lambda: _points()(n=2),
                         lambda x, *, n: polygamma(x, n=n + 1))
erfcx = _elementwise(special.erfcx, "erfcx", lambda: ((np.linspace(-1.5, 3.0, 5),), {}),
                     lambda x: 2 * x * erfcx(x) - 2 / math.sqrt(math.pi))


def _bessel(fn: Callable, name: str, sign_lo: float, sign_hi: float) -> ab.Op:
    """d/dx C_v = (sign_lo·C_{v−1} + sign_hi·C_{v+1}) / 2 for the Bessel family C."""
    def deriv(x, *, v):
        return (sign_lo * op(x, v=v - 1) + sign_hi * op(x, v=v + 1)) / 2

    def example():
        return (np.linspace(0.4, 4.0, 5),), {"v": np.array([0.0, 0.5, 1.0, 2.5, -0.7])}

    op = _elementwise(lambda x, *, v: fn(v, x), name, example, deriv)
    return op


jv = _bessel(special.jv, "jv", 1.0, -1.0)
yv = _bessel(special.yv, "yv", 1.0, -1.0)
iv = _bessel(special.iv, "iv", 1.0, 1.0)
kv = _bessel(special.kv, "kv", -1.0, -1.0)

_DOCS = {
    "gammaln": ("log|Γ(x)|", "gammaln(x)", "float(gammaln(np.float64(5.0)))", "3.17805383..."),
    "digamma": ("ψ(x) = Γ'(x)/Γ(x)", "digamma(x)", "float(digamma(np.float64(1.0)))",
                "-0.57721566..."),
    "polygamma": ("ψ⁽ⁿ⁾(x), the n-th derivative of digamma", "polygamma(x, *, n)",
                  "float(polygamma(np.float64(1.0), n=1))", "1.64493406..."),
    "erfcx": ("exp(x²)·erfc(x)", "erfcx(x)", "float(erfcx(np.float64(0.0)))", "1.0"),
    "jv": ("the Bessel function J_v(x)", "jv(x, *, v)", "float(jv(np.float64(0.0), v=0.0))",
           "1.0"),
    "yv": ("the Bessel function Y_v(x)", "yv(x, *, v)", "float(yv(np.float64(1.0), v=0.0))",
           "0.08825696..."),
    "iv": ("the modified Bessel function I_v(x)", "iv(x, *, v)",
           "float(iv(np.float64(0.0), v=0.0))", "1.0"),
    "kv": ("the modified Bessel function K_v(x)", "kv(x, *, v)",
           "float(kv(np.float64(1.0), v=0.5))", "0.46106850..."),
}
for _name, (_what, _sig, _call, _out) in _DOCS.items():
    globals()[_name].__doc__ = f"""{_what} (scipy.special.{_name}), derivatives of every order.

``{_sig}``: elementwise in x (real floating, differentiable). Note the
argument order: x first; orders are keywords.

>>> import numpy as np
>>> from anybind.contrib.scipy import {_name}
>>> {_call}  # doctest: +ELLIPSIS
{_out}
"""
