"""How each role batches under vmap: one host call per batch unless "sequential" is asked.

An op whose function has a vmap rule runs its host rules vectorized (one call,
every array with a leading batch axis, of length 1 where unbatched); a rule's
own ``vmap=`` overrides that with "sequential", "vectorized" or a batched
variant of the rule. Values are compared with pure-JAX references, calls are
counted in the host code itself.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, randn

B = 5  # batch size


def _fft2_op(calls, op_vmap=None, rule_vmap=None):
    """Unnormalised 2-D DFT over the last two axes, linear; its transpose is itself."""
    def fn(x):
        calls.append(("fn", x.shape))
        return np.fft.fft2(x)

    def transpose(ct):
        calls.append(("transpose", ct.shape))
        return (np.fft.fft2(ct),)

    def vmap_rule(size, in_batched, x):
        calls.append(("vmap", x.shape))
        return np.fft.fft2(x), in_batched[0]

    op = ab.bind(fn, shape=ab.like(0), linear=True, vmap=op_vmap or vmap_rule)
    if op_vmap is not None:
        op.def_vmap(vmap_rule)
    op.def_transpose(transpose, vmap=rule_vmap)
    return op


def _mul_op(calls, **rule_vmaps):
    """x1·x2² with host jvp and vjp rules written for batched arrays and a vmap rule."""
    def vmap_rule(size, in_batched, x1, x2):
        calls.append(("vmap", x1.shape))
        x1 = x1 if in_batched[0] else x1[None]
        x2 = x2 if in_batched[1] else x2[None]
        return np.broadcast_to(x1 * x2**2, (size,) + x1.shape[1:]), True

    def jvp(primals, tangents):
        (x1, x2), (d1, d2) = primals, tangents
        calls.append(("jvp", d1.shape))
        return x2**2 * d1 + 2 * x1 * x2 * d2

    def vjp(primals, ct):
        x1, x2 = primals
        calls.append(("vjp", x1.shape))
        return x2**2 * ct, 2 * x1 * x2 * ct

    op = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap=vmap_rule)
    op.def_jvp(jvp, vmap=rule_vmaps.get("jvp"))
    op.def_vjp(vjp, vmap=rule_vmaps.get("vjp"))
    return op


def _complex(shape, seed=0):
    return randn(shape, np.complex128, seed=seed)


def test_vmap_rule_makes_rules_vectorized():
    """jit(grad(sum(vmap))) of a linear op with a vmap rule: one transpose call."""
    calls = []
    op = _fft2_op(calls)
    x = _complex((B, 4, 4))
    loss = lambda f: (lambda x: jnp.sum(jnp.real(jax.vmap(f)(x))))
    got = jax.jit(jax.grad(loss(op)))(x)
    assert_close(got, jax.grad(loss(jnp.fft.fft2))(x))
    assert calls == [("transpose", (B, 4, 4))]


def test_every_role_one_call_per_batch():
    calls = []
    op = _mul_op(calls)
    x1, x2 = randn((B, 3)), randn((B, 3), seed=1)
    d1, d2 = randn((B, 3), seed=2), randn((B, 3), seed=3)
    ref = lambda a, b: a * b**2
    got = jax.jit(jax.vmap(lambda *a: jax.jvp(op, a[:2], a[2:])))(x1, x2, d1, d2)
    assert_close(got, jax.vmap(lambda *a: jax.jvp(ref, a[:2], a[2:]))(x1, x2, d1, d2))
    assert sorted(c[0] for c in calls) == ["jvp", "vmap"]
    calls.clear()
    g = lambda f: jax.vmap(jax.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1)))
    assert_close(jax.jit(g(op))(x1, x2), g(ref)(x1, x2))
    assert [c[0] for c in calls] == ["vjp"] and calls[0][1] == (B, 3)
    calls.clear()  # an unbatched argument reaches the rule with a batch axis of length 1
    g1 = jax.vmap(jax.grad(lambda a, b: op(a, b).sum()), in_axes=(0, None))
    assert_close(jax.jit(g1)(x1, x2[0]),
                 jax.vmap(jax.grad(lambda a, b: ref(a, b).sum()), in_axes=(0, None))(x1, x2[0]))
    assert [c[0] for c in calls] == ["vjp"]


def test_sequential_when_asked():
    """vmap="sequential" at bind time, or on one rule, loops that role over the rows."""
    calls = []
    op = _fft2_op(calls, op_vmap="sequential")
    x = _complex((B, 4, 4))
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.real(jax.vmap(op)(x)))))
    assert_close(g(x), jax.grad(lambda x: jnp.sum(jnp.real(jax.vmap(jnp.fft.fft2)(x))))(x))
    assert calls == [("transpose", (4, 4))] * B
    calls.clear()
    op = _mul_op(calls, vjp="sequential")
    x1, x2 = randn((B, 3)), randn((B, 3), seed=1)
    jax.jit(jax.vmap(jax.grad(lambda a, b: op(a, b).sum())))(x1, x2)
    assert calls == [("vjp", (3,))] * B
    calls.clear()
    jax.jit(jax.vmap(lambda a, b, d: jax.jvp(op, (a, b), (d, d))))(x1, x2, x1)
    assert ("jvp", (B, 3)) in calls


def test_batched_variant_of_a_rule():
    """A rule's vmap= may be a host function run as its batched variant."""
    calls = []
    op = _fft2_op(calls, rule_vmap=lambda ct: (calls.append(("batched", ct.shape)),
                                               (np.fft.fft2(ct),))[1])
    x = _complex((B, 4, 4))
    t = jax.linear_transpose(jax.vmap(op), x)
    assert_close(jax.jit(t)(x), jax.linear_transpose(jax.vmap(jnp.fft.fft2), x)(x))
    assert calls == [("batched", (B, 4, 4))]
    calls.clear()
    jax.linear_transpose(op, x[0])(x[0])  # unbatched: the rule itself
    assert calls == [("transpose", (4, 4))]


def test_bad_rule_vmap_is_an_error():
    op = ab.bind(np.sin, shape=ab.like(0), name="sin_bad_vmap")
    with pytest.raises(ValueError, match="sin_bad_vmap.*def_jvp's vmap must be"):
        op.def_jvp(lambda p, t: np.cos(p[0]) * t[0], vmap="batched")
