"""wrap-torch2jax's own tests (github.com/rdyro/torch2jax, ``tests/``), ported onto
``ab.from_torch``.

Each port names its source test above it. wrap-torch2jax needs example inputs
and a ``depth=`` for derivatives; ``ab.from_torch`` needs neither. Where anybind
deliberately differs (wrap-torch2jax lets torch write into the caller's JAX
array), the port asserts anybind's behaviour, and the migration guide lists the
difference. CUDA variants are the device tests' business (``tests/test_gpu.py``).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import assert_close, run_fresh_python

pytestmark = pytest.mark.slow  # a ported suite: wrap-torch2jax's own tests

DTYPES = [jnp.float32, jnp.float64]


def _randn(shape, dtype, seed):
    return jax.random.normal(jax.random.key(seed), shape, dtype=dtype)


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=1e-10, atol=1e-10)


# tests/test_memory_inplace.py::test_memory_inplace (and ::test_memory_inplace_flat)
@pytest.mark.parametrize("dtype", DTYPES)
def test_memory_inplace(dtype):
    """wrap-torch2jax writes ``x[:5] += 17`` into the caller's JAX array; anybind's
    writes go to a private copy: the array stays zero, the result is the draw."""
    def torch_fn(x):
        y = torch.randn_like(x)
        x[:5].add_(17.0)
        return y

    x = _randn((50,), dtype, 0) * 0
    out = ab.from_torch(torch_fn)(x)
    np.testing.assert_array_equal(np.asarray(x), 0.0)
    assert out.shape == x.shape and out.dtype == dtype and float(jnp.std(out)) > 0.5


# tests/test_with_vjp.py::VJPTests::test_torch2jax_with_vjp
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch2jax_with_vjp(dtype, jit):
    def torch_fn(x, y):
        return x ** 2 * y ** 2

    def expected_f_fn(x, y):
        return x ** 2 * y ** 2

    x, y = _randn((5, 7), dtype, 1), _randn((5, 7), dtype, 2)
    wrap = jax.jit if jit else (lambda f: f)
    for got, want in zip(_grads(ab.from_torch(torch_fn)), _grads(expected_f_fn)):
        g, w = wrap(got)(x, y), want(x, y)
        assert isinstance(g, type(w))
        assert_close(g, w, **_tol(dtype))


def _grads(f):
    """f, its gradient in both arguments, and the gradient of that gradient's sum."""
    g = jax.grad(lambda x, y: jnp.sum(f(x, y)), argnums=(0, 1))
    h = jax.grad(lambda x, y: jnp.sum(g(x, y)[0] + g(x, y)[1]), argnums=(0, 1))
    return f, g, h


def _softmax_fn(a, b):
    return torch.sin(a + 2 * b) * torch.softmax(a - b, dim=0).reshape(-1)[0]


def _softmax_jax(a, b):
    return jnp.sin(a + 2 * b) * jax.nn.softmax(a - b, axis=0).reshape(-1)[0]


# tests/test_with_vjp.py::VJPTests::test_jacobian
@pytest.mark.parametrize("argnums", [(0,), (1,), (0, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_jacobian(dtype, argnums):
    a, b = _randn((2, 3), dtype, 3), _randn((2, 3), dtype, 4)
    fn = ab.from_torch(_softmax_fn)
    got = jax.jit(jax.jacobian(fn, argnums=argnums))(a, b)
    assert_close(got, jax.jit(jax.jacobian(_softmax_jax, argnums=argnums))(a, b), **_tol(dtype))


# tests/test_with_vjp.py::VJPTests::test_hessian
@pytest.mark.parametrize("argnums", [(0,), (1,), (0, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_hessian(dtype, argnums):
    a, b = _randn((2, 3), dtype, 5), _randn((2, 3), dtype, 6)
    fn = ab.from_torch(_softmax_fn)
    hess = lambda f: jax.jit(jax.jacobian(jax.jacobian(f, argnums=argnums)))(a, b)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == jnp.float32 else _tol(dtype)
    assert_close(hess(fn), hess(_softmax_jax), **tol)


# tests/test_grad_fallback.py::TestGradFallback::test_torch2jax_with_vjp_vjp_fallback
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch2jax_with_vjp_vjp_fallback(dtype, jit):
    class OldInterfaceFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x ** 2 + y ** 2

        @staticmethod
        def backward(ctx, grad_output):
            x, y = ctx.saved_tensors
            return 2 * x * grad_output, 2 * y * grad_output

    def expected_f_fn(x, y):
        return x ** 2 + y ** 2

    x, y = _randn((5, 7), dtype, 7), _randn((5, 7), dtype, 8)
    wrap = jax.jit if jit else (lambda f: f)
    fn = ab.from_torch(lambda x, y: OldInterfaceFunction.apply(x, y))
    for got, want in zip(_grads(fn), _grads(expected_f_fn)):
        assert_close(wrap(got)(x, y), want(x, y), **_tol(dtype))


# tests/test_dtypes.py::TestX64Disabled::test_int64_example_args_without_x64
def test_int64_example_args_without_x64():
    """wrap-torch2jax casts JAX's int32 (x64 off) back to its example's int64; anybind has
    no example inputs, so torch sees int32: the unchanged function is a clear error naming
    the op and torch's complaint in mode="call", and ``.long()`` in the function makes it
    work. The default mode="auto" translates the unchanged function (torch.export's
    capture accepts int32 targets), with torch's value for the int64 targets."""
    proc = run_fresh_python("""
        import jax, torch, numpy as np, pytest
        import anybind as ab
        assert not jax.config.jax_enable_x64
        loss = torch.nn.CrossEntropyLoss()
        xt, yt = torch.randn(10, 5), torch.randint(0, 5, (10,))
        x, y = jax.numpy.asarray(xt.numpy()), jax.numpy.asarray(yt.numpy())
        assert y.dtype == jax.numpy.int32
        with pytest.raises(ab.HostError, match=r"anybind op 'ce'.*target dtype to be Long"):
            ab.from_torch(lambda x, y: loss(x, y), name="ce", mode="call")(x, y)
        auto = ab.from_torch(lambda x, y: loss(x, y), name="ce")(x, y)
        assert abs(auto - loss(xt, yt).item()) < 1e-5, auto
        jax_fn = ab.from_torch(lambda x, y: loss(x, y.long()), name="ce")
        out, g = jax.value_and_grad(jax_fn)(x, y)
        out_jit = jax.jit(jax_fn)(x, y)
        expected = loss(xt, yt).item()
        assert abs(out - expected) < 1e-5 and abs(out_jit - expected) < 1e-5, (out, expected)
        xg = xt.clone().requires_grad_()
        loss(xg, yt).backward()
        assert g.shape == x.shape and np.allclose(np.asarray(g), xg.grad.numpy(), atol=1e-6)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
