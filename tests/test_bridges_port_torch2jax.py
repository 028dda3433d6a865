"""torch2jax's own tests (PyPI 0.1.0, github.com/samuela/torch2jax, ``tests/test_torch_nn.py``),
ported onto ``ab.from_torch``.

Each port names its source test above it; loops over many hyperparameters keep a
representative subset, as the calls are the same. torch2jax's ``t2j(model)(x,
state_dict=params)`` is ``ab.from_torch(model)(params, x)``; its
``return_state_dict=True`` is ``return_state=True``; its ``rng=`` key has no
counterpart (torch code draws from torch's generator), so the dropout port checks
what holds for torch's draws. Values are checked against torch, gradients against
torch's own autograd.
"""
import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import (
    assert_close,
    check_first_order,
    np_random as random,
    tree_central_difference,
    tree_inner,
    tree_randn_like,
)

pytestmark = pytest.mark.slow  # a ported suite: torch2jax's own tests


def _t(x):
    return torch.from_numpy(np.array(x))


def _forward_and_grad(model, params, x, atol):
    """t2j's forward (eager and jitted) and the gradient of Σ out² in ``params`` (or in x,
    when ``params`` is None), against torch."""
    op = ab.from_torch(model)
    call = (lambda p, x: op({}, x)) if params is None else op  # a module: op(params, x)
    p = params if params is not None else {}
    if params is not None:
        model.load_state_dict({k: _t(v) for k, v in params.items()}, strict=False)
    tx = _t(x).requires_grad_(params is None)
    res_torch = model(tx)
    assert_close(call(p, x), res_torch.detach().numpy(), rtol=atol, atol=atol)
    assert_close(jax.jit(call)(p, x), res_torch.detach().numpy(), rtol=atol, atol=atol)
    model.zero_grad()
    res_torch.pow(2).sum().backward()
    if params is None:
        got = jax.grad(lambda x: (call(p, x) ** 2).sum())(x)
        assert_close(got, tx.grad.numpy(), rtol=atol, atol=atol)
    else:
        got = jax.grad(lambda p: (call(p, x) ** 2).sum())(params)
        for k, v in model.named_parameters():
            assert_close(got[k], v.grad.numpy(), rtol=atol, atol=atol)


# tests/test_torch_nn.py::test_torch_nn_AdaptiveAvgPool2d
def test_torch_nn_AdaptiveAvgPool2d():
    for output_size in [1, 2, (3, 4), (None, 4)]:
        x = random.normal(random.PRNGKey(123), (7, 2, 16, 16))
        _forward_and_grad(torch.nn.AdaptiveAvgPool2d(output_size), None, x, 1e-8)


# tests/test_torch_nn.py::test_torch_nn_BatchNorm1d
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("input_shape", [(3, 5), (2, 3, 5)])
def test_torch_nn_BatchNorm1d(input_shape, affine, training):
    keys = iter(random.split(random.PRNGKey(123), 16))
    for eps in [1e-1, 1e-5]:
        model = torch.nn.BatchNorm1d(input_shape[1], eps=eps, affine=affine).double()
        model.train(training)
        x = random.normal(next(keys), input_shape)
        params = {"running_mean": random.normal(next(keys), (input_shape[1],)),
                  "running_var": random.uniform(next(keys), (input_shape[1],)),
                  "num_batches_tracked": jnp.asarray(random.randint(next(keys), (), 0, 100))}
        if affine:
            params["weight"] = random.normal(next(keys), (input_shape[1],))
            params["bias"] = random.normal(next(keys), (input_shape[1],))
        op = ab.from_torch(model, return_state=True)
        model.load_state_dict({k: _t(v) for k, v in params.items()})
        res_torch = model(_t(x))
        sd_torch = dict(model.named_buffers())  # return_state gives the buffers
        for run in (op, jax.jit(op)):
            res, sd = run(params, x)
            assert sorted(sd) == sorted(sd_torch)
            for k in sd:
                assert_close(sd[k], sd_torch[k].numpy(), rtol=1e-12, atol=1e-12)
            assert_close(res, res_torch.detach().numpy(), rtol=1e-10, atol=1e-10)
        if affine:
            floats = {k: v for k, v in params.items() if k != "num_batches_tracked"}
            got = jax.grad(lambda p: (op({**p, "num_batches_tracked": params[
                "num_batches_tracked"]}, x)[0] ** 2).sum())(floats)
            res_torch.pow(2).sum().backward()
            assert_close(got["weight"], model.weight.grad.numpy(), rtol=1e-8, atol=1e-8)
            assert_close(got["bias"], model.bias.grad.numpy(), rtol=1e-8, atol=1e-8)
            np.testing.assert_array_equal(np.asarray(got["running_mean"]), 0.0)


