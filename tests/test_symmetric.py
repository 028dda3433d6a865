"""symmetric=True: the jvp rule is also the vjp, for host and traced rules.

Ops: the gradient of a potential φ(x) = ½xᵀAx + Σ cos x (host jvp rule, host
or traced), the same in JAX with no rules (JAX's jvp serves as the vjp), a
holomorphic complex map with a complex-symmetric Jacobian, and a host FFT
declared linear and symmetric (its own transpose). Each is compared with a
pure-JAX reference in forward and reverse mode, under vmap and to second
order where the rule is traced.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, check_transpose_identity, randn

N = 5
A = randn((N, N), seed=3)
A = A + A.T
TOL = dict(rtol=1e-10, atol=1e-10)


def grad_phi_ref(x):
    return x @ A.T - jnp.sin(x)


def grad_phi(mode: str = "vectorized", traced_rule: bool = False):
    """x ↦ ∇φ(x) on the host; ∂f(x)·ẋ = A·ẋ − cos(x)·ẋ, a symmetric matrix."""
    op = ab.bind(lambda x: x @ A.T - np.sin(x), shape=ab.like(0), symmetric=True,
                 vmap=mode, name="grad_phi_t" if traced_rule else "grad_phi")
    xp = jnp if traced_rule else np
    op.def_jvp(lambda p, t: t[0] @ A.T - xp.cos(p[0]) * t[0], traced=traced_rule)
    return op


def traced_grad_phi():
    """∇φ in JAX with no rules: JAX's jvp is the rule, and serves as the vjp."""
    return ab.bind(grad_phi_ref, traced=True, symmetric=True, name="grad_phi_jax")


@pytest.mark.parametrize("mode", ["vectorized", "sequential"])
def test_host_rule_gives_reverse_mode(mode):
    f, x = grad_phi(mode), randn(N, seed=1)
    assert_close(jax.jacrev(f)(x), jax.jacfwd(grad_phi_ref)(x), **TOL)
    check_transpose_identity(f, x, randn(N, seed=2), randn(N, seed=4))
    xs = np.stack([x, 2 * x, -x])
    loss = lambda g: lambda x: jnp.sum(g(x) ** 2)
    assert_close(jax.jit(jax.vmap(jax.grad(loss(f))))(xs),
                 jax.vmap(jax.grad(loss(grad_phi_ref)))(xs), **TOL)
    assert_close(jax.grad(lambda x: loss(f)(x).sum())(xs), jax.grad(
        lambda x: loss(grad_phi_ref)(x).sum())(xs), **TOL)  # one call on a batch


@pytest.mark.slow  # tens of seconds: derivatives to every order
@pytest.mark.parametrize("make", [lambda: grad_phi(traced_rule=True), traced_grad_phi],
                         ids=["host fn, traced jvp rule", "traced fn, no rules"])
def test_traced_rule_every_order(make):
    f, x = make(), randn(N, seed=1)
    loss = lambda g: lambda x: jnp.sum(jnp.cos(g(x)))
    assert_close(jax.hessian(loss(f))(x), jax.hessian(loss(grad_phi_ref))(x), **TOL)
    xs = np.stack([x, 0.5 * x])
    assert_close(jax.vmap(jax.hessian(loss(f)))(xs),
                 jax.vmap(jax.hessian(loss(grad_phi_ref)))(xs), **TOL)
    if f.traced:  # reverse over reverse, and ab.check's rows (one case is enough)
        assert_close(jax.jacrev(jax.jacrev(f))(x), jax.jacfwd(jax.jacfwd(grad_phi_ref))(x),
                     **TOL)
        report = ab.check(f, x)
        assert [r.status for r in report.rows if r.check == "symmetry"] == ["ok"]


def test_reverse_mode_runs_the_jvp_rule_not_its_transpose():
    """grad of a traced symmetric op calls the op's own vjp primitive: JAX does not
    transpose (and store the residuals of) the traced jvp."""
    f = traced_grad_phi()
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(f(x) ** 2)))(randn(N)))
    assert "grad_phi_jax_vjp" in jaxpr and "transpose" not in jaxpr


