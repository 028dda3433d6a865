"""linear=True ops: the function and its transpose alone give derivatives of
every order, transposes of transposes, and batched transposes.

Ops: a matvec with the matrix as a keyword operand, an unnormalised complex
FFT (its own transpose under JAX's convention: the DFT matrix is symmetric
and complex maps transpose without conjugation), and a two-argument linear
map, host or traced, with a transpose rule or without one (traced: JAX
transposes the function).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import (
    assert_tree_close,
    check_transpose_identity,
    randn,
    realify,
    tree_inner,
    tree_randn_like,
)
from ops import LINEAR_CASES, VMAP_MODES, fft

NAMES = list(LINEAR_CASES)
TOL = dict(rtol=1e-10, atol=1e-10)


def _realify(case):
    """The case's args as a function of one real vector (see ``helpers.realify``)."""
    return realify(case.args())


def _sq_loss(f, build):
    """Σ|f(args(v))|², a real scalar of a real vector."""
    return lambda v: sum(jnp.sum(jnp.abs(o) ** 2) for o in jax.tree.leaves(f(*build(v))))


# ----------------------------------------------------------- derivatives

@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_jvp_is_the_op_itself(name, mode):
    case = LINEAR_CASES[name]
    args, t = case.args(), tree_randn_like(case.args(), seed=3)
    out, tangent = jax.jvp(case.op(mode), args, t)
    assert_tree_close(out, case.reference()(*args), **TOL)
    assert_tree_close(tangent, case.reference()(*t), **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_grad_and_hessian_of_sum_of_squares(name, mode):
    case = LINEAR_CASES[name]
    v, build = _realify(case)
    f, ref = _sq_loss(case.op(mode), build), _sq_loss(case.reference(), build)
    assert_tree_close(jax.jit(jax.grad(f))(v), jax.jit(jax.grad(ref))(v), **TOL)
    assert_tree_close(jax.jit(jax.hessian(f))(v), jax.jit(jax.hessian(ref))(v), **TOL)


def test_eager_hessian():
    case = LINEAR_CASES["matvec"]
    v, build = _realify(case)
    f, ref = _sq_loss(case.op(), build), _sq_loss(case.reference(), build)
    assert_tree_close(jax.hessian(f)(v), jax.jit(jax.hessian(ref))(v), **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_jacfwd_jacrev(name):
    case = LINEAR_CASES[name]
    v, build = _realify(case)
    f, ref = _sq_loss(case.op(), build), _sq_loss(case.reference(), build)
    h = jax.jit(jax.hessian(ref))(v)
    assert_tree_close(jax.jit(jax.jacfwd(jax.jacrev(f)))(v), h, **TOL)
    assert_tree_close(jax.jit(jax.jacrev(jax.jacfwd(f)))(v), h, **TOL)


@pytest.mark.parametrize("name", ["matvec", "fft", "axpy_traced_no_transpose"])
def test_third_derivative(name):
    case = LINEAR_CASES[name]
    v, build = _realify(case)
    f, ref = _sq_loss(case.op(), build), _sq_loss(case.reference(), build)
    cube = lambda g: (lambda v: g(v) ** 1.5)
    assert_tree_close(jax.jit(jax.jacfwd(jax.hessian(cube(f))))(v),
                      jax.jit(jax.jacfwd(jax.hessian(cube(ref))))(v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_transpose_identity(name):
    case = LINEAR_CASES[name]
    args = case.args()
    f = case.op()
    out = f(*args)
    dargs, ybar = tree_randn_like(args, seed=5), tree_randn_like(out, seed=6)
    _, t = jax.jvp(f, args, dargs)
    xbar = jax.vjp(f, *args)[1](ybar)
    np.testing.assert_allclose(tree_inner(ybar, t), tree_inner(xbar, dargs), rtol=1e-10)


# ------------------------------------------------------------- transposes

def _transpose(case, mode):
    f = case.op(mode)
    return jax.linear_transpose(f, *case.args())


@pytest.mark.parametrize("wrap", ["eager", "jit"])
@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_linear_transpose_matches_reference(name, mode, wrap):
    case = LINEAR_CASES[name]
    ybar = tree_randn_like(case.reference()(*case.args()), seed=7)
    ft = _transpose(case, mode)
    got = jax.jit(ft)(ybar) if wrap == "jit" else ft(ybar)
    want = jax.linear_transpose(case.reference(), *case.args())(ybar)
    assert_tree_close(got, want, **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_transpose_of_transpose_is_the_op(name, mode):
    case = LINEAR_CASES[name]
    args = case.args()
    ybar = tree_randn_like(case.reference()(*args), seed=8)
    ft = _transpose(case, mode)
    ftt = jax.linear_transpose(ft, ybar)
    (back,) = ftt(args)
    assert_tree_close(back, case.reference()(*args), **TOL)
    ft3 = jax.linear_transpose(lambda x: ftt(x)[0], args)  # and once more
    assert_tree_close(ft3(ybar)[0], ft(ybar), **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_vmap_of_transpose(name, mode):
    case = LINEAR_CASES[name]
    out = case.reference()(*case.args())
    ybars = jax.tree.map(lambda *r: np.stack(r),
                         *[tree_randn_like(out, seed=10 + k) for k in range(3)])
    got = jax.vmap(_transpose(case, mode))(ybars)
    want = jax.vmap(jax.linear_transpose(case.reference(), *case.args()))(ybars)
    assert_tree_close(got, want, **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_derivatives_of_transpose(name, mode):
    """The transpose is linear too: its grad and hessian are those of the reference's."""
    case = LINEAR_CASES[name]
    out = case.reference()(*case.args())
    ft, ref_t = _transpose(case, mode), jax.linear_transpose(case.reference(), *case.args())
    ybar = tree_randn_like(out, seed=11)
    loss = lambda g: (lambda y: sum(jnp.sum(jnp.abs(o) ** 2) for o in jax.tree.leaves(g(y))))
    real = not any(np.iscomplexobj(l) for l in jax.tree.leaves(ybar))
    if real:
        t = lambda g: jax.jit(jax.hessian(loss(g)))
        assert_tree_close(t(ft)(ybar), t(ref_t)(ybar), **TOL)
    else:
        t = lambda g: jax.jit(jax.grad(loss(g)))
        assert_tree_close(t(ft)(ybar), t(ref_t)(ybar), **TOL)
    t = tree_randn_like(ybar, seed=12)
    assert_tree_close(jax.jvp(ft, (ybar,), (t,)), jax.jvp(ref_t, (ybar,), (t,)), **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_transpose_over_keyword_operand(mode):
    """A batched matrix (keyword operand) and batched cotangents, and the matrix alone."""
    case = LINEAR_CASES["matvec"]
    op = case.make(mode)
    x = case.args()[0]
    a_s, ys = randn((3, 4, 3), seed=1), randn((3, 4), seed=2)
    t = lambda a, y: jax.linear_transpose(lambda x: op(x, a=a), x)(y)[0]
    np.testing.assert_allclose(jax.vmap(t)(a_s, ys), jnp.einsum("bij,bi->bj", a_s, ys), **TOL)
    np.testing.assert_allclose(jax.vmap(t, in_axes=(0, None))(a_s, ys[0]),
                               jnp.einsum("bij,i->bj", a_s, ys[0]), **TOL)
    # reverse mode through an unbatched x: its cotangent sums over the batch
    g = jax.grad(lambda x: (jax.vmap(lambda a: op(x, a=a))(a_s) ** 2).sum())(x)
    np.testing.assert_allclose(g, 2 * jnp.einsum("bij,bik,k->j", a_s, a_s, x), **TOL)


@pytest.mark.parametrize("argnum", [0, 1])
@pytest.mark.parametrize("name", ["axpy_host", "axpy_traced", "axpy_traced_no_transpose"])
def test_grad_with_respect_to_one_of_two_linear_arguments(name, argnum):
    case = LINEAR_CASES[name]
    f = lambda x, y: jnp.sum(case.op()(x, y) ** 2)
    ref = lambda x, y: jnp.sum(case.ref(x, y) ** 2)
    args = case.args()
    both = lambda g: jax.jit(lambda *a: (jax.grad(g, argnums=argnum)(*a),
                                         jax.hessian(g, argnums=argnum)(*a)))
    assert_tree_close(both(f)(*args), both(ref)(*args), **TOL)


def test_fft_transpose_is_fft_itself():
    """JAX's transpose of the complex-linear DFT is the DFT (no conjugation, no 1/n)."""
    z, y = randn(8, np.complex128), randn(8, np.complex128, seed=1)
    (t,) = jax.linear_transpose(fft("vectorized"), z)(y)
    np.testing.assert_allclose(t, np.fft.fft(y), **TOL)
    np.testing.assert_allclose(t, jax.linear_transpose(jnp.fft.fft, z)(y)[0], **TOL)
    check_transpose_identity(fft("vectorized"), z, randn(8, np.complex128, seed=2), y)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_linear_op_in_single_precision(dtype):
    op = fft("vectorized") if dtype == np.complex64 else LINEAR_CASES["axpy_host"].make(
        "vectorized")
    ref = jnp.fft.fft if dtype == np.complex64 else None
    x = randn(4, dtype)
    if ref is None:
        f, ref_f = (lambda x: op(x, x)), (lambda x: LINEAR_CASES["axpy_host"].ref(x, x))
    else:
        f, ref_f = op, ref
    out = f(x)
    assert out.dtype == dtype
    y = randn(4, dtype, seed=1)
    got = jax.linear_transpose(f, x)(y)[0]
    assert got.dtype == dtype
    np.testing.assert_allclose(got, jax.linear_transpose(ref_f, x)(y)[0], rtol=1e-5, atol=1e-5)


def test_linear_op_with_traced_transpose_rule_calls_it():
    calls = []

    def transpose(ct):
        calls.append(1)
        return (3 * ct,)

    op = ab.bind(lambda x: 3 * x, shape=ab.like(0), linear=True, traced=True, name="triple")
    op.def_transpose(transpose, traced=True)
    x = randn(3)
    np.testing.assert_allclose(jax.grad(lambda x: op(x).sum())(x), 3 * np.ones(3))
    assert calls  # the given rule, not JAX's transpose of the function
