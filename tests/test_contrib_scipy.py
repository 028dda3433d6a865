"""anybind.contrib.scipy against scipy's own values and derivatives, dense JAX solves
and finite differences; derivatives of every order where promised."""
from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, check_first_order, host_call_count, jvp_and_vjp, randn, tree_inner

special = pytest.importorskip("scipy.special")
sparse = pytest.importorskip("scipy.sparse")
sj = pytest.importorskip("anybind.contrib.scipy")

OPS = [name for name in sj.__all__ if isinstance(getattr(sj, name), ab.Op)]


@pytest.mark.slow  # ab.check's whole battery on every op; other tests here touch each module
@pytest.mark.parametrize("name", OPS)
def test_ab_check_passes_on_examples(name):
    report = ab.check(getattr(sj, name))
    skipped = [r for r in report.rows if r.status == "skipped"
               and r.note != "the rule splits no factor: the op runs whole"]
    assert report.ok and not skipped, str(report)


def test_docstring_examples_run():
    from anybind.contrib import _scipy_sparse, _scipy_special
    parser = doctest.DocTestParser()
    for obj in [sj, _scipy_sparse, _scipy_special, *[getattr(sj, n) for n in sj.__all__]]:
        name = getattr(obj, "name", getattr(obj, "__name__", repr(obj)))
        test = parser.get_doctest(obj.__doc__ or "", {}, name, None, 0)
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
        assert result.failed == 0, f"docstring example of {name} failed"


# ------------------------------------------------------------ special functions

X = np.linspace(0.4, 3.7, 6)


def _derivatives(f, n):
    """x ↦ [f, f', …, f⁽ⁿ⁾] elementwise by nested grad (vmapped), in one compiled program."""
    gs = [f]
    for _ in range(n):
        gs.append(jax.grad(gs[-1]))
    return jax.jit(lambda *a: [jax.vmap(g)(*a) for g in gs])


# (op, keywords, reference k-th derivative at X)
POLYGAMMA_FAMILY = [
    (sj.gammaln, {}, lambda k: special.gammaln(X) if k == 0 else special.polygamma(k - 1, X)),
    (sj.digamma, {}, lambda k: special.polygamma(k, X)),
    (sj.polygamma, {"n": 2}, lambda k: special.polygamma(k + 2, X)),
]


@pytest.mark.parametrize("op,kw,ref", POLYGAMMA_FAMILY, ids=["gammaln", "digamma", "polygamma"])
def test_polygamma_family_to_third_order(op, kw, ref):
    got = _derivatives(lambda x: op(x, **kw), 3)(X)
    assert_close(got, [ref(k) for k in range(4)], rtol=1e-12, atol=1e-12)


def _erfcx_derivatives(x, n):
    """dⁿ/dxⁿ erfcx, from the recurrence y' = 2xy − 2/√π differentiated symbolically."""
    y = special.erfcx(x)
    d1 = 2 * x * y - 2 / np.sqrt(np.pi)
    d2 = 2 * y + 2 * x * d1
    d3 = 4 * d1 + 2 * x * d2
    return [y, d1, d2, d3][n]


def test_erfcx_to_third_order_and_finite_differences():
    x = np.linspace(-1.5, 4.0, 6)
    assert_close(_derivatives(sj.erfcx, 3)(x), [_erfcx_derivatives(x, k) for k in range(4)],
                 rtol=1e-11, atol=1e-12)
    check_first_order(jax.jit(sj.erfcx), (x,))


BESSEL = [(sj.jv, special.jvp), (sj.yv, special.yvp), (sj.iv, special.ivp),
          (sj.kv, special.kvp)]


@pytest.mark.parametrize("op,deriv", BESSEL, ids=["jv", "yv", "iv", "kv"])
def test_bessel_to_third_order_against_scipy(op, deriv):
    value = getattr(special, op.name[len("scipy_"):])
    want = lambda v: [value(v, X)] + [deriv(v, X, k) for k in (1, 2, 3)]   # noqa: E731
    # a static order (a number: v ± 1 are static too), then an array of orders per point
    # that holds the integer, half-integer and negative orders (one compilation each)
    assert_close(_derivatives(lambda x: op(x, v=1.5), 3)(X), want(1.5), rtol=1e-10, atol=1e-12)
    v = np.array([0.0, 0.5, 1.5, 2.5, 3.0, -0.7])
    assert_close(_derivatives(lambda x, v: op(x, v=v), 3)(X, v), want(v), rtol=1e-10,
                 atol=1e-12)
    check_first_order(jax.jit(lambda x: op(x, v=v)), (X,))


