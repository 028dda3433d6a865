"""ab.root and ab.fixed_point: host solvers differentiated by the implicit function
theorem, against finite differences and against the same problem solved in JAX
(Newton's method unrolled, differentiated by JAX), to second order and under vmap.

Problem: x³ + B·x = a, solved by scipy.optimize.root; fixed point x = cos(a·x)
by a NumPy iteration.
"""
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import anybind as ab
from helpers import assert_close, check_first_order, randn

A = randn(3, seed=1)
B = np.eye(3) * 2 + 0.3 * randn((3, 3), seed=2)
X0 = np.zeros(3)
TOL = dict(rtol=1e-9, atol=1e-11)
CALLS = []


def residual(x, a, b):
    return x**3 + b @ x - a


def scipy_solver(a, b, x0):
    CALLS.append(1)
    sol = scipy.optimize.root(lambda x: x**3 + b @ x - a, x0,
                              jac=lambda x: np.diag(3 * x**2) + b, tol=1e-14)
    return sol.x


def newton_ref(a, b):
    def newton(i, x):
        return x - jnp.linalg.solve(jnp.diag(3 * x**2) + b, residual(x, a, b))
    return jax.lax.fori_loop(0, 20, newton, jnp.zeros_like(a))


def loss(solve):
    return lambda a, b: jnp.sum(jnp.sin(solve(a, b)) * a)


@pytest.fixture(scope="module")
def cubic():
    solve = ab.root(residual, scipy_solver)
    return lambda a, b: solve(a, b, x0=X0)


def test_first_order(cubic):
    assert_close(cubic(A, B), newton_ref(A, B), **TOL)
    want = jax.jit(jax.jacfwd(newton_ref, (0, 1)))(A, B)
    for jac in (jax.jacfwd, jax.jacrev):
        assert_close(jax.jit(jac(cubic, argnums=(0, 1)))(A, B), want, **TOL)
    check_first_order(cubic, (A, B))  # central differences, and vjp against jvp
    CALLS.clear()
    jax.jit(jax.value_and_grad(loss(cubic), argnums=(0, 1)))(A, B)
    assert len(CALLS) == 1  # one host solve; derivatives never call the solver


@pytest.mark.slow  # tens of seconds
def test_second_order_and_vmap(cubic):
    h = jax.jit(jax.hessian(loss(newton_ref)))(A, B)
    assert_close(jax.jit(jax.hessian(loss(cubic)))(A, B), h, **TOL)
    assert_close(jax.jit(jax.jacrev(jax.grad(loss(cubic))))(A, B), h, **TOL)
    As = np.stack([A, 2 * A, -A])
    grads = lambda f: jax.jit(jax.vmap(jax.grad(loss(f), argnums=(0, 1)), in_axes=(0, None)))
    assert_close(grads(cubic)(As, B), grads(newton_ref)(As, B), **TOL)


@pytest.mark.slow  # tens of seconds
def test_matrix_free_linear_solve():
    gmres = lambda mv, b: jax.scipy.sparse.linalg.gmres(mv, b, tol=1e-13)[0]
    solve = ab.root(residual, scipy_solver, linear_solve=gmres)
    f = lambda a, b: solve(a, b, x0=X0)
    both = lambda f: jax.jit(lambda a, b: (jax.grad(loss(f), argnums=(0, 1))(a, b),
                                           jax.jacfwd(f)(a, b)))
    assert_close(both(f)(A, B), both(newton_ref)(A, B), **TOL)


def test_fixed_point_numpy_iteration():
    def iterate(a, x0):
        x = np.asarray(x0)
        for _ in range(200):
            x = np.cos(a * x)
        return x
    fp = ab.fixed_point(lambda x, a: jnp.cos(a * x), iterate)
    a = np.array([0.3, 0.5, 0.9])
    f = lambda a: fp(a, x0=np.ones(3))

    def ref(a):  # the same iteration in JAX, differentiated through
        return jax.lax.fori_loop(0, 200, lambda i, x: jnp.cos(a * x), jnp.ones(3))
    assert_close(jax.jit(jax.jacrev(f))(a), jax.jit(jax.jacfwd(ref))(a), **TOL)
    hess = lambda f: jax.jit(jax.hessian(lambda a: f(a).sum()))
    assert_close(hess(f)(a), hess(ref)(a), **TOL)
    check_first_order(f, (a,))


def test_errors_and_docstrings(cubic):
    solve = ab.root(residual, scipy_solver)
    with pytest.raises(TypeError, match="non-differentiable operand"):
        jax.grad(lambda x0: solve(A, B, x0=x0).sum())(X0)
    with pytest.raises(TypeError, match="x0.*dtype int"):
        solve(A, B, x0=np.zeros(3, int))
    for fn in (ab.root, ab.fixed_point):
        test = doctest.DocTestParser().get_doctest(fn.__doc__, {}, fn.__name__, None, 0)
        assert doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test).failed == 0
