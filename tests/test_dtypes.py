"""Every dtype, with jax_enable_x64 on and off; scalars and zero-size arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, randn

FLOATS = [np.float16, np.float32, np.float64]
COMPLEX = [np.complex64, np.complex128]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
ALL = FLOATS + COMPLEX + INTS + [np.bool_]
SHAPES = [(), (3,)]
EMPTY = [(0,), (2, 0)]
TOLS = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12, np.complex64: 2e-6,
        np.complex128: 1e-12}


@pytest.fixture(params=[True, False], ids=["x64", "x32"])
def x64(request):
    with jax.enable_x64(request.param):
        yield request.param


def _canonical(dtype):
    """What JAX makes of a NumPy dtype under the current x64 setting."""
    return jax.dtypes.canonicalize_dtype(dtype)


def _negate(x):
    return ~x if x.dtype == np.bool_ else np.negative(x)


def _jnegate(x):
    return ~x if x.dtype == jnp.bool_ else jnp.negative(x)


SEEN = []


def _recording(x):
    SEEN.append(x.dtype)
    return _negate(x)


OPS = {mode: ab.bind(_recording, shape=ab.like(0), vmap=mode, name=f"negate_{mode}",
                     jvp=lambda p, t: -t[0], vjp=lambda p, ct: (-ct,))
       for mode in ("sequential", "vectorized")}


def _example(dtype, shape, seed=0):
    if np.issubdtype(dtype, np.inexact):
        return randn(shape, dtype, seed=seed)
    if dtype == np.bool_:
        return np.random.default_rng(seed).integers(0, 2, shape).astype(bool)
    return np.random.default_rng(seed).integers(0, 100, shape).astype(dtype)


DTYPE_SHAPES = ([(d, s) for d in ALL for s in SHAPES]
                + [(d, s) for d in (np.float32, np.complex128, np.int64, np.bool_) for s in EMPTY])


@pytest.mark.parametrize("dtype,shape", DTYPE_SHAPES,
                         ids=[f"{np.dtype(d).name}-{s}" for d, s in DTYPE_SHAPES])
def test_eager_jit_and_vmap_keep_dtype(dtype, shape, x64):
    x = _example(dtype, shape)
    want_dtype = _canonical(dtype)
    want = _jnegate(jnp.asarray(x))
    assert want.dtype == want_dtype
    xs = np.stack([x, x])
    SEEN.clear()
    out = OPS["sequential"](x)  # eagerly
    assert out.dtype == want_dtype and out.shape == shape
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    for op in OPS.values():
        out, vout = jax.jit(lambda x, xs: (op(x), jax.vmap(op)(xs)))(x, xs)
        assert out.dtype == want_dtype and out.shape == shape
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
        assert vout.dtype == want_dtype and vout.shape == (2,) + shape
        np.testing.assert_array_equal(np.asarray(vout), np.stack([np.asarray(want)] * 2))
    if np.size(x):  # (zero-size calls need not reach the host)
        assert SEEN and all(d == want_dtype for d in SEEN), SEEN  # the host saw the dtype


@pytest.mark.parametrize("dtype", FLOATS + COMPLEX, ids=lambda d: np.dtype(d).name)
def test_derivatives_per_dtype(dtype, x64):
    """The paper's x1·x2², first order, against JAX, in each inexact dtype."""
    op = ab.bind(lambda a, b: a * b**2, shape=ab.like(0), name="mul_dtypes",
                 jvp=lambda p, t: p[1] ** 2 * t[0] + 2 * p[0] * p[1] * t[1],
                 vjp=lambda p, ct: (p[1] ** 2 * ct, 2 * p[0] * p[1] * ct))
    ref = lambda a, b: a * b**2
    x1, x2 = randn(3, dtype), randn(3, dtype, seed=1)
    tol = TOLS[dtype] if x64 or dtype not in (np.float64, np.complex128) else 2e-6
    out = op(x1, x2)
    assert out.dtype == _canonical(dtype)
    loss = lambda f: (lambda a, b: jnp.sum(jnp.abs(f(a, b)) ** 2).astype(jnp.float32))

    def program(f):  # jvp, grad and vmap(grad) in one compiled program
        def run(x1, x2, t1, t2):
            g = jax.grad(loss(f), argnums=(0, 1))
            return (jax.jvp(f, (x1, x2), (t1, t2)), g(x1, x2),
                    jax.vmap(g)(jnp.stack([x1, x2]), jnp.stack([x2, x1])))
        return jax.jit(run)

    args = (x1, x2, randn(3, dtype, seed=2), randn(3, dtype, seed=3))
    assert_tree_close(program(op)(*args), program(ref)(*args), rtol=10 * tol, atol=10 * tol)