def test_bessel_order_array_broadcasts_and_batches():
    v = np.array([[0.0], [1.0], [2.5]])                      # (3, 1) against x (6,)
    out = sj.jv(X, v=v)
    assert out.shape == (3, 6)
    assert_close(out, special.jv(v, X))
    jac = jax.jit(jax.jacfwd(lambda x: sj.jv(x, v=v)))(X)     # (3, 6, 6), diagonal in x
    assert_close(jnp.einsum("ijj->ij", jac), special.jvp(v, X))
    vs = np.array([0.5, 1.5, 2.0])
    assert_close(jax.vmap(lambda v: sj.iv(X, v=v))(vs), special.iv(vs[:, None], X))
    assert_close(jax.vmap(lambda x, v: sj.kv(x, v=v))(X, X - 1), special.kv(X - 1, X))
    assert_close(jax.vmap(lambda x: sj.yv(x, v=v))(np.stack([X, X + 1])),
                 np.stack([special.yv(v, X), special.yv(v, X + 1)]))
    grads = jax.jit(jax.vmap(jax.grad(lambda x, v: sj.jv(x, v=v)), in_axes=(0, None)))(X, 1.5)
    assert_close(grads, special.jvp(1.5, X))


def test_special_hessian_and_vmap_of_grad():
    loss = lambda x: jnp.sum(sj.gammaln(x) * sj.jv(x, v=1.0))         # noqa: E731
    h = jax.jit(jax.hessian(loss))(X)
    g1, j1 = special.gammaln(X), special.jv(1.0, X)
    gd, jd = special.digamma(X), special.jvp(1.0, X)
    want = special.polygamma(1, X) * j1 + 2 * gd * jd + g1 * special.jvp(1.0, X, 2)
    assert_close(h, np.diag(want), rtol=1e-10, atol=1e-12)
    assert_close(jax.vmap(jax.grad(sj.digamma))(X), special.polygamma(1, X))


def test_special_errors_name_the_op():
    with pytest.raises(TypeError, match="scipy_gammaln.*real floating"):
        sj.gammaln(np.arange(3))
    with pytest.raises(Exception, match="scipy_jv.*do not broadcast"):
        sj.jv(X, v=np.ones(4))
    with pytest.raises(TypeError, match="non-differentiable"):
        jax.grad(lambda v: sj.jv(np.float64(1.0), v=v))(np.float64(0.5))


# ---------------------------------------------------------------- sparse solve

def _system(n=6, seed=0, dtype=np.float64, fmt="csr"):
    """A random sparse, diagonally dominant matrix in ``fmt``, and its dense copy."""
    r = np.random.default_rng(seed)
    dense = np.where(r.uniform(size=(n, n)) < 0.35, r.normal(size=(n, n)), 0.0)
    dense = dense + np.diag(np.abs(dense).sum(1) + 1.0)
    if np.issubdtype(dtype, np.complexfloating):
        dense = dense * np.where(dense != 0, 1 + 0.5j, 0)
    a = (sparse.csr_matrix if fmt == "csr" else sparse.csc_matrix)(dense.astype(dtype))
    kw = dict(indices=a.indices.astype(np.int32), indptr=a.indptr.astype(np.int32), format=fmt)
    return a.data, kw, a


def _dense(data, a):
    """The dense matrix of ``data`` with a's sparsity, built with JAX (differentiable)."""
    coo = a.tocoo()                              # same order of stored values as a.data
    return jnp.zeros(a.shape, data.dtype).at[coo.row, coo.col].set(data)


def _host_dense(data, a):
    """The same dense matrix built on the host by scipy, for expected values."""
    return type(a)((np.asarray(data), a.indices, a.indptr), shape=a.shape).toarray()


# every pair of (format, dtype, right-hand side shape) occurs once
SPSOLVE_CASES = [("csr", np.float64, (6,)), ("csr", np.complex128, (6, 2)),
                 ("csc", np.float64, (6, 2)), ("csc", np.complex128, (6,))]


@pytest.mark.parametrize("fmt,dtype,rhs", SPSOLVE_CASES)
def test_spsolve_matches_dense_solve_with_derivatives(fmt, dtype, rhs):
    data, kw, a = _system(dtype=dtype, fmt=fmt)
    b = randn(rhs, dtype, seed=1)
    f = lambda d, b: sj.spsolve(d, b, **kw)                            # noqa: E731
    ref = lambda d, b: jnp.linalg.solve(_dense(d, a), b)          # noqa: E731
    assert_close(_dense(data, a), a.toarray())
    assert_close(f(data, b), np.linalg.solve(a.toarray(), b))
    dargs = (randn(data.shape, dtype, seed=2), randn(rhs, dtype, seed=3))
    xbar = randn(rhs, dtype, seed=4)
    ours, want = jvp_and_vjp([f, ref], (data, b), dargs, xbar)
    assert_close(ours, want)
    check_first_order(jax.jit(f), (data, b))


