"""torch-jax-interop's own tests (github.com/lebrice/torch_jax_interop), ported onto
``ab.from_torch`` and ``ab.to_torch``.

Each port names its source test above it. torch-jax-interop's modules take a tuple of
parameters and an example output; ``ab.from_torch`` takes the module's
``state_dict()`` names and infers the output. Its regression files
(``tensor_regression``) are replaced by the same computation run by torch or by
JAX alone, and its flax networks by the same networks written with ``jax.numpy``.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import assert_close, check_first_order

pytestmark = pytest.mark.slow  # a ported suite: torch-jax-interop's own tests

NUM_CLASSES = 10


def _torch_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16, NUM_CLASSES)).double()


def _params(net):
    return {k: jnp.array(v.detach().numpy()) for k, v in net.named_parameters()}


def _cross_entropy(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))


# torch_jax_interop/to_jax_module_test.py::test_torch_to_jax_nn_module
def test_torch_to_jax_nn_module():
    torch.manual_seed(1)
    torch_net = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(),
                                    torch.nn.Linear(10, 1)).double()
    torch_input = torch.randn(1, 10, dtype=torch.float64, requires_grad=True)
    jax_net_fn, jax_net_params = ab.from_torch(torch_net), _params(torch_net)

    expected = torch_net(torch_input)
    loss = (expected ** 2).mean()
    loss.backward()
    expected_grads = {k: v.grad.numpy() for k, v in torch_net.named_parameters()}

    jax_input = jnp.asarray(torch_input.detach().numpy())
    assert_close(jax_net_fn(jax_net_params, jax_input), expected.detach().numpy())
    grads = jax.grad(lambda p, x: (jax_net_fn(p, x) ** 2).mean())(jax_net_params, jax_input)
    assert grads.keys() == expected_grads.keys()
    for k in grads:
        assert_close(grads[k], expected_grads[k])


# torch_jax_interop/to_jax_module_test.py::test_use_torch_module_in_jax_graph
@pytest.mark.parametrize("input_needs_grad", [False, True])
@pytest.mark.parametrize("with_jit", [False, True])
def test_use_torch_module_in_jax_graph(with_jit, input_needs_grad):
    net = _torch_cnn()
    fn, params = ab.from_torch(net), _params(net)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3, 8, 8)))
    labels = jnp.asarray(np.random.default_rng(1).integers(0, NUM_CLASSES, (4,)))

    def loss_fn(params, x, y):
        logits = fn(params, x)
        return _cross_entropy(logits, y), logits

    argnums = (0, 1) if input_needs_grad else 0
    grad_fn = jax.value_and_grad(loss_fn, argnums=argnums, has_aux=True)
    if with_jit:
        grad_fn = jax.jit(grad_fn)
    (loss, logits), grads = grad_fn(params, x, labels)
    param_grads = grads[0] if input_needs_grad else grads

    tx = torch.from_numpy(np.array(x)).requires_grad_(input_needs_grad)
    want_logits = net(tx)
    want_loss = torch.nn.functional.cross_entropy(want_logits, torch.from_numpy(
        np.array(labels)).long())
    net.zero_grad()
    want_loss.backward()
    assert_close(logits, want_logits.detach().numpy())
    assert_close(loss, want_loss.item())
    for name, p in net.named_parameters():
        assert param_grads[name].shape == p.shape and param_grads[name].dtype == jnp.float64
        assert_close(param_grads[name], p.grad.numpy())
    if input_needs_grad:
        assert_close(grads[1], tx.grad.numpy())


def _jax_mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"][None])
    return h @ params["w2"] + params["b2"][None]


class _WrappedJax(torch.nn.Module):
    """WrappedJaxFunction's job done with ab.to_torch: JAX code, torch parameters."""

    def __init__(self, fn, params, has_aux=False):
        super().__init__()
        self.names = list(params)
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.from_numpy(np.array(params[k]))) for k in self.names])
        self.fn = ab.to_torch(fn)

    def forward(self, x):
        return self.fn(dict(zip(self.names, self.params)), x)


