"""ab.reversible_loop against lax.fori_loop: values, forward and reverse mode, second
order, vmap and jit, and reverse-mode memory flat in the number of steps.

The loop is a leapfrog step of a pendulum, (q, p) ↦ (q + h·p', p') with
p' = p − h·sin q, inverted exactly by p = p' + h·sin(q' − h·p'), q = q' − h·p'.
"""
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, check_first_order, randn

H = 0.1


def step(i, state):
    q, p = state
    p = p - H * jnp.sin(q) * (1 + 0.01 * i)
    return q + H * p, p


def unstep(i, state):
    q, p = state
    q = q - H * p
    return q, p + H * jnp.sin(q) * (1 + 0.01 * i)


def loss(loop, n):
    def f(q, p):
        qn, pn = loop(step, unstep, (q, p), n) if loop is ab.reversible_loop else \
            jax.lax.fori_loop(0, n, step, (q, p))
        return jnp.sum(qn**2 * jnp.cos(pn))
    return f


Q, P = randn(4, seed=1), randn(4, seed=2)
TOL = dict(rtol=1e-10, atol=1e-12)


def test_value_and_first_order():
    final = jax.jit(lambda s: ab.reversible_loop(step, unstep, s, 7))((Q, P))
    assert_close(final, jax.lax.fori_loop(0, 7, step, (Q, P)), **TOL)
    assert_close(jax.grad(loss(ab.reversible_loop, 7), argnums=(0, 1))(Q, P),
                 jax.grad(loss(jax.lax, 7), argnums=(0, 1))(Q, P), **TOL)
    check_first_order(lambda s: ab.reversible_loop(step, unstep, s, 7), ((Q, P),))


def test_second_order_vmap_jit():
    mine, ref = loss(ab.reversible_loop, 5), loss(jax.lax, 5)
    hess = jax.jit(jax.hessian(ref))(Q, P)
    assert_close(jax.jit(jax.hessian(mine))(Q, P), hess, **TOL)  # forward over reverse
    assert_close(jax.jit(jax.jacrev(jax.grad(mine)))(Q, P), hess, **TOL)
    qs = np.stack([Q, 0.5 * Q, -Q])
    grads = lambda f: jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(0, None)))
    assert_close(grads(mine)(qs, P), grads(ref)(qs, P), **TOL)
    outer = lambda f: jax.jit(jax.grad(lambda q: jax.vmap(f, (0, None))(q, P).sum()))
    assert_close(outer(mine)(qs), outer(ref)(qs), **TOL)


def test_reverse_mode_memory_is_flat():
    """Compiled temporary memory of jit(grad) for 10, 100, 1000 steps."""
    q = jnp.full((64, 64), 0.5)

    def temp(loop, n):
        f = jax.jit(jax.grad(lambda q: loss(loop, n)(q, q)))
        return f.lower(q).compile().memory_analysis().temp_size_in_bytes
    mine = [temp(ab.reversible_loop, n) for n in (10, 100, 1000)]
    ref = [temp(jax.lax, n) for n in (10, 100, 1000)]
    assert mine[0] == mine[1] == mine[2]
    assert ref[2] > 100 * mine[2] and ref[2] > 50 * ref[0]


def test_errors_and_docstring():
    with pytest.raises(TypeError, match="nsteps must be a non-negative Python int"):
        ab.reversible_loop(step, unstep, (Q, P), 2.5)
    with pytest.raises(TypeError, match=r"init_val.*\[1\] has dtype int"):
        ab.reversible_loop(step, unstep, (Q, np.arange(4)), 2)
    test = doctest.DocTestParser().get_doctest(ab.reversible_loop.__doc__, {}, "rl", None, 0)
    assert doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test).failed == 0
