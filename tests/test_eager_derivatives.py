"""Derivatives of traced code applied eagerly (``jax.grad(op)(x)`` with no ``jit``) run
as compiled programs kept by the op, not operation by operation: the same numbers as
under ``jit``, a rule set later replaces them, and the op is still collected whole."""
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring

import anybind as ab
from helpers import assert_close, central_difference, randn

_LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # each program lowered


def _chain(x, y):
    """Forty operations of JAX code."""
    for k in range(10):
        x = jnp.sin(x) * y + 0.3 * jnp.cos(x * (k + 1)) - x / (k + 2)
    return x


_SEEN: list = []  # the running test's lowerings, while it listens (JAX 0.8 cannot
_LISTENING = [False]  # unregister a listener)
monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kwargs: _SEEN.append(duration)
    if _LISTENING[0] and event == _LOWERED else None)


@pytest.fixture
def lowered():
    """A list that grows by one per program JAX lowers while the test runs."""
    del _SEEN[:]
    _LISTENING[0] = True
    yield _SEEN
    _LISTENING[0] = False


def test_an_eager_gradient_of_traced_code_is_a_few_programs_and_jits_numbers(lowered):
    op = ab.bind(_chain, traced=True, name="chain")
    x, y = randn(7, seed=1), randn(7, seed=2)
    grad = jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1))
    want = jax.jit(grad)(x, y)
    del lowered[:]
    got = grad(x, y)
    assert len(lowered) <= 6, f"{len(lowered)} programs for one eager gradient"  # op by op: 18
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-12, atol=1e-12)
    dx = randn(7, seed=3)
    assert_close(np.dot(got[0], dx), central_difference(lambda a: op(a, y).sum(), x, dx),
                 rtol=1e-6)
    del lowered[:]
    grad(x, y)  # the second call runs what the first compiled
    assert lowered == []
    _, t = jax.jvp(lambda a: op(a, y), (x,), (dx,))  # forward mode, eagerly
    assert_close(t, jax.jit(lambda a, d: jax.jvp(lambda v: op(v, y), (a,), (d,))[1])(x, dx),
                 rtol=1e-12, atol=1e-12)


def test_a_rule_set_after_an_eager_gradient_replaces_it():
    op = ab.bind(lambda x: jnp.sin(x), traced=True, name="sin_then_rule")
    x = randn(4, seed=4)
    assert_close(jax.grad(lambda v: op(v).sum())(x), np.cos(x), rtol=1e-12)
    op.def_jvp(lambda p, t: 3 * t[0], traced=True)  # a rule of the user's, on purpose wrong
    assert_close(jax.grad(lambda v: op(v).sum())(x), 3 * np.ones(4), rtol=1e-12)


def test_an_op_differentiated_eagerly_is_collected_when_dropped():
    def make():
        op = ab.bind(_chain, traced=True, name="chain_dropped")
        x = randn(5, seed=5)
        jax.grad(lambda a: op(a, x).sum())(x)
        jax.jvp(lambda a: op(a, x), (x,), (x,))
        return weakref.ref(op)
    ref = make()
    for _ in range(20):
        gc.collect()
        if ref() is None:
            break
    assert ref() is None