def _mlp_params():
    r = np.random.default_rng(2)  # NumPy's draws: no threefry program to compile
    return {"w1": jnp.asarray(r.normal(size=(6, 8))), "b1": jnp.asarray(r.normal(size=8)),
            "w2": jnp.asarray(r.normal(size=(8, NUM_CLASSES))),
            "b2": jnp.asarray(r.normal(size=NUM_CLASSES))}


# torch_jax_interop/to_torch_module_test.py::test_use_jax_module_in_torch_graph
@pytest.mark.parametrize("input_requires_grad", [False, True])
@pytest.mark.parametrize("has_aux", [False, True])
@pytest.mark.parametrize("use_jit", [False, True])
def test_use_jax_module_in_torch_graph(use_jit, has_aux, input_requires_grad):
    params = _mlp_params()
    fn = _jax_mlp
    if has_aux:
        fn = lambda p, x: (_jax_mlp(p, x), {"mean": _jax_mlp(p, x).mean(),
                                            "max": _jax_mlp(p, x).max()})
    module = _WrappedJax(jax.jit(fn) if use_jit else fn, params)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 6)))
    x.requires_grad_(input_requires_grad)
    labels = torch.randint(0, NUM_CLASSES, (5,), generator=torch.Generator().manual_seed(3))
    out = module(x)
    logits, stats = out if has_aux else (out, None)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()

    jx, jl = jnp.asarray(x.detach().numpy()), jnp.asarray(labels.numpy())
    want = jax.grad(lambda p, x: _cross_entropy(_jax_mlp(p, x), jl), argnums=(0, 1))(params, jx)
    assert_close(logits.detach().numpy(), _jax_mlp(params, jx))
    for name, p in zip(module.names, module.params):
        assert p.grad is not None
        assert_close(p.grad.numpy(), want[0][name])
    if input_requires_grad:
        assert_close(x.grad.numpy(), want[1])
    else:
        assert x.grad is None
    if has_aux:
        assert_close(stats["mean"].detach().numpy(), float(logits.detach().mean()))
        assert_close(stats["max"].detach().numpy(), float(logits.detach().max()))


# torch_jax_interop/to_torch_module_test.py::test_use_jax_scalar_function_in_torch_graph
@pytest.mark.parametrize("input_requires_grad", [False, True])
def test_use_jax_scalar_function_in_torch_graph(input_requires_grad):
    params = _mlp_params()

    def loss_fn(params, x, y):
        logits = _jax_mlp(params, x)
        return _cross_entropy(logits, y), logits
    module = _WrappedJax(jax.jit(loss_fn), params)
    module.forward = lambda x, y: module.fn(dict(zip(module.names, module.params)), x, y)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((5, 6)))
    x.requires_grad_(input_requires_grad)
    labels = torch.randint(0, NUM_CLASSES, (5,), generator=torch.Generator().manual_seed(5))
    loss, logits = module(x, labels)
    assert loss.requires_grad and logits.requires_grad and not labels.requires_grad
    loss.backward()
    jx, jl = jnp.asarray(x.detach().numpy()), jnp.asarray(labels.numpy())
    want = jax.grad(lambda p, x: loss_fn(p, x, jl)[0], argnums=(0, 1))(params, jx)
    assert_close(loss.item(), float(loss_fn(params, jx, jl)[0]))
    for name, p in zip(module.names, module.params):
        assert_close(p.grad.numpy(), want[0][name])
    assert (x.grad is not None) == input_requires_grad
    if input_requires_grad:
        assert_close(x.grad.numpy(), want[1])
    # beyond the source: second order, which torch-jax-interop does not have
    check_first_order(lambda x: ab.from_torch(lambda t: module.fn(
        dict(zip(module.names, module.params)), t, torch.from_numpy(np.array(jl)))[0])(x),
        (jx,))