def test_scan_residuals_are_not_stored():
    """A chunked sum (scan) in reverse mode: JAX's own vjp keeps every chunk's
    residuals, the symmetric op only what forward mode needs."""
    def pair_force(x, chunk=32):
        def body(_, i):
            xi = jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk)
            d = x[None, :] - xi[:, None]
            return None, jnp.sum(d / (d**2 + 0.1) ** 1.5, axis=1)
        return jnp.concatenate(jax.lax.scan(body, None, jnp.arange(x.size // chunk))[1])
    op = ab.bind(pair_force, traced=True, symmetric=True, name="pair_force")
    x = randn(1024, seed=5)
    loss = lambda g: lambda x: jnp.sum(g(x) ** 2)
    mem = lambda g: jax.jit(jax.grad(loss(g))).lower(x).compile().memory_analysis() \
        .temp_size_in_bytes
    assert_close(jax.grad(loss(op))(x), jax.grad(loss(pair_force))(x), rtol=1e-9, atol=1e-9)
    assert mem(op) * 8 < mem(pair_force)


def test_complex_symmetric_not_hermitian():
    """f(z) = A·z + z²/2 with A = Aᵀ complex: JAX's vjp (no conjugation) is the jvp."""
    a = randn((4, 4), np.complex128, seed=6)
    a = a + a.T
    ref = lambda z: a @ z + z**2 / 2
    f = ab.bind(lambda z: a @ z + z**2 / 2, shape=ab.like(0), symmetric=True, name="csym",
                jvp=lambda p, t: a @ t[0] + p[0] * t[0])
    z, ybar = randn(4, np.complex128, seed=7), randn(4, np.complex128, seed=8)
    assert_close(jax.vjp(f, z)[1](ybar), jax.vjp(ref, z)[1](ybar), **TOL)
    assert ab.check(f, z).ok
    b = randn((4, 4), np.complex128, seed=11)
    h = b + b.T.conj()  # Hermitian, not symmetric
    bad = ab.bind(lambda z: h @ z, shape=ab.like(0), symmetric=True, name="herm",
                  jvp=lambda p, t: h @ t[0])
    with pytest.raises(ab.RuleError) as e:
        ab.check(bad, z)
    assert e.value.check == "symmetry"


def test_linear_symmetric_is_its_own_transpose():
    """The unnormalised DFT matrix is symmetric: a host FFT needs no transpose rule."""
    fft = ab.bind(lambda z: np.fft.fft(z, axis=-1), shape=ab.like(0), linear=True,
                  symmetric=True, vmap="vectorized", name="fft_sym")
    z, ybar = randn(6, np.complex128, seed=9), randn(6, np.complex128, seed=10)
    assert_close(jax.linear_transpose(fft, z)(ybar), jax.linear_transpose(jnp.fft.fft, z)(ybar),
                 **TOL)
    zs = np.stack([z, 2j * z])
    assert_close(jax.vmap(jax.grad(lambda z: jnp.sum(jnp.abs(fft(z)) ** 2)))(zs),
                 jax.vmap(jax.grad(lambda z: jnp.sum(jnp.abs(jnp.fft.fft(z)) ** 2)))(zs), **TOL)
    assert ab.check(fft, z).ok


def test_errors():
    x = randn(3)
    two = ab.bind(lambda x, y: x + y, shape=ab.like(0), symmetric=True, name="two_args",
                  jvp=lambda p, t: t[0] + t[1])
    with pytest.raises(TypeError, match=r"'two_args' is declared symmetric=True.*square.*2 "
                                        r"positional"):
        two(x, x)
    wide = ab.bind(lambda x: np.concatenate([x, x]),
                   shape=lambda x: jax.ShapeDtypeStruct((2 * x.shape[0],), x.dtype),
                   symmetric=True, name="wide", jvp=lambda p, t: np.concatenate([t[0]] * 2))
    with pytest.raises(TypeError, match=r"'wide'.*float64\[3\].*float64\[6\]"):
        wide(x)
    both = ab.bind(np.sin, shape=ab.like(0), symmetric=True, name="both",
                   jvp=lambda p, t: np.cos(p[0]) * t[0], vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    with pytest.raises(TypeError, match=r"'both'.*cannot also have a vjp rule"):
        both(x)
    norule = ab.bind(np.sin, shape=ab.like(0), symmetric=True, name="norule")
    with pytest.raises(ab.MissingRuleError, match="no derivative rules"):
        jax.grad(lambda x: norule(x).sum())(x)
    host = grad_phi()
    with pytest.raises(ab.MissingRuleError, match=r"def_jvp\(rule, traced=True\)"):
        jax.hessian(lambda x: host(x).sum())(randn(N))
