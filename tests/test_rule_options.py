"""Rule options beyond the basic signatures: symbolic zeros and ``needs``,
fwd/bwd with residuals, in-place host functions (``out=True``), transposes that
ask for ``input_shapes``, and ops linear in some arguments (``linear=(i, ...)``),
each under the transformations it affects."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, check_first_order, randn

TOL = dict(rtol=1e-10, atol=1e-10)
MODES = ["sequential", "vectorized"]


# ------------------------------------------------------------- symbolic zeros

def _mul_symbolic(log, mode="vectorized", traced=False):
    """x1·x2² with symbolic-zero rules (host, or traced: Python branches on None still work)."""
    def jvp(primals, tangents):
        (x1, x2), (d1, d2) = primals, tangents
        log.append(("jvp", d1 is None, d2 is None))
        out = 0
        if d1 is not None:
            out = out + x2**2 * d1
        if d2 is not None:
            out = out + 2 * x1 * x2 * d2
        return out

    def vjp(primals, ct, *, needs):
        x1, x2 = primals
        log.append(("vjp", tuple(needs)))
        return (x2**2 * ct if needs[0] else None, 2 * x1 * x2 * ct if needs[1] else None)

    op = ab.bind(lambda a, b: a * b**2, shape=ab.like(0), vmap=mode, traced=False,
                 name=f"mul_symbolic_{mode}_{traced}")
    op.def_jvp(jvp, traced=traced, symbolic_zeros=True)
    op.def_vjp(vjp, traced=traced, symbolic_zeros=True)
    return op


@pytest.mark.parametrize("traced", [False, True], ids=["host", "traced"])
@pytest.mark.parametrize("mode", MODES)
def test_symbolic_zero_tangents_arrive_as_none(mode, traced):
    log = []
    op = _mul_symbolic(log, mode, traced)
    x1, x2 = randn(3), randn(3, seed=1)
    _, t = jax.jvp(lambda a: op(a, x2), (x1,), (x1,))
    np.testing.assert_allclose(t, x2**2 * x1, **TOL)
    _, t = jax.jvp(lambda b: op(x1, b), (x2,), (x2,))
    np.testing.assert_allclose(t, 2 * x1 * x2 * x2, **TOL)
    assert ("jvp", False, True) in log and ("jvp", True, False) in log
    t = jax.vmap(lambda a: jax.jvp(lambda a: op(a, x2), (a,), (a,))[1])(np.stack([x1, x2]))
    np.testing.assert_allclose(t, np.stack([x1, x2]) * x2**2, **TOL)


@pytest.mark.parametrize("traced", [False, True], ids=["host", "traced"])
@pytest.mark.parametrize("mode", MODES)
def test_vjp_needs_says_which_cotangents_are_wanted(mode, traced):
    log = []
    op = _mul_symbolic(log, mode, traced)
    x1, x2 = randn(3), randn(3, seed=1)
    for argnums, needs in ((0, (True, False)), (1, (False, True)), ((0, 1), (True, True))):
        log.clear()
        g = jax.grad(lambda a, b: op(a, b).sum(), argnums=argnums)(x1, x2)
        want = jax.grad(lambda a, b: (a * b**2).sum(), argnums=argnums)(x1, x2)
        assert_tree_close(g, want, **TOL)
        if not traced:  # (a traced vjp may be transposed from, not called with, needs)
            assert ("vjp", needs) in log
    g = jax.jit(jax.vmap(jax.grad(lambda a, b: op(a, b).sum(), argnums=1)))(
        np.stack([x1, x2]), np.stack([x2, x1]))
    np.testing.assert_allclose(g, 2 * np.stack([x1, x2]) * np.stack([x2, x1]), **TOL)


def test_symbolic_zero_cotangent_of_unused_output():
    seen = []

    def vjp(primals, ct, *, needs):
        seen.append(tuple(c is None for c in ct))
        c0, c1 = ct
        (x,) = primals
        g = 0 * x
        if c0 is not None:
            g = g + 2 * c0
        if c1 is not None:
            g = g + 3 * c1
        return (g,)

    op = ab.bind(lambda x: (2 * x, 3 * x), shape=lambda x: (x, x), name="two_outs_sz")
    op.def_vjp(vjp, symbolic_zeros=True)
    x = randn(3)
    np.testing.assert_allclose(jax.grad(lambda x: op(x)[1].sum())(x), 3 * np.ones(3), **TOL)
    assert seen == [(True, False)]


def test_symbolic_zeros_in_transpose_rule():
    seen = []

    def transpose(ct, *, needs):
        seen.append(tuple(needs))
        return (2 * ct if needs[0] else None, np.roll(ct, -1) if needs[1] else None)

    op = ab.bind(lambda x, y: 2 * x + np.roll(y, 1), shape=ab.like(0), linear=True,
                 name="axpy_symbolic")
    op.def_transpose(transpose, symbolic_zeros=True)
    x, y = randn(4), randn(4, seed=1)
    g = jax.grad(lambda y: jnp.sum(op(x, y) ** 2))(y)
    np.testing.assert_allclose(g, jax.grad(lambda y: jnp.sum((2 * x + jnp.roll(y, 1)) ** 2))(y),
                               **TOL)
    assert (False, True) in seen


# --------------------------------------------------------------- fwd / bwd

def _solve_op(log, mode="vectorized"):
    """x = A⁻¹b with A a positional argument; fwd saves the LU-like factor (here: A⁻¹)."""
    def fn(a, b):
        log.append("fn")
        return np.linalg.solve(a, b[..., None])[..., 0]

    op = ab.bind(fn, shape=ab.like(1), vmap=mode, name=f"solve_{mode}")

    @op.def_fwd(residuals=lambda a, b: (a, b))
    def fwd(a, b):
        log.append("fwd")
        inv = np.linalg.inv(a)
        x = (inv @ b[..., None])[..., 0]
        return x, (inv, x)

    @op.def_bwd
    def bwd(res, ct):
        log.append("bwd")
        inv, x = res
        bbar = (np.swapaxes(inv, -1, -2) @ ct[..., None])[..., 0]
        return (-bbar[..., :, None] * x[..., None, :], bbar)

    @op.def_jvp
    def jvp(primals, tangents):
        log.append("jvp")
        (a, b), (da, db) = primals, tangents
        x = np.linalg.solve(a, b[..., None])
        return np.linalg.solve(a, db[..., None] - da @ x)[..., 0]

    return op


def _solve_inputs():
    a = randn((3, 3)) + 3 * np.eye(3)
    return a, randn(3, seed=1)


def _solve_ref(a, b):
    return jnp.linalg.solve(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_fwd_runs_once_and_bwd_uses_its_residuals(mode):
    log = []
    op = _solve_op(log, mode)
    a, b = _solve_inputs()
    loss = lambda f: (lambda a, b: jnp.sum(f(a, b) ** 2))
    g = jax.jit(jax.grad(loss(op), argnums=(0, 1)))(a, b)
    assert_tree_close(g, jax.grad(loss(_solve_ref), argnums=(0, 1))(a, b), rtol=1e-9, atol=1e-9)
    assert log.count("fwd") == 1 and log.count("bwd") == 1 and "fn" not in log
    log.clear()
    v, pullback = jax.vjp(op, a, b)
    np.testing.assert_allclose(v, _solve_ref(a, b), rtol=1e-10)
    assert log == ["fwd"]
    pullback(np.ones(3))
    pullback(np.ones(3))
    assert log == ["fwd", "bwd", "bwd"]  # residuals reused, fwd not run again


@pytest.mark.parametrize("mode", MODES)
def test_fwd_bwd_under_vmap_and_forward_mode_uses_jvp(mode):
    log = []
    op = _solve_op(log, mode)
    a, b = _solve_inputs()
    A, B = np.stack([a, a + np.eye(3)]), np.stack([b, 2 * b])
    loss = lambda f: (lambda a, b: jnp.sum(f(a, b) ** 2))
    t = lambda f: jax.jit(jax.vmap(jax.grad(loss(f), argnums=(0, 1))))
    assert_tree_close(t(op)(A, B), t(_solve_ref)(A, B), rtol=1e-9, atol=1e-9)
    log.clear()
    tj = jax.jvp(op, (a, b), (np.eye(3), b))[1]
    np.testing.assert_allclose(tj, jax.jvp(_solve_ref, (a, b), (np.eye(3), b))[1], rtol=1e-9)
    assert log == ["fn", "jvp"]  # forward mode keeps no residuals: the fwd rule never runs
    log.clear()
    jf = jax.jit(jax.jacfwd(op, argnums=1))(a, b)
    np.testing.assert_allclose(jf, jax.jacfwd(_solve_ref, argnums=1)(a, b), rtol=1e-9)
    assert "fwd" not in log and "bwd" not in log
    log.clear()
    along_b = lambda f: jax.vmap(lambda t: jax.jvp(f, (a, b), (np.zeros((3, 3)), t))[1])
    assert_tree_close(jax.jit(along_b(op))(B), along_b(_solve_ref)(B), rtol=1e-9, atol=1e-9)
    assert "fwd" not in log
    log.clear()
    _, lin = jax.linearize(op, a, b)  # linearize keeps them, for its transpose
    assert log == ["fwd"]
    check_first_order(op, (a, b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_fwd_bwd_under_checkpoint(mode):
    """Under jax.checkpoint reverse mode transposes forward mode's tangent, which keeps
    no residuals: the fwd rule runs again in the backward pass, for the bwd rule."""
    log = []
    op = _solve_op(log, mode)
    a, b = _solve_inputs()
    A, B = np.stack([a, a + np.eye(3)]), np.stack([b, 2 * b])
    loss = lambda f: (lambda a, b: jnp.sum(jax.checkpoint(f)(a, b) ** 2))
    g = jax.jit(jax.grad(loss(op), argnums=(0, 1)))(a, b)
    assert_tree_close(g, jax.grad(loss(_solve_ref), argnums=(0, 1))(a, b), rtol=1e-9, atol=1e-9)
    assert log.count("bwd") == 1
    t = lambda f: jax.jit(jax.vmap(jax.grad(loss(f), argnums=(0, 1))))
    assert_tree_close(t(op)(A, B), t(_solve_ref)(A, B), rtol=1e-9, atol=1e-9)


def test_fwd_without_bwd_is_an_error():
    op = ab.bind(np.sin, shape=ab.like(0), name="fwd_only")
    op.def_fwd(lambda x: (np.sin(x), x), residuals=lambda x: x)
    with pytest.raises(TypeError, match=r"(?s)'fwd_only'.*fwd.*bwd"):
        op(randn(3))


def test_residuals_not_matching_their_spec():
    op = ab.bind(np.sin, shape=ab.like(0), name="bad_residuals")
    op.def_fwd(lambda x: (np.sin(x), x[:2]), residuals=lambda x: x)
    op.def_bwd(lambda res, ct: (ct,))
    with pytest.raises(Exception, match=r"(?s)'bad_residuals'.*(resid|fwd).*2.*3"):
        jax.block_until_ready(jax.grad(lambda x: op(x).sum())(randn(3)))


# ------------------------------------------------------------------ out=True

def _inplace(mode, log):
    def fn(x, y, *, out):
        log.append(type(out).__name__)
        np.multiply(x, y**2, out=out[0])
        np.add(x, y, out=out[1])

    return ab.bind(fn, shape=lambda x, y: (x, x), out=True, vmap=mode, name=f"inplace_{mode}",
                   jvp=lambda p, t: (p[1] ** 2 * t[0] + 2 * p[0] * p[1] * t[1], t[0] + t[1]),
                   vjp=lambda p, ct: (p[1] ** 2 * ct[0] + ct[1], 2 * p[0] * p[1] * ct[0] + ct[1]))


def _inplace_ref(x, y):
    return x * y**2, x + y


@pytest.mark.parametrize("mode", MODES)
def test_out_true_writes_into_xla_buffers(mode):
    log = []
    op = _inplace(mode, log)
    x, y = randn(3), randn(3, seed=1)
    assert_tree_close(op(x, y), _inplace_ref(x, y), **TOL)
    assert_tree_close(jax.jit(op)(x, y), _inplace_ref(x, y), **TOL)
    X, Y = np.stack([x, y]), np.stack([y, x])
    assert_tree_close(jax.vmap(op)(X, Y), jax.vmap(_inplace_ref)(X, Y), **TOL)
    assert_tree_close(jax.vmap(op, in_axes=(0, None))(X, y),
                      jax.vmap(_inplace_ref, in_axes=(0, None))(X, y), **TOL)
    loss = lambda f: (lambda x, y: sum(jnp.sum(o**2) for o in f(x, y)))
    assert_tree_close(jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1))))(X, Y),
                      jax.vmap(jax.grad(loss(_inplace_ref), argnums=(0, 1)))(X, Y), **TOL)
    assert log and set(log) == {"tuple"}


def test_out_true_scalar_rows_in_sequential_vmap():
    def fn(x, *, out):
        out[...] = x.sum(axis=-1)

    op = ab.bind(fn, shape=lambda x: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype), out=True,
                 name="inplace_total")
    X = randn((4, 3))
    np.testing.assert_allclose(jax.vmap(op)(X), X.sum(axis=1), **TOL)


def test_out_true_with_traced_is_an_error():
    with pytest.raises(TypeError, match="out=True"):
        ab.bind(jnp.sin, traced=True, out=True, name="traced_inplace")


# -------------------------------------------------------------- input_shapes

@pytest.mark.parametrize("n", [6, 7])
def test_transpose_gets_input_shapes(n):
    """rfft: the output (n//2 + 1) does not say whether n was even or odd."""
    r2c = ab.bind(lambda x: np.fft.rfft(x), linear=True, name=f"rfft_{n}",
                  shape=lambda x: jax.ShapeDtypeStruct(x.shape[:-1] + (x.shape[-1] // 2 + 1,),
                                                       np.complex128))

    @r2c.def_transpose(input_shapes=True)
    def _(ct, *, input_shapes):
        (x,) = input_shapes
        m = x.shape[-1]
        # JAX's transpose of rfft: the real part of the full DFT of the zero-padded ct
        full = np.zeros(ct.shape[:-1] + (m,), np.complex128)
        full[..., :ct.shape[-1]] = ct
        return (np.real(np.fft.fft(full, axis=-1)),)

    x, y = randn(n), randn(n // 2 + 1, np.complex128, seed=1)
    got = jax.linear_transpose(r2c, x)(y)[0]
    want = jax.linear_transpose(jnp.fft.rfft, x)(y)[0]
    assert got.shape == (n,)
    np.testing.assert_allclose(got, want, **TOL)
    X = randn((2, n))
    t = lambda g: jax.vmap(jax.grad(lambda x: jnp.sum(jnp.abs(g(x)) ** 2)))
    np.testing.assert_allclose(t(r2c)(X), t(jnp.fft.rfft)(X), **TOL)


# ------------------------------------------------------- linear in some args

def _partly_linear():
    """y = A(θ)·b with A(θ) = diag(exp θ): nonlinear in θ, linear in b."""
    op = ab.bind(lambda theta, b: np.exp(theta) * b, shape=ab.like(1), linear=(1,),
                 name="partly_linear",
                 jvp=lambda p, t: np.exp(p[0]) * (t[0] * p[1] + t[1]),
                 vjp=lambda p, ct: (np.exp(p[0]) * p[1] * ct, np.exp(p[0]) * ct))
    return op, lambda theta, b: jnp.exp(theta) * b


def test_linear_transpose_in_the_linear_argument():
    op, ref = _partly_linear()
    theta, b, y = randn(3), randn(3, seed=1), randn(3, seed=2)
    got = jax.linear_transpose(lambda b: op(theta, b), b)(y)[0]
    np.testing.assert_allclose(got, jax.linear_transpose(lambda b: ref(theta, b), b)(y)[0], **TOL)
    got = jax.vmap(jax.linear_transpose(lambda b: op(theta, b), b))(np.stack([y, 2 * y]))[0]
    np.testing.assert_allclose(got, np.exp(theta) * np.stack([y, 2 * y]), **TOL)
    check_first_order(op, (theta, b))


def test_linear_transpose_in_the_nonlinear_argument_is_an_error():
    op, _ = _partly_linear()
    theta, b = randn(3), randn(3, seed=1)
    with pytest.raises(TypeError, match=r"(?s)'partly_linear'.*not declared linear in "
                                        r"positional input leaf 0.*argument\(s\) \(1,\) only"):
        jax.linear_transpose(lambda t: op(t, b), theta)(b)


@pytest.mark.parametrize("mode", MODES)
def test_partly_linear_transposes_batch_and_transpose_back(mode):
    op = ab.bind(lambda t, b: np.exp(t) * b, shape=ab.like(1), linear=(1,), vmap=mode,
                 name=f"partly_linear_{mode}",
                 jvp=lambda p, t: np.exp(p[0]) * (t[0] * p[1] + t[1]),
                 vjp=lambda p, ct: (np.exp(p[0]) * p[1] * ct, np.exp(p[0]) * ct))
    theta, b, y = randn(3), randn(3, seed=1), randn(3, seed=2)
    thetas = np.stack([theta, -theta])
    lt = lambda t: jax.linear_transpose(lambda b: op(t, b), b)
    np.testing.assert_allclose(jax.vmap(lambda t: lt(t)(y)[0])(thetas), np.exp(thetas) * y, **TOL)
    back = jax.linear_transpose(lambda c: lt(theta)(c)[0], y)(b)[0]
    np.testing.assert_allclose(back, np.exp(theta) * b, **TOL)


def test_traced_partly_linear_needs_no_rules():
    op = ab.bind(lambda t, b: jnp.exp(t) * b, traced=True, linear=(1,), name="partly_traced")
    theta, b, y = randn(3), randn(3, seed=1), randn(3, seed=2)
    np.testing.assert_allclose(jax.linear_transpose(lambda b: op(theta, b), b)(y)[0],
                               np.exp(theta) * y, **TOL)
    np.testing.assert_allclose(jax.hessian(lambda t: op(t, b).sum())(theta),
                               np.diag(np.exp(theta) * b), **TOL)