# tests/test_torch_nn.py::test_torch_nn_Conv2d
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stride, padding, dilation", [
    (1, 0, 1), ((1, 3), 2, (2, 3)), (2, "valid", 1), (1, "same", 2), ((3, 1), (1, 2), 1)])
def test_torch_nn_Conv2d(bias, stride, padding, dilation):
    model = torch.nn.Conv2d(2, 3, (5, 5), bias=bias, stride=stride, padding=padding,
                            dilation=dilation).double()
    x = 0.1 * random.normal(random.PRNGKey(123), (7, 2, 16, 16))
    params = {k: 0.1 * random.normal(random.PRNGKey(123), v.shape)
              for k, v in model.named_parameters()}
    _forward_and_grad(model, params, x, 1e-8)


# tests/test_torch_nn.py::test_torch_nn_ConvTranspose2d
@pytest.mark.parametrize("kernel_size, stride, padding, output_padding, dilation", [
    (1, 1, (0, 0), 0, 1), (2, 2, 1, 1, 1), ((1, 2), (1, 2), (1, 2), (0, 1), (1, 2))])
def test_torch_nn_ConvTranspose2d(kernel_size, stride, padding, output_padding, dilation):
    model = torch.nn.ConvTranspose2d(2, 2, kernel_size, stride=stride, padding=padding,
                                     output_padding=output_padding, dilation=dilation).double()
    params = {k: random.normal(random.PRNGKey(123), v.shape) for k, v in model.named_parameters()}
    x = random.normal(random.PRNGKey(123), (3, 2, 16, 16))
    _forward_and_grad(model, params, x, 1e-8)


# tests/test_torch_nn.py::test_torch_nn_Dropout
def test_torch_nn_Dropout():
    """No ``rng=`` key: torch's generator draws. What holds: p=0 is the identity, p=1 is
    zero, p=½ zeroes about half and scales the rest by 2, and two calls draw anew."""
    x = random.normal(random.PRNGKey(123), (1024,))
    drop = lambda p: (lambda x: ab.from_torch(torch.nn.Dropout(p))({}, x))
    a, b = np.asarray(drop(0.5)(x)), np.asarray(drop(0.5)(x))
    kept = a != 0
    assert 0.4 < kept.mean() < 0.6 and not np.array_equal(kept, b != 0)
    assert_close(a[kept], 2 * np.asarray(x)[kept])
    assert_close(drop(0.0)(x), x)
    assert_close(drop(1.0)(x), np.zeros(1024))
    tenth = np.asarray(drop(0.1)(x))
    assert np.mean(tenth != 0) > 0.8
    assert_close(tenth[tenth != 0], np.asarray(x)[tenth != 0] / 0.9)


# tests/test_torch_nn.py::test_torch_nn_Linear
def test_torch_nn_Linear():
    params = {"weight": random.normal(random.PRNGKey(123), (5, 2)),
              "bias": random.normal(random.PRNGKey(123), (5,))}
    _forward_and_grad(torch.nn.Linear(2, 5).double(), params,
                      random.normal(random.PRNGKey(123), (3, 2)), 1e-10)


# tests/test_torch_nn.py::test_torch_nn_Linear_no_bias
def test_torch_nn_Linear_no_bias():
    params = {"weight": random.normal(random.PRNGKey(123), (5, 2))}
    _forward_and_grad(torch.nn.Linear(2, 5, bias=False).double(), params,
                      random.normal(random.PRNGKey(123), (3, 2)), 1e-10)


# tests/test_torch_nn.py::test_torch_nn_MaxPool1d
@pytest.mark.parametrize("kernel_size, stride, padding", [
    (1, None, 0), (2, 1, 1), ((3,), (2,), 1), (5, 3, (2,))])
def test_torch_nn_MaxPool1d(kernel_size, stride, padding):
    x = random.normal(random.PRNGKey(123), (7, 2, 16))
    _forward_and_grad(torch.nn.MaxPool1d(kernel_size, stride, padding), None, x, 1e-10)


