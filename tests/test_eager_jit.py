"""Plain calls: eager and under jit, against the pure-JAX reference of every op."""
import jax
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, randn
from ops import CASES

CASE_NAMES = list(CASES)


@pytest.mark.parametrize("wrap", ["eager", "jit"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_matches_reference(name, wrap):
    case = CASES[name]
    f = case.op()
    if wrap == "jit":
        f = jax.jit(f)
    assert_tree_close(f(*case.args()), case.reference()(*case.args()))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_output_structure_and_types(name):
    """Outputs come back as the declared pytree of jax.Arrays with the declared dtypes."""
    case = CASES[name]
    out = case.op()(*case.args())
    ref = case.reference()(*case.args())
    assert jax.tree.structure(out) == jax.tree.structure(ref)
    for o in jax.tree.leaves(out):
        assert isinstance(o, jax.Array)


def test_static_keywords_select_the_computation():
    """Different static values are different calls: each one gets its own result."""
    op = CASES["scale"].make("vectorized")
    x, w = randn((2, 3)), randn((2, 3), seed=1)
    for power, axis in [(1, -1), (2, -1), (3, -2), (2, 0)]:
        ref = (w * x**power).sum(axis=axis)
        np.testing.assert_allclose(op(x, w=w, power=power, axis=axis), ref, rtol=1e-12)
        np.testing.assert_allclose(jax.jit(lambda x, w: op(x, w=w, power=power, axis=axis))(x, w),
                                   ref, rtol=1e-12)


def test_static_keyword_reaches_function_and_rules():
    seen = []

    def fn(x, *, tag):
        seen.append(("fn", tag))
        return x * 2

    def jvp(primals, tangents, *, tag):
        seen.append(("jvp", tag))
        return 2 * tangents[0]

    def vjp(primals, ct, *, tag):
        seen.append(("vjp", tag))
        return (2 * ct,)

    op = ab.bind(fn, shape=ab.like(0), jvp=jvp, vjp=vjp, name="tagged")
    x = randn(3)
    op(x, tag="a")
    jax.jvp(lambda x: op(x, tag="b"), (x,), (x,))
    jax.grad(lambda x: op(x, tag="c").sum())(x)
    assert ("fn", "a") in seen and ("jvp", "b") in seen and ("vjp", "c") in seen


def test_array_keyword_is_an_operand_not_a_constant():
    """Keyword arrays are traced: one compilation serves different values."""
    op = CASES["matvec"].make("vectorized")
    x = randn(3)
    f = jax.jit(lambda x, a: op(x, a=a))
    for seed in range(3):
        a = randn((4, 3), seed=seed)
        np.testing.assert_allclose(f(x, a), a @ x, rtol=1e-12)
    assert f._cache_size() == 1


@pytest.mark.parametrize("shape", [(), (1,), (0,), (2, 0, 3)])
def test_scalars_and_empty_arrays(shape):
    op = CASES["mul"].make("vectorized")
    x1, x2 = randn(shape), randn(shape, seed=1)
    for f in (op, jax.jit(op)):
        out = f(x1, x2)
        assert out.shape == shape
        np.testing.assert_allclose(out, x1 * x2**2, rtol=1e-12)


def test_python_numbers_are_accepted():
    op = CASES["mul"].make("vectorized")
    np.testing.assert_allclose(op(2.0, 3.0), 18.0)
    np.testing.assert_allclose(op(np.float64(2.0), 3), 18.0)


def test_lists_are_pytrees_of_leaves():
    """A list positional argument is a pytree: the function gets a list of arrays back."""
    op = ab.bind(lambda xs: xs[0] * xs[1], shape=lambda xs: xs[0], name="listarg")
    np.testing.assert_allclose(op([randn(2), randn(2, seed=1)]), randn(2) * randn(2, seed=1))


def test_jit_caches_one_compilation_per_signature():
    op = CASES["mul"].make("vectorized")
    f = jax.jit(lambda x1, x2: op(x1, x2))
    for seed in range(3):
        f(randn(3, seed=seed), randn(3, seed=seed + 1))
    assert f._cache_size() == 1
    f(randn(4), randn(4))
    assert f._cache_size() == 2


def test_bind_as_decorator_and_rules_as_decorators():
    @ab.bind(shape=ab.like(0), name="cube")
    def cube(x):
        return x**3

    @cube.def_jvp
    def cube_jvp(primals, tangents):
        return 3 * primals[0] ** 2 * tangents[0]

    @cube.def_vjp
    def cube_vjp(primals, ct):
        return (3 * primals[0] ** 2 * ct,)

    assert callable(cube_jvp) and callable(cube_vjp)  # decorators return the rule
    x = randn(3)
    np.testing.assert_allclose(cube(x), x**3, rtol=1e-12)
    np.testing.assert_allclose(jax.grad(lambda x: cube(x).sum())(x), 3 * x**2, rtol=1e-12)


def test_traced_rule_decorator_with_keyword():
    op = ab.bind(np.exp, shape=ab.like(0), name="exp_dec")

    @op.def_jvp(traced=True)
    def _(primals, tangents):
        return op(primals[0]) * tangents[0]

    x = randn(3)
    np.testing.assert_allclose(jax.hessian(lambda x: op(x).sum())(x), np.diag(np.exp(x)),
                               rtol=1e-10)


def test_op_name_and_repr():
    def my_func(x):
        return x

    op = ab.bind(my_func, shape=ab.like(0))
    assert op.name == "my_func"
    assert "my_func" in repr(op)
    lam = ab.bind(lambda x: x, shape=ab.like(0), name="has spaces-and.dots")
    assert "has spaces-and.dots" not in str(jax.make_jaxpr(lam)(1.0))  # sanitised
    jaxpr = str(jax.make_jaxpr(op)(randn(2)))
    assert "my_func" in jaxpr


def test_each_op_is_its_own_primitive():
    """One primitive per bound function, named after it (not one global primitive)."""
    a = ab.bind(np.sin, shape=ab.like(0), name="first")
    b = ab.bind(np.cos, shape=ab.like(0), name="second")
    ja = jax.make_jaxpr(a)(1.0).eqns[0].primitive
    jb = jax.make_jaxpr(b)(1.0).eqns[0].primitive
    assert ja is not jb
    assert ja.name == "first" and jb.name == "second"


def test_like_refers_to_a_positional_argument():
    op = ab.bind(lambda x, y: (y + x.sum()).astype(y.dtype), shape=ab.like(1), name="like1")
    x, y = randn(3), randn((2, 2), np.float32, seed=1)
    out = op(x, y)
    assert out.shape == (2, 2) and out.dtype == np.float32


def test_shape_as_constant_pytree():
    op = ab.bind(lambda x: {"s": x.sum(), "m": x.mean(axis=0)},
                 shape={"s": jax.ShapeDtypeStruct((), np.float64),
                        "m": jax.ShapeDtypeStruct((3,), np.float64)}, name="stats")
    x = randn((4, 3))
    out = op(x)
    assert set(out) == {"s", "m"}
    np.testing.assert_allclose(out["s"], x.sum(), rtol=1e-12)
    np.testing.assert_allclose(out["m"], x.mean(axis=0), rtol=1e-12)


def test_host_function_called_once_per_eager_call():
    calls = []

    def fn(x):
        calls.append(x.shape)
        return x + 1

    op = ab.bind(fn, shape=ab.like(0), name="counted")
    op(randn(3))
    assert calls == [(3,)]
    jax.jit(op)(randn(3))
    assert calls == [(3,), (3,)]


def test_under_disable_jit():
    """With jit disabled every primitive runs op by op, derivatives and vmap included."""
    case = CASES["mul"]
    args = case.args()
    with jax.disable_jit():
        assert_tree_close(jax.jit(case.op())(*args), case.reference()(*args))
        g = jax.grad(lambda a, b: case.op()(a, b).sum(), argnums=(0, 1))(*args)
        xs = np.stack([args[0], args[1]])
        v = jax.vmap(case.op())(xs, xs)
    assert_tree_close(g, jax.grad(lambda a, b: case.ref(a, b).sum(), argnums=(0, 1))(*args))
    assert_tree_close(v, case.ref(xs, xs))