@pytest.mark.parametrize("out_dtype", [np.int8, np.int32, np.int64, np.uint16, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_integer_and_bool_outputs_are_not_differentiable(out_dtype, x64):
    want = _canonical(out_dtype)

    def fn(x):
        return x * 2, (x > 0).astype(want)

    op = ab.bind(fn, shape=lambda x: (x, jax.ShapeDtypeStruct(x.shape, out_dtype)),
                 name=f"with_{np.dtype(out_dtype).name}",
                 jvp=lambda p, t: (2 * t[0], None), vjp=lambda p, ct: (2 * ct[0],))
    x = randn(4, np.float32)
    (y, k), (ty, tk) = jax.jvp(op, (x,), (np.ones(4, np.float32),))
    assert k.dtype == want and tk.dtype == jax.dtypes.float0
    np.testing.assert_array_equal(k, (x > 0).astype(want))
    np.testing.assert_allclose(ty, 2 * np.ones(4))
    g = jax.grad(lambda x: op(x)[0].sum())(x)
    np.testing.assert_allclose(g, 2 * np.ones(4))
    ks = jax.vmap(lambda x: op(x)[1])(np.stack([x, -x]))
    np.testing.assert_array_equal(ks, np.stack([x > 0, -x > 0]).astype(want))


@pytest.mark.parametrize("in_dtype", [np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_integer_and_bool_inputs_get_float0_tangents(in_dtype, x64):
    op = ab.bind(lambda x, m: np.where(m, x, 0 * x), shape=ab.like(0), name="masked",
                 jvp=lambda p, t: np.where(p[1], t[0], 0 * t[0]),
                 vjp=lambda p, ct: (np.where(p[1], ct, 0 * ct), None))
    x, m = randn(4, np.float32), np.array([1, 0, 1, 1]).astype(in_dtype)
    gx, gm = jax.grad(lambda x, m: op(x, m).sum(), argnums=(0, 1), allow_int=True)(x, m)
    np.testing.assert_array_equal(gx, np.array([1, 0, 1, 1], np.float32))
    assert gm.dtype == jax.dtypes.float0
    _, t = jax.jvp(op, (x, m), (np.ones(4, np.float32), np.zeros(4, jax.dtypes.float0)))
    np.testing.assert_array_equal(t, np.array([1, 0, 1, 1], np.float32))


@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_integer_keyword_operand(mode, x64):
    """Indices as a keyword operand: traced, batched, never differentiated."""
    def take(x, *, idx):
        return np.take_along_axis(x, idx, axis=-1)

    def take_vjp(primals, ct, *, idx):
        (x,) = primals
        shape = np.broadcast_shapes(x.shape, ct.shape[:-1] + x.shape[-1:])
        out = np.zeros(shape, ct.dtype)
        np.put_along_axis(out, np.broadcast_to(idx, shape[:-1] + idx.shape[-1:]),
                          np.broadcast_to(ct, shape[:-1] + ct.shape[-1:]), axis=-1)
        return (out,)

    op = ab.bind(take, shape=lambda x, *, idx: jax.ShapeDtypeStruct(idx.shape, x.dtype),
                 vjp=take_vjp, vmap=mode, name=f"take_{mode}")
    x = randn(5, np.float32)
    idx = np.array([4, 0, 2], np.int32)
    np.testing.assert_array_equal(op(x, idx=idx), x[idx])
    idxs = np.array([[4, 0, 2], [1, 3, 2]], np.int32)  # no repeats within a row
    np.testing.assert_array_equal(jax.vmap(lambda i: op(x, idx=i))(idxs), x[idxs])
    g = jax.grad(lambda x: jax.vmap(lambda i: op(x, idx=i))(idxs).sum())(x)
    np.testing.assert_array_equal(g, np.bincount(idxs.ravel(), minlength=5).astype(np.float32))


def test_python_scalars_follow_x64(x64):
    op = ab.bind(lambda x: x * 2, shape=ab.like(0), name="double_scalar")
    out = op(1.5)
    assert out.dtype == (np.float64 if x64 else np.float32)
    assert out.shape == ()
    np.testing.assert_allclose(out, 3.0)


def test_traced_function_in_every_dtype(x64):
    op = ab.bind(lambda x: x[::-1], traced=True, name="reverse")
    for dtype in ALL:
        x = _example(dtype, (3,))
        out = jax.jit(op)(x)
        assert out.dtype == _canonical(dtype)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x).astype(out.dtype)[::-1])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_linear_op_in_low_precision(dtype):
    op = ab.bind(lambda x: 3 * x, shape=ab.like(0), linear=True, name="triple_lp",
                 transpose=lambda ct: (3 * ct,))
    x = randn(4, dtype)
    (t,) = jax.linear_transpose(op, x)(x)
    assert t.dtype == dtype
    np.testing.assert_allclose(t, 3 * x, rtol=TOLS[dtype])
    h = jax.jit(jax.hessian(lambda x: jnp.sum(jnp.abs(op(x.astype(dtype))) ** 2)))(
        randn(4, np.float32 if dtype != np.float16 else np.float16))
    np.testing.assert_allclose(h, 18 * np.eye(4), rtol=TOLS[dtype])


@pytest.mark.parametrize("name", ["mul", "sin", "matvec", "fft", "tree", "scale"])
def test_every_op_with_x64_off(name):
    """Inputs made in float64/complex128 arrive in 32 bits; vmap(grad) matches the reference."""
    from ops import CASES
    case = CASES[name]
    loss = lambda g: (lambda *a: sum(jnp.sum(jnp.abs(o) ** 2) for o in jax.tree.leaves(g(*a))))
    with jax.enable_x64(False):
        args = jax.tree.map(jnp.asarray, case.batched_args())
        t = lambda g: jax.jit(jax.vmap(jax.grad(loss(g))))
        got, want = t(case.op("vectorized"))(*args), t(case.reference())(*args)
        assert_tree_close(got, want, rtol=2e-5, atol=2e-5)
        assert all(l.dtype in (np.float32, np.complex64) for l in jax.tree.leaves(got))


@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_64_bit_results_narrow_as_their_declared_dtypes_with_x64_off(mode):
    """np.argsort returns int64; declared int64 is int32 with x64 off, and so is the result."""
    op = ab.bind(lambda x: (np.sort(x, axis=-1), np.argsort(x, axis=-1).astype(np.int64)),
                 shape=lambda x: (x, jax.ShapeDtypeStruct(x.shape, np.int64)), vmap=mode,
                 name=f"argsort_{mode}")
    x = randn((2, 5))
    with jax.enable_x64(False):
        for f in (op, jax.jit(op), jax.vmap(op)):
            s, i = f(x)
            assert (s.dtype, i.dtype) == (np.float32, np.int32)
            np.testing.assert_array_equal(i, np.argsort(x.astype(np.float32), axis=-1))
    big = ab.bind(lambda x: np.full(x.shape, 2**40, np.int64),
                  shape=lambda x: jax.ShapeDtypeStruct(x.shape, np.int64), name="too_big")
    with jax.enable_x64(False), pytest.raises(ab.HostError, match=r"'too_big'.*int64.*int32"):
        big(x)


def test_same_op_with_x64_off_then_on():
    """The declared dtypes follow x64 at each call: a call made with x64 off is not reused."""
    op = ab.bind(lambda x: np.argsort(x).astype(np.int64),
                 shape=lambda x: jax.ShapeDtypeStruct(x.shape, np.int64), name="argsort_x64")
    x = randn(4, np.float32)
    with jax.enable_x64(False):
        assert op(x).dtype == np.int32
    with jax.enable_x64(True):
        assert op(x).dtype == jax.jit(jax.checkpoint(op))(x).dtype == np.int64