# tests/test_torch_nn.py::test_torch_nn_MaxPool2d
@pytest.mark.parametrize("kernel_size, stride, padding", [
    (1, None, 0), ((2, 4), (2, 4), 1), (3, (3, 2), (1, 1)), ((5, 5), 1, (2, 1))])
def test_torch_nn_MaxPool2d(kernel_size, stride, padding):
    x = random.normal(random.PRNGKey(123), (7, 2, 16, 16))
    _forward_and_grad(torch.nn.MaxPool2d(kernel_size, stride, padding), None, x, 1e-10)


# tests/test_torch_nn.py::test_torch_nn_PReLU
def test_torch_nn_PReLU():
    model = torch.nn.PReLU(3).double()
    params = {k: 0.1 * random.normal(random.PRNGKey(123), v.shape)
              for k, v in model.named_parameters()}
    _forward_and_grad(model, params, random.normal(random.PRNGKey(123), (1, 3, 32, 32)), 1e-9)


def _function_test(f, input_shapes, atol, num_tests=3, argnums=None):
    """utils.py's t2j_function_test: values (eager and jitted) against torch, and the
    gradient of the first output entry in ``argnums`` (every input by default) against
    torch.func.grad."""
    op = ab.from_torch(f)
    for test_rng in random.split(random.PRNGKey(123), num_tests):
        inputs = [random.normal(k, s) for k, s in
                  zip(random.split(test_rng, len(input_shapes)), input_shapes)]
        want = f(*map(_t, inputs))
        assert_close(op(*inputs), want.numpy(), rtol=atol, atol=atol)
        assert_close(jax.jit(op)(*inputs), want.numpy(), rtol=atol, atol=atol)
        first = ab.from_torch(lambda *a: f(*a).flatten()[0])
        which = tuple(range(len(inputs))) if argnums is None else argnums
        got = jax.grad(first, argnums=which)(*inputs)
        ref = torch.func.grad(lambda *a: f(*a).flatten()[0], argnums=which)(
            *map(_t, inputs))
        for g, r in zip(got, ref):
            assert_close(g, r.numpy(), rtol=atol, atol=atol)


def _bn_train(input, running_mean, running_var, weight, bias):
    # torch2jax's f: training=True updates running_mean and running_var in place
    running_var = running_var.pow(2)
    out = torch.nn.functional.batch_norm(input, running_mean, running_var, weight=weight,
                                         bias=bias, training=True)
    return out, running_mean, running_var


def _bn_inputs(shape, seed):
    keys = random.split(random.PRNGKey(seed), 5)
    x, m, v, w, b = (random.normal(k, s) for k, s in zip(keys, [shape] + [(3,)] * 4))
    return x, m, jnp.abs(v) + 0.5, w, b


def _bn_torch_grads(f, inputs, argnums):
    """torch's own autograd: the gradient of the mean of every output entry (torch2jax's
    backward_test), with only ``argnums`` requiring grad."""
    ts = [_t(a).requires_grad_(i in argnums) for i, a in enumerate(inputs)]
    outs = f(*ts)
    torch.cat([o.flatten() for o in torch.utils._pytree.tree_leaves(outs)]).mean().backward()
    return [ts[i].grad.numpy() for i in argnums]


