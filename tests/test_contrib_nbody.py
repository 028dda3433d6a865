"""anybind.contrib.nbody: a Numba direct-summation kernel with compiled jvp and vjp,
against the same sum in plain jax.numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anybind.contrib.nbody import accelerations, accelerations_ref
from helpers import assert_close, check_first_order, rng

R = rng()
X, M = R.normal(size=(12, 3)), R.uniform(0.5, 1.5, size=12)


def test_values_and_first_order():
    assert_close(accelerations(X, M), accelerations_ref(X, M), rtol=1e-12)
    check_first_order(accelerations, (X, M))
    assert_close(jax.jacrev(accelerations)(X, M), jax.jacfwd(accelerations_ref)(X, M),
                 rtol=1e-9, atol=1e-9)


def _leapfrog(acc, steps=5, dt=0.01):
    def run(x, v, m):
        def step(c, _):
            x, v = c
            v = v + 0.5 * dt * acc(x, m)
            x = x + dt * v
            v = v + 0.5 * dt * acc(x, m)
            return (x, v), None
        (x, v), _ = jax.lax.scan(step, (x, v), None, length=steps)
        return jnp.sum(x[:, 0] ** 2) + jnp.sum(v**2)
    return run


def test_gradient_of_an_integration_and_vmap_over_systems():
    v = 0.1 * R.normal(size=X.shape)
    g = jax.jit(jax.grad(_leapfrog(accelerations), argnums=(0, 1, 2)))(X, v, M)
    assert_close(g, jax.grad(_leapfrog(accelerations_ref), argnums=(0, 1, 2))(X, v, M),
                 rtol=1e-9, atol=1e-9)
    xs = R.normal(size=(3, 12, 3))
    assert_close(jax.vmap(accelerations, (0, None))(xs, M),
                 jax.vmap(accelerations_ref, (0, None))(xs, M), rtol=1e-12)


def test_inputs_are_checked_when_traced():
    with pytest.raises(TypeError, match=r"float64\[n, 3\] and m float64\[n\], got float32"):
        jax.jit(accelerations).lower(X.astype(np.float32), M.astype(np.float32))
