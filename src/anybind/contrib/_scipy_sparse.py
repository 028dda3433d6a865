"""A sparse linear solve x = A⁻¹b, differentiable in b and in A's stored values.

A is square and given by ``data`` (its stored values, differentiable) and the
non-differentiable integer arrays ``indices`` and ``indptr`` of a CSR (rows)
or CSC (columns) matrix, ``format`` static. The same three arrays read in the
other format are Aᵀ, so the transposed solve is the same op with the format
flipped. With Ȧ the matrix of the tangent values ḋ (same sparsity):

  jvp:  ẋ = A⁻¹(ḃ − Ȧ·x)
  vjp:  b̄ = A⁻ᵀ·x̄,   d̄_k = −b̄[row_k]·x[col_k]     (JAX's convention: no conjugation)

Both rules are JAX code calling ``spsolve`` again (x is recomputed, one extra
solve), so derivatives of every order follow. ``b`` may be (n,) or (n, k).
The op is linear in b given the matrix (``linear=(1,)``), so
``jax.linear_transpose`` in b works: it is the transposed solve b̄ = A⁻ᵀ·x̄.
Under ``vmap`` with one matrix, A is factorised once and all right-hand sides
are solved together; a batch of matrices loops in one host call.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

from . import require

sparse = require("scipy.sparse", "anybind.contrib.scipy")
require("scipy.sparse.linalg", "anybind.contrib.scipy")

__all__ = ["spsolve"]

_FLIP = {"csr": "csc", "csc": "csr"}


def _factor(data, indices, indptr, format: str):
    n = indptr.shape[0] - 1
    cls = sparse.csr_matrix if format == "csr" else sparse.csc_matrix
    a = cls((np.array(data), np.array(indices), np.array(indptr)), shape=(n, n))
    return sparse.linalg.splu(a.tocsc())


def _spsolve_fn(data, b, *, indices, indptr, format: str = "csr"):
    """Host function: x = A⁻¹b with a sparse LU factorisation (SuperLU)."""
    return _factor(data, indices, indptr, format).solve(np.array(b))


def _vmap_solve(size, in_batched, data, b, *, indices, indptr, format: str = "csr"):
    """One factorisation for all right-hand sides when the matrix is not batched."""
    if not (in_batched[0] or any(in_batched.kwargs.values())):
        rhs = np.moveaxis(b, 0, -1)                            # (n, ..., batch)
        x = _factor(data, indices, indptr, format).solve(rhs.reshape(rhs.shape[0], -1))
        return np.moveaxis(x.reshape(rhs.shape), -1, 0), True
    pick = lambda a, batched, i: a[i] if batched else a     # noqa: E731
    kb = in_batched.kwargs
    return np.stack([_spsolve_fn(pick(data, in_batched[0], i), pick(b, in_batched[1], i),
                                 indices=pick(indices, kb["indices"], i),
                                 indptr=pick(indptr, kb["indptr"], i), format=format)
                     for i in range(size)]), True


def _spec(data, b, *, indices, indptr, format: str = "csr"):
    if format not in _FLIP:
        raise ValueError(f"anybind op 'spsolve': format must be 'csr' or 'csc', got {format!r}")
    if not np.issubdtype(data.dtype, np.inexact) or data.dtype != b.dtype:
        raise TypeError(f"anybind op 'spsolve': data and b must share a floating or complex "
                        f"dtype, got {data.dtype} and {b.dtype}")
    if not (np.issubdtype(indices.dtype, np.integer) and np.issubdtype(indptr.dtype, np.integer)):
        raise TypeError(f"anybind op 'spsolve': indices and indptr must be integer arrays, got "
                        f"{indices.dtype} and {indptr.dtype}")
    n = indptr.shape[0] - 1
    if len(data.shape) != 1 or indices.shape != data.shape or len(indptr.shape) != 1:
        raise ValueError(f"anybind op 'spsolve': data and indices must be 1-d of equal length "
                         f"and indptr 1-d, got {tuple(data.shape)}, {tuple(indices.shape)}, "
                         f"{tuple(indptr.shape)}")
    if len(b.shape) not in (1, 2) or b.shape[0] != n:
        raise ValueError(f"anybind op 'spsolve': b must have shape ({n},) or ({n}, k) for a "
                         f"{n}×{n} matrix, got {tuple(b.shape)}")
    return jax.ShapeDtypeStruct(b.shape, b.dtype)


def _example():
    """A 5×5 diagonally dominant CSR matrix with 13 stored values."""
    dense = np.diag([4.0, 5.0, 6.0, 5.0, 4.0]) + np.diag([1.0, -1.0, 0.5, 1.0], 1) \
        + np.diag([0.5, 1.0, -1.0, 2.0], -1)
    a = sparse.csr_matrix(dense)
    return ((a.data, np.linspace(1.0, 2.0, 5)),
            {"indices": a.indices.astype(np.int32), "indptr": a.indptr.astype(np.int32)})


def _shard(data, b, **_):
    """shard= rule: a sparse solve couples every unknown, so everything stays whole."""
    rhs = "n k" if len(b.shape) == 2 else "n"
    return f"z, {rhs}, z, p -> {rhs}", ("z", "n", "p") + (("k",) if len(b.shape) == 2 else ())


spsolve = ab.bind(_spsolve_fn, shape=_spec, linear=(1,), vmap=_vmap_solve,
                  name="scipy_spsolve", examples=_example, shard=_shard)


def _compressed_index_fn(indices, indptr):
    """Host function: the row (CSR) or column (CSC) of every stored value.

    An integer function of the sparsity pattern, so it needs no derivatives; on
    the host it is one call in the rules' programs, where a search over indptr
    in JAX is a loop that makes every derivative program slower to compile.
    """
    return np.repeat(np.arange(indptr.shape[0] - 1, dtype=indptr.dtype), np.diff(indptr))


_compressed_index = ab.bind(
    _compressed_index_fn, name="scipy_spsolve_compressed_index",
    shape=lambda indices, indptr: jax.ShapeDtypeStruct(indices.shape, indptr.dtype))


def _rows_cols(indices, indptr, format: str):
    """Row and column of every stored value."""
    ptr = _compressed_index(indices, indptr)
    return (ptr, indices) if format == "csr" else (indices, ptr)


def _per_entry(d, ndim: int):
    return jnp.reshape(d, d.shape + (1,) * (ndim - 1))


@spsolve.def_jvp(traced=True, symbolic_zeros=True)
def _spsolve_jvp(primals, tangents, *, indices, indptr, format: str = "csr"):
    """jvp: (d, b; ḋ, ḃ) ↦ A⁻¹(ḃ − Ȧ·x), x = A⁻¹b."""
    (data, b), (dd, db) = primals, tangents
    kw = dict(indices=indices, indptr=indptr, format=format)
    if dd is None and db is None:
        return None
    rhs = db
    if dd is not None:
        x = spsolve(data, b, **kw)
        rows, cols = _rows_cols(indices, indptr, format)
        adot_x = jax.ops.segment_sum(_per_entry(dd, b.ndim) * x[cols], rows,
                                     num_segments=b.shape[0])
        rhs = -adot_x if rhs is None else rhs - adot_x
    return spsolve(data, rhs, **kw)


@spsolve.def_vjp(traced=True, symbolic_zeros=True)
def _spsolve_vjp(primals, ct, *, needs, indices, indptr, format: str = "csr"):
    """vjp: x̄ ↦ (−b̄[row_k]·x[col_k] for each stored k, b̄ = A⁻ᵀ·x̄)."""
    data, b = primals
    if ct is None or not any(needs):
        return None, None
    bbar = spsolve(data, ct, indices=indices, indptr=indptr, format=_FLIP[format])
    dbar = None
    if needs[0]:
        x = spsolve(data, b, indices=indices, indptr=indptr, format=format)
        rows, cols = _rows_cols(indices, indptr, format)
        prod = -bbar[rows] * x[cols]
        dbar = prod if prod.ndim == 1 else prod.sum(axis=tuple(range(1, prod.ndim)))
    return dbar, bbar if needs[1] else None


spsolve.__doc__ = """Sparse linear solve x = A⁻¹b (scipy.sparse.linalg.splu), differentiable.

``spsolve(data, b, *, indices, indptr, format="csr")``: A square, given by
its stored values ``data`` (differentiable) and the integer arrays
``indices``, ``indptr`` of a CSR or CSC matrix; ``b`` (n,) or (n, k) with
data's dtype (real or complex). Derivatives of every order in data and b;
linear in b (``linear=(1,)``), so ``jax.linear_transpose`` in b gives the
transposed solve A⁻ᵀ·x̄ (no conjugation, JAX's convention).

>>> import numpy as np, scipy.sparse
>>> from anybind.contrib.scipy import spsolve
>>> a = scipy.sparse.csr_matrix(np.array([[2.0, 1.0], [0.0, 4.0]]))
>>> spsolve(a.data, np.array([3.0, 4.0]), indices=a.indices, indptr=a.indptr).tolist()
[1.0, 1.0]
"""
