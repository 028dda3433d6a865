"""SciPy bound into JAX: special functions and a sparse solve, derivatives of every order.

Every name here is an ``ab.Op`` with example inputs, so ``ab.check(op)`` and
``python -m anybind check anybind.contrib.scipy`` run without arguments.

- ``gammaln``, ``digamma``, ``polygamma(x, n=…)``, ``erfcx``: elementwise in x.
- ``jv``, ``yv``, ``iv``, ``kv`` ``(x, v=…)``: Bessel functions, differentiable in
  x; the order v is a number or a non-differentiable array.
- ``spsolve(data, b, indices=…, indptr=…, format="csr")``: x = A⁻¹b for a square
  sparse A, differentiable in A's stored values and in b, and linear in b
  (``jax.linear_transpose`` in b is the transposed solve). ``data``, ``indices``
  and ``indptr`` are SciPy's arrays of a ``format="csr"`` matrix (the default:
  ``indptr`` indexes rows) or a ``format="csc"`` one (columns); any other value
  is a ``ValueError``. ``b`` is (n,) or (n, k).

Each derivative rule is JAX code calling these ops again (polygamma n+1, the
Bessel orders v±1, another solve), which is what gives every order.

>>> import numpy as np, jax
>>> from anybind.contrib.scipy import gammaln
>>> float(jax.grad(jax.grad(gammaln))(np.float64(1.0)))      # ψ'(1) = π²/6
1.6449340668482266
"""
from __future__ import annotations

from . import require

require("scipy", "anybind.contrib.scipy")

from ._scipy_sparse import spsolve  # noqa: E402
from ._scipy_special import digamma, erfcx, gammaln, iv, jv, kv, polygamma, yv  # noqa: E402

__all__ = ["gammaln", "digamma", "polygamma", "erfcx", "jv", "yv", "iv", "kv", "spsolve"]
