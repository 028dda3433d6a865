"""ab.from_torch's default (mode="auto") on a program that translates: JAX code, which
XLA shards as its own, with no host call and no gather; numbers against torch's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import N_DEV, collectives, hlo, mesh, put, spec

from helpers import assert_close, host_call_count, randn

torch = pytest.importorskip("torch")

import anybind as ab  # noqa: E402


def _layer(x, w, b):
    return torch.tanh(x @ w + b) * torch.sigmoid(x.sum(-1, keepdim=True))


def _torch_value_and_grad(x, w, b):
    xt, wt, bt = (torch.from_numpy(np.array(a)).requires_grad_() for a in (x, w, b))
    y = _layer(xt, wt, bt)
    (y ** 2).sum().backward()
    return y.detach().numpy(), (xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy())


@pytest.fixture(params=("auto", "explicit"))
def m(request):
    mm = mesh(request.param)
    with jax.set_mesh(mm):
        yield mm


def test_a_translated_op_is_sharded_by_xla(m):
    """Under Auto axes XLA keeps the rows where they are. (Under Explicit axes the
    numbers hold, but the translated program's output comes out replicated: the
    sharding its ops' types carry is not yet kept through the translation.)"""
    explicit = m.axis_types[0] == jax.sharding.AxisType.Explicit
    op = ab.from_torch(_layer)
    x, w, b = put(randn((16, 4)), m, "x"), put(randn((4, 3), seed=1), m), put(
        randn(3, seed=2), m)
    assert host_call_count(jax.jit(op).lower(x, w, b)) == 0
    out = jax.jit(op)(x, w, b)
    y, grads = _torch_value_and_grad(x, w, b)
    assert_close(out, y)
    assert len(out.sharding.device_set) == N_DEV
    if not explicit:
        assert spec(out)[0] == "x"
        assert collectives(hlo(op, x, w, b)) == []  # rows stay on their devices
    loss = lambda x, w, b: jnp.sum(op(x, w, b) ** 2)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)
    assert_close(g, grads)
    if not explicit:
        assert spec(g[0])[0] == "x"