@pytest.mark.parametrize("fmt,dtype,rhs", SPSOLVE_CASES[1:3])
def test_spsolve_is_linear_in_b_and_transposes_into_the_transposed_solve(fmt, dtype, rhs):
    assert sj.spsolve.linear is False and sj.spsolve.linear_argnums == (1,)
    data, kw, a = _system(dtype=dtype, fmt=fmt)
    b, c = randn(rhs, dtype, seed=1), randn(rhs, dtype, seed=3)
    solve = lambda b: sj.spsolve(data, b, **kw)                        # noqa: E731
    assert_close(solve(2.0 * b - 3.0 * c), 2.0 * solve(b) - 3.0 * solve(c))
    xbar = randn(rhs, dtype, seed=2)
    (bbar,) = jax.linear_transpose(solve, b)(xbar)
    assert_close(bbar, np.linalg.solve(a.toarray().T, xbar))      # Aᵀ, not Aᴴ (JAX's pairing)
    np.testing.assert_allclose(tree_inner(bbar, b), tree_inner(xbar, solve(b)), rtol=1e-12)
    (bbar_jit,) = jax.jit(jax.linear_transpose(solve, b))(xbar)
    assert_close(bbar_jit, bbar)


def test_spsolve_transpose_in_b_under_vmap():
    data, kw, a = _system()
    b = randn((6,), seed=1)
    xbars = randn((4, 6), seed=2)
    datas = data + 0.1 * randn((4,) + data.shape, seed=6)

    def transposed(d, xbar):
        return jax.linear_transpose(lambda b: sj.spsolve(d, b, **kw), b)(xbar)[0]

    # one matrix, a batch of cotangents: one host call (one factorisation)
    shared = jax.jit(jax.vmap(transposed, (None, 0)))
    assert host_call_count(shared.lower(data, xbars)) == 1
    assert_close(shared(data, xbars), np.linalg.solve(a.toarray().T, xbars.T).T)
    # a batch of matrices and of cotangents
    want = [np.linalg.solve(_host_dense(d, a).T, x) for d, x in zip(datas, xbars)]
    assert_close(jax.vmap(transposed)(datas, xbars), np.stack(want))


def test_spsolve_linear_transpose_in_the_matrix_raises():
    data, kw, _ = _system()
    b = randn((6,), seed=1)
    message = (r"scipy_spsolve.*not declared linear in positional input leaf 0.*"
               r"declared linear in .*\(1,\) only")
    with pytest.raises(TypeError, match=message):
        jax.linear_transpose(lambda d: sj.spsolve(d, b, **kw), data)(b)
    with pytest.raises(TypeError, match=message):                       # jointly in both
        jax.linear_transpose(lambda d, b: sj.spsolve(d, b, **kw), data, b)(b)


def test_spsolve_second_order_and_vmap():
    data, kw, a = _system()
    b = randn((6,), seed=1)
    loss = lambda d, b: jnp.sum(jnp.sin(sj.spsolve(d, b, **kw)))        # noqa: E731
    ref = lambda d, b: jnp.sum(jnp.sin(jnp.linalg.solve(_dense(d, a), b)))  # noqa
    h, h_ref = jax.jit(lambda d, b: [jax.hessian(f, (0, 1))(d, b) for f in (loss, ref)])(
        data, b)
    assert_close(h, h_ref, rtol=1e-9, atol=1e-11)                # all four blocks
    bs = randn((4, 6), seed=5)
    datas = data + 0.1 * randn((4,) + data.shape, seed=6)
    solve = lambda d, b: sj.spsolve(d, b, **kw)                         # noqa: E731
    for in_axes, d, bb in (((None, 0), data, bs), ((0, None), datas, b), ((0, 0), datas, bs)):
        got = jax.vmap(solve, in_axes)(d, bb)
        want = [np.linalg.solve(_host_dense(d[i] if in_axes[0] == 0 else d, a),
                                bb[i] if in_axes[1] == 0 else bb) for i in range(4)]
        assert_close(got, np.stack(want))
    lowered = jax.jit(jax.vmap(solve, (None, 0))).lower(data, bs)
    assert host_call_count(lowered) == 1
    g = jax.jit(jax.vmap(jax.grad(loss), (0, None)))(datas, b)
    grad_ref = jax.jit(jax.grad(ref))                                   # a loop over the batch
    assert_close(g, np.stack([grad_ref(d, b) for d in datas]), rtol=1e-10, atol=1e-12)


def test_spsolve_errors_name_the_op_and_argument():
    data, kw, _ = _system()
    with pytest.raises(TypeError, match="scipy_spsolve.*share a floating"):
        sj.spsolve(data, np.ones(6, np.float32), **kw)
    with pytest.raises(Exception, match="scipy_spsolve.*b must have shape \\(6,\\)"):
        sj.spsolve(data, np.ones(5), **kw)
    with pytest.raises(Exception, match="format must be 'csr' or 'csc'"):
        sj.spsolve(data, np.ones(6), **dict(kw, format="coo"))
    singular = np.zeros_like(data)
    # a host error surfaces as a JAX runtime error (JaxRuntimeError or ValueError, depending
    # on the dispatch path) carrying ab.HostError's message; see /work/bugs.md
    with pytest.raises(Exception,
                       match="scipy_spsolve': the function raised RuntimeError.*singular"):
        jax.block_until_ready(sj.spsolve(singular, np.ones(6), **kw))
