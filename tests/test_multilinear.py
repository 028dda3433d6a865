"""multilinear=True ops: linear in each argument separately, one transpose per argument.

The function and its transposes alone give jvp, grad, jacfwd, jacrev, hessian,
mixed and third derivatives, linear_transpose in each argument and transposes
of those, under jit and vmap, for host and traced transposes and for traced
functions that JAX transposes. Ops (``ops.MULTILINEAR_CASES``): JAXbind's
two-output product (x, y) ↦ (x·y, x·y), a matrix–vector product linear in the
matrix and in the vector, and a complex trilinear map with a pytree argument.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, randn, realify, tree_inner, tree_randn_like
from ops import MULTILINEAR_CASES, VMAP_MODES, multilinear_op

NAMES = list(MULTILINEAR_CASES)
KINDS = ("host", "traced", "jax")
TOL = dict(rtol=1e-10, atol=1e-10)


def _op(name, mode="vectorized", kind="host"):
    return multilinear_op(name, mode, kind)


def _loss(f, build):
    """A smooth non-quadratic real scalar of one real vector, through f."""
    return lambda v: sum(jnp.sum(jnp.abs(o) ** 2 + jnp.real(o) ** 3)
                         for o in jax.tree.leaves(f(*build(v))))


# ----------------------------------------------------------- derivatives

@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_jvp_is_the_sum_over_arguments(name, mode):
    case = MULTILINEAR_CASES[name]
    args, t = case.args(), tree_randn_like(case.args(), seed=3)
    got = jax.jvp(_op(name, mode), args, t)
    assert_tree_close(got, jax.jvp(case.ref, args, t), **TOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_grad_and_hessian(name, kind):
    case = MULTILINEAR_CASES[name]
    v, build = realify(case.args())
    f, ref = _loss(_op(name, kind=kind), build), _loss(case.ref, build)
    both = lambda g: jax.jit(lambda v: (jax.grad(g)(v), jax.hessian(g)(v)))
    assert_tree_close(both(f)(v), both(ref)(v), **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_mixed_second_derivatives(name):
    """Forward over reverse and reverse over forward, per pair of arguments."""
    case = MULTILINEAR_CASES[name]
    args = case.args()
    n = len(args)
    f = lambda *a: jnp.sum(jnp.real(jax.tree.leaves(_op(name)(*a))[0]) ** 3)
    ref = lambda *a: jnp.sum(jnp.real(jax.tree.leaves(case.ref(*a))[0]) ** 3)
    real = lambda t: jax.tree.map(jnp.real, t)  # complex leaves: the real directions
    args = real(args)
    mixed = lambda g: jax.jit(lambda *a: [
        (jax.jacfwd(jax.jacrev(g, argnums=i), argnums=(i + 1) % n)(*a),
         jax.jacrev(jax.jacfwd(g, argnums=i), argnums=(i + 1) % n)(*a)) for i in range(n)])
    assert_tree_close(mixed(f)(*args), mixed(ref)(*args), **TOL)


def test_third_derivative_from_host_rules():
    case = MULTILINEAR_CASES["matvec2"]
    v, build = realify(case.args())
    f, ref = _loss(_op("matvec2"), build), _loss(case.ref, build)
    assert_tree_close(jax.jit(jax.jacfwd(jax.hessian(f)))(v),
                      jax.jit(jax.jacfwd(jax.hessian(ref)))(v), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_transpose_identity(name):
    case = MULTILINEAR_CASES[name]
    args = case.args()
    f = _op(name)
    dargs, ybar = tree_randn_like(args, seed=5), tree_randn_like(f(*args), seed=6)
    _, t = jax.jvp(f, args, dargs)
    xbar = jax.vjp(f, *args)[1](ybar)
    np.testing.assert_allclose(tree_inner(ybar, t), tree_inner(xbar, dargs), rtol=1e-10)


# ------------------------------------------------------------- transposes

def _in_argument(f, args, i):
    """f as a function of argument i alone, the others fixed at ``args``."""
    return lambda x: f(*args[:i], x, *args[i + 1:])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_linear_transpose_in_each_argument(name, kind):
    case = MULTILINEAR_CASES[name]
    args, f = case.args(), _op(name, kind=kind)
    ybar = tree_randn_like(case.ref(*args), seed=7)
    for i in range(len(args)):
        t = jax.linear_transpose(_in_argument(f, args, i), args[i])
        want = jax.linear_transpose(_in_argument(case.ref, args, i), args[i])(ybar)
        assert_tree_close(jax.jit(t)(ybar), want, **TOL)
        (back,) = jax.linear_transpose(t, ybar)((args[i],))  # the transpose's transpose is f
        assert_tree_close(back, case.ref(*args), **TOL)


@pytest.mark.parametrize("name", ["matvec2", "trimul"])
def test_derivatives_of_a_transpose(name):
    """f_transpose is multilinear in the fixed arguments and ȳ: its own derivatives."""
    case = MULTILINEAR_CASES[name]
    args = case.args()
    ybar = tree_randn_like(case.ref(*args), seed=8)

    def t_of(f):
        def t(*a):  # argument 0's cotangent as a function of the others and ȳ
            *rest, y = a
            return jax.linear_transpose(lambda x: f(x, *rest), args[0])(y)[0]
        return t

    a = (*args[1:], ybar)
    da = tree_randn_like(a, seed=9)
    assert_tree_close(jax.jit(lambda a, da: jax.jvp(t_of(_op(name)), a, da))(a, da),
                      jax.jvp(t_of(case.ref), a, da), **TOL)
    g = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.abs(jax.tree.leaves(t_of(f)(*a))[0])
                                                      ** 2), argnums=tuple(range(len(a)))))
    assert_tree_close(g(_op(name))(*a), g(case.ref)(*a), **TOL)


# ------------------------------------------------------------------ vmap

@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_vmap_of_grad_and_grad_of_vmap(name, mode):
    case = MULTILINEAR_CASES[name]
    args = case.batched_args(3)
    n = len(args)
    in_axes = (0,) + (None,) * (n - 1)  # the first argument batched, the others shared
    args = (args[0],) + tuple(jax.tree.map(lambda l: l[0], a) for a in args[1:])
    s = lambda f: (lambda *a: sum(jnp.sum(jnp.abs(o) ** 2) for o in jax.tree.leaves(f(*a))))
    argnums = tuple(range(n))
    vg = lambda f: jax.jit(jax.vmap(jax.grad(s(f), argnums=argnums), in_axes=in_axes))
    gv = lambda f: jax.jit(jax.grad(s(jax.vmap(f, in_axes=in_axes)), argnums=argnums))
    op = _op(name, mode)
    assert_tree_close(vg(op)(*args), vg(case.ref)(*args), **TOL)
    assert_tree_close(gv(op)(*args), gv(case.ref)(*args), **TOL)


def test_vmap_of_hessian_traced_transposes():
    case = MULTILINEAR_CASES["matvec2"]
    a, x = case.batched_args(2)
    f = lambda g: (lambda a, x: jnp.sum(jnp.sin(g(a, x))))
    h = lambda g: jax.jit(jax.vmap(jax.hessian(f(g), argnums=(0, 1))))
    assert_tree_close(h(_op("matvec2", "rule", "traced"))(a, x), h(case.ref)(a, x), **TOL)


# ------------------------------------------------------------------ errors

def test_joint_transpose_is_an_error():
    args, f = MULTILINEAR_CASES["matvec2"].args(), _op("matvec2")
    with pytest.raises(TypeError, match="multilinear.*separately.*argument 0, argument 1"):
        jax.linear_transpose(f, *args)(np.ones(3))


def test_missing_transpose_names_the_argument():
    op = ab.bind(lambda x, y: x * y, shape=ab.like(0), multilinear=True, name="half_mul")
    op.def_transpose(lambda p, ct: ct * p[1], argnum=0)
    x, y = randn(3), randn(3, seed=1)
    np.testing.assert_allclose(jax.grad(lambda x: op(x, y).sum())(x), y)
    with pytest.raises(ab.MissingRuleError, match="half_mul.*argument 1.*argnum=1"):
        jax.grad(lambda y: op(x, y).sum())(y)


def test_declaration_errors():
    op = ab.bind(lambda x, y: x * y, shape=ab.like(0), multilinear=True, name="ml_mul")
    with pytest.raises(TypeError, match="ml_mul.*argnum=i"):
        op.def_transpose(lambda p, ct: ct)
    with pytest.raises(TypeError, match="ml_mul.*multilinear.*def_jvp does not apply"):
        op.def_jvp(lambda p, t: t[0])
    with pytest.raises(TypeError, match="exclude each other"):
        ab.bind(lambda x, y: x * y, shape=ab.like(0), multilinear=True, linear=(0,))
    with pytest.raises(TypeError, match="argnum=.*multilinear=True"):
        ab.bind(np.negative, shape=ab.like(0), linear=True).def_transpose(
            lambda ct: (-ct,), argnum=0)
    with pytest.raises(TypeError, match="ml_mul.*multilinear=True.*floating"):
        op(np.arange(3), np.arange(3))


def test_transpose_rule_of_the_wrong_structure():
    op = ab.bind(lambda d, y: d["a"] * y, shape=ab.like(1), multilinear=True, name="ml_tree",
                 transpose=(lambda p, ct: ct * p[1], lambda p, ct: ct * p[0]["a"]))
    d, y = {"a": randn(3)}, randn(3, seed=1)
    with pytest.raises(Exception, match="ml_tree.*transpose rule for argument 0.*structured"):
        jax.grad(lambda d: op(d, y).sum())(d)


def test_keyword_operand_is_not_differentiable():
    op = ab.bind(lambda x, y, *, w: w * x * y, shape=ab.like(0), multilinear=True,
                 name="ml_kw", transpose=(lambda p, ct, *, w: w * ct * p[1],
                                          lambda p, ct, *, w: w * ct * p[0]))
    x, y, w = randn(3), randn(3, seed=1), randn(3, seed=2)
    np.testing.assert_allclose(jax.grad(lambda x: op(x, y, w=w).sum())(x), w * y, **TOL)
    with pytest.raises(TypeError, match="ml_kw.*keyword argument is a non-differentiable"):
        jax.grad(lambda w: op(x, y, w=w).sum())(w)


# ---------------------------------------------------------------- ab.check

@pytest.mark.parametrize("kind", KINDS)
def test_check_passes_with_every_order(kind):
    report = ab.check(_op("matvec2", kind=kind), *MULTILINEAR_CASES["matvec2"].args())
    checks = {(r.check, r.where) for r in report.rows if r.status == "ok"}
    for where in ("argument 0", "argument 1"):
        assert ("linearity", where) in checks and ("transpose", where) in checks
    assert ("hessian symmetry", "forward over reverse") in checks


def test_check_catches_a_wrong_transpose():
    bad = ab.bind(lambda x, y: x * y, shape=ab.like(0), multilinear=True, name="ml_bad",
                  transpose=(lambda p, ct: ct * p[1], lambda p, ct: 2 * ct * p[0]))
    with pytest.raises(ab.RuleError, match="transpose rule for argument 1") as e:
        ab.check(bad, randn(3), randn(3, seed=1))
    assert (e.value.check, e.value.where) == ("transpose", "argument 1")


@pytest.mark.parametrize("linear", [True, (0, 1)])
def test_check_names_multilinear_for_a_joint_declaration(linear):
    """x·y is not linear in (x, y) jointly: ab.check says which declaration fits."""
    rules = (dict(transpose=lambda ct: (ct, ct)) if linear is True else
             dict(jvp=lambda p, t: p[1] * t[0] + p[0] * t[1],
                  vjp=lambda p, ct: (p[1] * ct, p[0] * ct)))
    op = ab.bind(lambda x, y: x * y, shape=ab.like(0), linear=linear, name="joint_mul",
                 **rules)
    with pytest.raises(ab.RuleError, match="linear in each argument.*multilinear=True") as e:
        ab.check(op, randn(3), randn(3, seed=1))
    assert e.value.check == "linearity"
