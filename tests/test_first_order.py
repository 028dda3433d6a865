"""First-order derivatives of every op: jvp, vjp, grad, value_and_grad, linearize,
jacfwd, jacrev, and linear_transpose of the tangent map.

Each is checked against the pure-JAX reference's derivative, and jvp/vjp also
numerically: the JVP against central differences and the VJP against the JVP
through ⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
import ops
from helpers import (
    assert_tree_close,
    check_first_order,
    check_jvp_fd,
    check_transpose_identity,
    randn,
    tree_randn_like,
)
from ops import CASES

CASE_NAMES = list(CASES)
RTOL = 1e-9


def _loss(f):
    """A real scalar of every inexact output leaf, nonlinear and with a generic cotangent."""
    def loss(*args):
        total = 0.0
        for i, o in enumerate(jax.tree.leaves(f(*args))):
            if jnp.issubdtype(o.dtype, jnp.inexact):
                c = jnp.asarray(randn(o.shape, o.dtype, seed=50 + i))
                total = total + jnp.sum(jnp.real(o * c)) + jnp.sum(jnp.abs(o) ** 2)
        return total
    return loss


def _argnums(case):
    return tuple(range(len(case.args())))


def _holomorphic(case):
    return any(jnp.iscomplexobj(l) for l in jax.tree.leaves(case.args()))


@pytest.mark.parametrize("wrap", ["eager", "jit"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_jvp_against_differences_and_vjp_against_jvp(name, wrap):
    case = CASES[name]
    f = case.op()
    check_first_order(jax.jit(f) if wrap == "jit" else f, case.args(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_jvp_matches_reference(name):
    case = CASES[name]
    args = case.args()
    tangents = tree_randn_like(args, seed=3)
    assert_tree_close(jax.jvp(case.op(), args, tangents),
                      jax.jvp(case.reference(), args, tangents), rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_vjp_matches_reference(name):
    case = CASES[name]
    args = case.args()
    out, pullback = jax.vjp(case.op(), *args)
    ref_out, ref_pullback = jax.vjp(case.reference(), *args)
    ybar = tree_randn_like(ref_out, seed=4)
    assert_tree_close(out, ref_out)
    assert_tree_close(pullback(ybar), ref_pullback(ybar), rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("wrap", ["eager", "jit"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_grad_and_value_and_grad(name, wrap):
    case = CASES[name]
    args = case.args()
    t = jax.jit if wrap == "jit" else (lambda f: f)
    argnums = _argnums(case)
    g = t(jax.grad(_loss(case.op()), argnums=argnums))(*args)
    v, g2 = t(jax.value_and_grad(_loss(case.op()), argnums=argnums))(*args)
    ref_v, ref_g = jax.value_and_grad(_loss(case.reference()), argnums=argnums)(*args)
    assert_tree_close(g, ref_g, rtol=RTOL, atol=RTOL)
    assert_tree_close(g2, ref_g, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(v, ref_v, rtol=1e-12)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_linearize(name):
    case = CASES[name]
    args = case.args()
    out, f_lin = jax.linearize(case.op(), *args)
    ref_out, ref_lin = jax.linearize(case.reference(), *args)
    assert_tree_close(out, ref_out)
    for seed in (5, 6):  # the linear function can be evaluated again
        t = tree_randn_like(args, seed=seed)
        assert_tree_close(f_lin(*t), ref_lin(*t), rtol=RTOL, atol=RTOL)
    t = tree_randn_like(args, seed=7)
    assert_tree_close(jax.jit(f_lin)(*t), ref_lin(*t), rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_linear_transpose_of_tangent_map(name):
    """Transposing the linearized op gives its vjp (the tangent primitive transposes)."""
    case = CASES[name]
    args = case.args()
    out, f_lin = jax.linearize(case.op(), *args)
    _, ref_pullback = jax.vjp(case.reference(), *args)
    ybar = tree_randn_like(out, seed=8)
    ybar = jax.tree.map(lambda y, o: y if jnp.issubdtype(o.dtype, jnp.inexact) else
                        np.zeros(o.shape, jax.dtypes.float0), ybar, out)
    float_out = [jnp.issubdtype(o.dtype, jnp.inexact) for o in jax.tree.leaves(out)]
    if not all(float_out):  # linear_transpose wants cotangents for the float outputs only
        f_float = lambda *t: [o for o, fl in zip(jax.tree.leaves(f_lin(*t)), float_out) if fl]
        ybar = [y for y, fl in zip(jax.tree.leaves(ybar), float_out) if fl]
    else:
        f_float = f_lin
    transposed = jax.linear_transpose(f_float, *args)(ybar)
    want = ref_pullback(jax.tree.unflatten(jax.tree.structure(out), [
        y if fl else np.zeros(o.shape, jax.dtypes.float0)
        for y, o, fl in zip(_fill(ybar, float_out), jax.tree.leaves(out), float_out)]))
    assert_tree_close(transposed, want, rtol=RTOL, atol=RTOL)


def _fill(present, mask):
    it = iter(jax.tree.leaves(present))
    return [next(it) if m else None for m in mask]


def _float_outputs(f):
    return lambda *a: [o for o in jax.tree.leaves(f(*a)) if jnp.issubdtype(o.dtype, jnp.inexact)]


@pytest.mark.parametrize("jac", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_jacobians(name, jac):
    case = CASES[name]
    args = case.args()
    j = getattr(jax, jac)
    kw = dict(argnums=_argnums(case), holomorphic=_holomorphic(case))
    got = jax.jit(j(_float_outputs(case.op()), **kw))(*args)
    want = jax.jit(j(_float_outputs(case.reference()), **kw))(*args)
    assert_tree_close(got, want, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("jac", ["jacfwd", "jacrev"])
def test_jacobian_under_jit(jac):
    case = CASES["mul"]
    got = jax.jit(getattr(jax, jac)(case.op(), argnums=(0, 1)))(*case.args())
    want = getattr(jax, jac)(case.reference(), argnums=(0, 1))(*case.args())
    assert_tree_close(got, want, rtol=RTOL, atol=RTOL)


# ------------------------------------------------------------ symbolic zeros

@pytest.mark.parametrize("argnum", [0, 1])
def test_grad_with_respect_to_one_argument(argnum):
    """The other argument's cotangent is not needed: the rule's result for it is dropped."""
    case = CASES["mul"]
    args = case.args()
    g = jax.grad(_loss(case.op()), argnums=argnum)(*args)
    want = jax.grad(_loss(case.reference()), argnums=argnum)(*args)
    np.testing.assert_allclose(g, want, rtol=RTOL)


@pytest.mark.parametrize("argnum", [0, 1])
def test_jvp_with_one_zero_tangent(argnum):
    """A symbolic-zero tangent reaches a host jvp rule as a zero array."""
    seen = []

    def jvp(primals, tangents):
        seen.append([np.asarray(t).copy() for t in tangents])
        (x1, x2), (d1, d2) = primals, tangents
        return x2**2 * d1 + 2 * x1 * x2 * d2

    op = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), jvp=jvp, name="mul_zero_t")
    x1, x2 = randn(3), randn(3, seed=1)
    dx = randn(3, seed=2)
    f = (lambda a: op(a, x2)) if argnum == 0 else (lambda b: op(x1, b))
    _, t = jax.jvp(f, ((x1, x2)[argnum],), (dx,))
    want = x2**2 * dx if argnum == 0 else 2 * x1 * x2 * dx
    np.testing.assert_allclose(t, want, rtol=RTOL)
    (d1, d2), = seen
    np.testing.assert_array_equal((d1, d2)[1 - argnum], np.zeros(3))


def test_zero_cotangent_reaches_vjp_rule_as_zeros():
    """Cotangent of an unused output arrives as zeros in a multi-output op."""
    seen = []
    case = CASES["tree"]

    def vjp(primals, ct):
        seen.append([np.asarray(c).copy() for c in ct])
        return ops.tree_vjp(primals, ct)

    op = ab.bind(ops.tree_fn, shape=ops.tree_shape, vjp=vjp, name="tree_zero_ct")
    d, = case.args()
    g = jax.grad(lambda d: op(d)[1].sum())(d)
    want = jax.grad(lambda d: case.ref(d)[1].sum())(d)
    assert_tree_close(g, want, rtol=RTOL)
    (c0, c1), = seen
    np.testing.assert_array_equal(c0, np.zeros((2, 3)))
    np.testing.assert_array_equal(c1, np.ones(2))


def test_integer_positional_argument_gets_float0():
    """Integer inputs: None reaches the rules, float0 leaves JAX; the float input differentiates."""
    seen = []

    def jvp(primals, tangents):
        seen.append(tangents[1])
        return tangents[0] * primals[1]

    def vjp(primals, ct):
        return ct * primals[1], None

    op = ab.bind(lambda x, n: x * n, shape=ab.like(0), jvp=jvp, vjp=vjp, name="times_n")
    x, n = randn(3), np.array([1, 2, 3])
    _, t = jax.jvp(op, (x, n), (randn(3, seed=1), np.zeros(3, jax.dtypes.float0)))
    np.testing.assert_allclose(t, randn(3, seed=1) * n, rtol=RTOL)
    assert seen == [None]
    _, pullback = jax.vjp(op, x, n)
    gx, gn = pullback(np.ones(3))
    np.testing.assert_allclose(gx, n)
    assert gn.dtype == jax.dtypes.float0 and gn.shape == (3,)
    np.testing.assert_allclose(jax.jacfwd(op)(x, n), np.diag(n.astype(float)))
    np.testing.assert_allclose(jax.jacrev(op)(x, n), np.diag(n.astype(float)))


def test_integer_output_has_float0_tangent():
    case = CASES["sort"]
    x, = case.args()
    (s, i), (ts, ti) = jax.jvp(case.op(), (x,), (randn(5, seed=1),))
    assert ti.dtype == jax.dtypes.float0
    assert i.dtype == np.int64
    np.testing.assert_allclose(ts, randn(5, seed=1)[np.argsort(x)], rtol=RTOL)


@pytest.mark.parametrize("traced", [False, True])
def test_rules_may_return_none_for_zero(traced):
    """None from a jvp (whole output) or vjp (whole argument) means zero."""
    op = ab.bind(lambda x, y: (x * 0 + 1, y * 2),
                 shape=lambda x, y: (x, y), name=f"none_rules_{traced}")
    op.def_jvp(lambda p, t: (None, 2 * t[1]), traced=traced)
    op.def_vjp(lambda p, ct: (None, 2 * ct[1]), traced=traced)
    x, y = randn(3), randn(2, seed=1)
    (_, _), (t0, t1) = jax.jvp(op, (x, y), (x, y))
    np.testing.assert_array_equal(t0, np.zeros(3))
    np.testing.assert_allclose(t1, 2 * y)
    gx, gy = jax.grad(lambda x, y: op(x, y)[0].sum() + op(x, y)[1].sum(), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, np.zeros(3))
    np.testing.assert_allclose(gy, 2 * np.ones(2))


# ------------------------------------------------------------------ complex

def _complex_ops():
    """Host z ↦ z², holomorphic, and z ↦ z·z̄ + z̄ (real-linear in z, not complex-linear)."""
    sq = ab.bind(np.square, shape=ab.like(0), name="csquare",
                 jvp=lambda p, t: 2 * p[0] * t[0], vjp=lambda p, ct: (2 * p[0] * ct,))
    # JAX transposes real-linear maps: t ↦ a·t + b·t̄ has transpose c ↦ a·c + conj(b·c)…
    # here f(z) = z z̄ + z̄, df = z̄ dz + z dz̄ + dz̄; its JAX vjp is ȳ ↦ z̄ ȳ + conj(z ȳ + ȳ)
    nh = ab.bind(lambda z: z * np.conj(z) + np.conj(z), shape=ab.like(0), name="cnonholo",
                 jvp=lambda p, t: np.conj(p[0]) * t[0] + p[0] * np.conj(t[0]) + np.conj(t[0]),
                 vjp=lambda p, ct: (np.conj(p[0]) * ct + np.conj(p[0] * ct + ct),))
    return {"square": (sq, jnp.square),
            "nonholo": (nh, lambda z: z * jnp.conj(z) + jnp.conj(z))}


@pytest.mark.parametrize("which", ["square", "nonholo"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_derivatives_follow_jax_convention(which, dtype):
    op, ref = _complex_ops()[which]
    z = randn(3, dtype)
    tol = 1e-5 if dtype == np.complex64 else 1e-12
    check_transpose_identity(op, z, randn(3, dtype, seed=1), randn(3, dtype, seed=2),
                             rtol=tol, atol=tol)
    assert_tree_close(jax.jvp(op, (z,), (randn(3, dtype, seed=1),)),
                      jax.jvp(ref, (z,), (randn(3, dtype, seed=1),)), rtol=tol, atol=tol)
    loss = lambda f: (lambda z: jnp.sum(jnp.abs(f(z)) ** 2 + jnp.real(f(z))))
    assert_tree_close(jax.grad(loss(op))(z), jax.grad(loss(ref))(z), rtol=tol, atol=tol)


def test_complex_jvp_against_differences():
    op, _ = _complex_ops()["nonholo"]
    check_jvp_fd(op, randn(3, np.complex128), randn(3, np.complex128, seed=1))


def test_op_with_only_integer_outputs_needs_no_rules():
    """Integer outputs are not differentiable: differentiating through them needs no rule."""
    argsort = ab.bind(lambda x: np.argsort(x, axis=-1, kind="stable"), name="argsort_only",
                      shape=lambda x: jax.ShapeDtypeStruct(x.shape, np.int64))
    f = lambda x: jnp.sum(jnp.take_along_axis(x, argsort(x), -1) * jnp.arange(5.0))
    ref = lambda x: jnp.sum(jnp.sort(x) * jnp.arange(5.0))
    x = randn(5)
    assert_tree_close(jax.grad(f)(x), jax.grad(ref)(x), rtol=RTOL)
    assert_tree_close(jax.jvp(f, (x,), (x,)), jax.jvp(ref, (x,), (x,)), rtol=RTOL)
    xs = np.stack([x, -x])
    assert_tree_close(jax.vmap(jax.grad(f))(xs), jax.vmap(jax.grad(ref))(xs), rtol=RTOL)


def test_op_with_no_outputs_needs_no_rules():
    """A logging op (no outputs, side effect) inside a differentiated function."""
    logged = []
    log = ab.bind(lambda x: logged.append(float(np.sum(x))) or (), shape=(),
                  has_side_effect=True, name="log_only")
    f = lambda x: (log(x), jnp.sum(2 * x))[1]
    np.testing.assert_allclose(jax.grad(f)(randn(3)), 2 * np.ones(3))
    np.testing.assert_allclose(jax.jvp(f, (randn(3),), (np.ones(3),))[1], 6.0)
    assert len(logged) == 2