# tests/test_torch_nn.py::test_torch_nn_functional_batch_norm
@pytest.mark.parametrize("mode", ["call", "translate"])
def test_torch_nn_functional_batch_norm(mode):
    """torch2jax's test, all five inputs positional. The running statistics are batch
    norm's buffers: torch defines no derivative through them (its batch_norm refuses
    one) and records none for its in-place update of them. Gradients in every input
    are asked for (torch2jax asks only for input, weight and bias, as torch refuses the
    rest): those three match torch's own autograd, and the statistics' own come out as
    torch's autograd gives them on detached statistics, with no error."""
    eval_bn = functools.partial(torch.nn.functional.batch_norm, training=False)
    for f, shapes in [(eval_bn, [(2, 3), (2, 3, 5), (2, 3, 5, 7)]),
                      (_bn_train, [(2, 3), (2, 3, 5), (2, 3, 5, 7)])]:
        op = ab.from_torch(f, mode=mode)
        mean_of = lambda *a: jnp.concatenate(  # noqa: E731
            [o.ravel() for o in jax.tree_util.tree_leaves(op(*a))]).mean()
        for seed, shape in enumerate(shapes):
            inputs = _bn_inputs(shape, seed)
            kept = [np.array(a) for a in inputs]
            want = f(*map(_t, kept))
            for run in (op, jax.jit(op)):
                for g, w in zip(jax.tree_util.tree_leaves(run(*inputs)), _torch_leaves(want),
                                strict=True):
                    assert_close(g, w)
            for a, k in zip(inputs, kept):  # the caller's statistics never change
                np.testing.assert_array_equal(np.asarray(a), k)
            got = jax.grad(mean_of, argnums=(0, 1, 2, 3, 4))(*inputs)
            for i, r in zip((0, 3, 4), _bn_torch_grads(f, inputs, (0, 3, 4))):
                assert_close(got[i], r)
            assert_close(jax.jit(jax.grad(mean_of, argnums=(0, 3, 4)))(*inputs),
                         tuple(got[i] for i in (0, 3, 4)))
            # the statistics: no derivative through batch_norm (zero in eval mode); in
            # training mode the returned statistic keeps the derivative it had before
            # torch's update: 1/n for the mean, 2·v/n for the squared variance
            n = sum(np.size(o) for o in jax.tree_util.tree_leaves(op(*inputs)))
            if f is eval_bn:
                np.testing.assert_array_equal(np.asarray(got[1]), 0.0)
                np.testing.assert_array_equal(np.asarray(got[2]), 0.0)
            else:
                assert_close(got[1], np.full(3, 1 / n))
                assert_close(got[2], 2 * np.asarray(inputs[2]) / n)
            # forward mode agrees with reverse mode in every input (transpose identity),
            # and the normalised output with central differences along input, weight and
            # bias (the updated statistics depend on the input with no derivative recorded)
            dargs = tree_randn_like(inputs, seed)
            out, tangent = jax.jvp(op, inputs, dargs)
            ybar = tree_randn_like(out, seed + 100)
            xbar = jax.vjp(op, *inputs)[1](ybar)
            np.testing.assert_allclose(tree_inner(ybar, tangent), tree_inner(xbar, dargs),
                                       rtol=1e-9, atol=1e-9)
            moved = tuple(d if i in (0, 3, 4) else jnp.zeros_like(d) for i, d in enumerate(dargs))
            fd = tree_central_difference(op, inputs, moved)
            first = lambda t: jax.tree_util.tree_leaves(t)[0]  # noqa: E731
            assert_close(first(jax.jvp(op, inputs, moved)[1]), first(fd), rtol=1e-6,
                         atol=1e-6)


# tests/test_torch_nn.py::test_torch_nn_functional_prelu
def test_torch_nn_functional_prelu():
    _function_test(torch.nn.functional.prelu, [(6, 6), (1,)], 1e-10)
    _function_test(torch.nn.functional.prelu, [(5, 3, 16, 12), (3,)], 1e-10)


# tests/test_torch_nn.py::test_torch_nn_functional_scaled_dot_product_attention
def test_torch_nn_functional_scaled_dot_product_attention():
    _function_test(lambda x, y: x @ y, [(2, 3, 5), (5, 7)], 1e-10)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    _function_test(sdpa, [(5, 3, 7), (5, 2, 7), (5, 2, 7)], 1e-10)
    e, heads = 6, 2
    _function_test(
        lambda q, k, v, ipw, ipb, opw, opb: torch.nn.functional.multi_head_attention_forward(
            q, k, v, e, heads, ipw, ipb, None, None, False, 0.0, opw, opb, training=False,
            need_weights=False)[0],
        [(3, 1, 6)] * 3 + [(3 * e, e), (3 * e,), (e, e), (e,)], 1e-10)


# the classes of test_tree_coerce, registered with torch's pytrees only
@dataclasses.dataclass
class _A:
    a: torch.Tensor


@dataclasses.dataclass
class _B:
    a: _A
    b: int


torch.utils._pytree.register_dataclass(_A)
torch.utils._pytree.register_dataclass(_B)


def _torch_leaves(tree) -> list:
    return [np.asarray(l) for l in torch.utils._pytree.tree_leaves(tree)]


