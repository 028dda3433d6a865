"""torchax's interop tests (github.com/google/torchax, ``test/test_interop.py`` and
``test/test_tied_weights.py``), ported onto ``ab.to_torch`` and ``ab.from_torch``.

Each port names its source test above it. torchax runs torch code as JAX arrays on a
``"jax"`` device; anybind keeps torch's own tensors, so the ports use CPU tensors.
torchax's ``extract_all_buffers``/``set_all_buffers`` and device placement have no
counterpart here and are not ported.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import assert_close

pytestmark = pytest.mark.slow  # a ported suite: torchax's own tests


# test/test_interop.py::InteropTest::test_j2t_autograd_forward
def test_j2t_autograd_forward():
    j2t_fn = ab.to_torch(lambda x: x + 1)
    x = torch.ones(2, 2, requires_grad=True)
    torch.testing.assert_close(j2t_fn(x), torch.ones(2, 2) + 1, check_device=False)


# test/test_interop.py::InteropTest::test_j2t_autograd_backward
def test_j2t_autograd_backward():
    j2t_fn = ab.to_torch(lambda x: x * 2)
    x = torch.ones(2, 2).requires_grad_()
    j2t_fn(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(2, 2) * 2)


class _ModuleWithSharedWeights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(10, 10)
        self.b = self.a

    def forward(self, x):
        return self.a(self.b(x))


# test/test_interop.py::InteropTest::test_module_with_shared_weights
@pytest.mark.parametrize("keyed", ["state_dict", "named_parameters"])
def test_module_with_shared_weights(keyed):
    torch.manual_seed(0)
    m = _ModuleWithSharedWeights().double()
    assert len(m.state_dict()) == 4  # a's weight and bias, and b's
    params = {k: jnp.array(v.detach().numpy()) for k, v in dict(getattr(m, keyed)()).items()}
    assert len(params) == (4 if keyed == "state_dict" else 2)  # deduplicated
    op = ab.from_torch(m)
    x = torch.randn(10, 10, dtype=torch.float64)
    kept = {k: v.detach().clone() for k, v in m.state_dict().items()}
    expected = m(x)
    jax.block_until_ready(op(params, x.numpy()))
    for k, v in m.state_dict().items():  # the module keeps its own tensors, not the views
        torch.testing.assert_close(v, kept[k], rtol=0, atol=0)
    assert isinstance(m.a.weight, torch.nn.Parameter) and m.a.weight is m.b.weight
    assert_close(jax.jit(op)(params, x.numpy()), expected.detach().numpy())
    got = jax.grad(lambda p: op(p, x.numpy()).sum())(params)
    expected.sum().backward()
    assert_close(got["a.weight"], m.a.weight.grad.numpy())
    assert_close(got["a.bias"], m.a.bias.grad.numpy())


# test/test_interop.py::InteropTest::test_torch_jax_view_dtype
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_torch_jax_view_dtype(dtype):
    """Each dtype crosses both ways as itself."""
    t = torch.arange(6).reshape(2, 3).to(dtype)
    back = ab.to_torch(lambda v: v * 2)(t)
    assert back.dtype == dtype
    torch.testing.assert_close(back, t * 2)
    there = ab.from_torch(lambda v: v * 2)(np.asarray(jnp.asarray(t.float().numpy()).astype(
        {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16, torch.int32: jnp.int32}[dtype])))
    assert there.dtype == {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16,
                           torch.int32: jnp.int32}[dtype]
    assert_close(np.asarray(there, np.float64), 2 * t.double().numpy())


class _TiedWeightsModel(torch.nn.Module):
    def __init__(self, vocab_size=10, dim=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, dim * 2), torch.nn.ReLU(),
                                       torch.nn.Linear(dim * 2, dim))
        self.head = torch.nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x):
        return self.head(self.mlp(self.emb(x)))


# test/test_tied_weights.py::TiedWeightsTest::test_tied_weights
def test_tied_weights():
    torch.manual_seed(0)
    model = _TiedWeightsModel().double()
    assert model.head.weight is model.emb.weight
    x = torch.randint(0, 10, (2, 5))
    res_torch = model(x)
    weights = {k: jnp.array(v.detach().numpy()) for k, v in model.named_parameters()}
    assert "emb.weight" in weights and "head.weight" not in weights  # deduplicated
    op = ab.from_torch(model)
    assert_close(op(weights, x.numpy()), res_torch.detach().numpy())
    got = jax.grad(lambda w: (op(w, x.numpy()) ** 2).sum())(weights)
    (res_torch ** 2).sum().backward()
    assert_close(got["emb.weight"], model.emb.weight.grad.numpy())  # both uses summed