# tests/test_core.py::test_tree_coerce (torch2jax's main branch)
@pytest.mark.parametrize("mode", ["call", "translate"])
def test_tree_coerce(mode):
    """Structseqs come out as tuples, torch-registered dataclasses as the same classes
    (now JAX pytrees too), Python numbers as the arrays jax.jit makes of them."""
    def f():
        t1 = torch.return_types.max([1, torch.ones(3)])
        t2 = torch.return_types.topk([3.0, t1])
        t3 = _A(torch.ones(3, 2))
        t4 = _B(t3, 7)
        return (t2, t3, t4)

    op = ab.from_torch(f, mode=mode)
    want = f()
    for got in (jax.jit(op)(), op()):
        assert isinstance(got[1], _A) and isinstance(got[2], _B)
        assert isinstance(got[2].a, _A) and type(got[0]) is tuple
        leaves = jax.tree_util.tree_leaves(got)
        assert len(leaves) == len(_torch_leaves(want)) == 6
        for g, w in zip(leaves, _torch_leaves(want)):
            assert_close(g, w)
        assert got[2].b.dtype == np.int64 and got[0][0].dtype == np.float64  # x64 on


@pytest.mark.parametrize("mode", ["call", "translate"])
def test_tree_coerce_gradients(mode):
    """Values and derivatives through a dataclass output holding tensors, a structseq and
    a number: central differences, the transpose identity, and torch's autograd."""
    def f(x, w):
        m = torch.max(x * w, dim=0)
        return _B(_A(torch.sin(x) @ w), 2), (m, 1.5)

    x, w = random.normal(random.PRNGKey(0), (4, 3)), random.normal(random.PRNGKey(1), (3,))
    op = ab.from_torch(f, mode=mode)
    got = op(x, w)
    want = f(_t(x), _t(w))
    for g, r in zip(jax.tree_util.tree_leaves(got), _torch_leaves(want), strict=True):
        assert_close(g, r)
    check_first_order(op, (x, w))
    check_first_order(jax.jit(op), (x, w))
    loss = lambda o: (o[0].a.a ** 2).sum() + o[1][0][0].sum()  # noqa: E731
    gx, gw = jax.jit(jax.grad(lambda x, w: loss(op(x, w)), argnums=(0, 1)))(x, w)
    tx, tw = _t(x).requires_grad_(), _t(w).requires_grad_()
    out = f(tx, tw)
    ((out[0].a.a ** 2).sum() + out[1][0][0].sum()).backward()
    assert_close(gx, tx.grad.numpy())
    assert_close(gw, tw.grad.numpy())
    batched = jax.vmap(op, in_axes=(0, None))(jnp.stack([x, 2 * x]), w)
    assert isinstance(batched[0], _B)
    assert_close(batched[0].a.a[1], op(2 * x, w)[0].a.a)


class _Pair:
    """A class torch's pytrees know through register_pytree_node, with a list context."""

    def __init__(self, first, second, names):
        self.first, self.second, self.names = first, second, names


torch.utils._pytree.register_pytree_node(
    _Pair, lambda p: ([p.first, p.second], list(p.names)),
    lambda children, names: _Pair(*children, names))


@pytest.mark.parametrize("mode", ["call", "translate"])
def test_tree_coerce_custom_node(mode):
    """Beyond torch2jax's test: a node registered with register_pytree_node (its context
    a list, which JAX's aux data must hash) comes out as itself, under jit (twice: the
    cache) and grad."""
    op = ab.from_torch(lambda x: _Pair(x.exp(), x.sum(), ["e", "s"]), mode=mode)
    x = random.normal(random.PRNGKey(3), (4,))
    for _ in range(2):
        got = jax.jit(op)(x)
        assert isinstance(got, _Pair) and got.names == ["e", "s"]
        assert_close(got.first, np.exp(np.asarray(x)))
    g = jax.jit(jax.grad(lambda x: op(x).first.sum() + 3 * op(x).second))(x)
    assert_close(g, np.exp(np.asarray(x)) + 3)
    check_first_order(op, (x,))


def test_tree_coerce_refused():
    """An output no JAX pytree of arrays holds is an error naming the op, the output and
    what it is."""
    x = np.ones(3)
    op = ab.from_torch(lambda x: (x, collections.deque([x])), name="queue")
    with pytest.raises(TypeError, match=r"'queue'.*output \[1\] is a collections.deque"):
        op(x)
    op = ab.from_torch(lambda x: {"y": x, "tag": "label"}, name="tagged")
    with pytest.raises(TypeError, match=r"'tagged'.*output \['tag'\] is a builtins.str"):
        op(x)
