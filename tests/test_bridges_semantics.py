"""ab.from_torch on the torch programs users write: the nine findings of the bridges' round 2.

Each test names its finding. Values are checked against torch itself (the same code
run by torch), derivatives against central differences and the transpose identity
where the function is deterministic, and against torch's own autograd otherwise.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import assert_close, check_first_order, randn


def _t(x):
    return torch.from_numpy(np.array(x))


def _np(t):
    return t.detach().numpy()


def _state(module):
    return {k: jnp.array(v.numpy()) for k, v in module.state_dict().items()}


def _unchanged(tree, kept):
    for k in kept:
        np.testing.assert_array_equal(np.asarray(tree[k]), kept[k], err_msg=k)


# ------------------------------------------------ 1. bfloat16 derivatives are not zero

def test_bfloat16_derivatives_match_torch():
    op = ab.from_torch(lambda x: torch.sin(x) * x, name="bf")
    x = jnp.asarray(randn((5,)), jnp.bfloat16)
    t = _t(np.asarray(x, np.float32)).to(torch.bfloat16).requires_grad_()
    (torch.sin(t) * t).sum().backward()
    want = t.grad.float().numpy()
    grad = jax.grad(lambda x: op(x).sum())(x)
    assert grad.dtype == jnp.bfloat16 and np.all(np.asarray(grad, np.float32) != 0)
    assert_close(np.asarray(grad, np.float32), want, rtol=2e-2, atol=2e-2)
    tan = jax.jvp(op, (x,), (jnp.ones_like(x),))[1]
    assert_close(np.asarray(tan, np.float32), want, rtol=2e-2, atol=2e-2)


def test_bfloat16_under_op_torch():
    f = ab.to_torch(lambda x: jnp.sin(x) * 2)
    x = torch.linspace(0.1, 1.0, 4, dtype=torch.bfloat16, requires_grad=True)
    f(x).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    assert_close(x.grad.float().numpy(), 2 * np.cos(x.detach().float().numpy()),
                 rtol=2e-2, atol=2e-2)


# ------------------------------------------ 2. no torch code can change a JAX array

_WRITERS = {
    "add_": lambda x: x.add_(1) * 2,
    "through .data": lambda x: (x.data.add_(1), x * 2)[1],
    "through .numpy()": lambda x: (np.add(x.numpy(), 1, out=x.numpy()), x * 2)[1],
    "out=": lambda x: torch.mul(x, 2, out=x),
    "a view": lambda x: (x[1:].zero_(), x * 2)[1],
}


@pytest.mark.parametrize("name", list(_WRITERS))
def test_writes_into_an_input_never_reach_the_jax_array(name):
    fn = _WRITERS[name]
    op = ab.from_torch(fn, shape=ab.like(0), name="writer")
    x = jnp.asarray(randn((4,)))
    kept = np.array(x)
    want = _np(fn(_t(kept)))  # torch's own result, on a copy
    for run in (op, jax.jit(op)):
        assert_close(run(x), want)
        np.testing.assert_array_equal(np.asarray(x), kept)


def test_functional_batch_norm_in_training_leaves_the_statistics_alone():
    bn = lambda x, rm, rv: torch.nn.functional.batch_norm(x, rm, rv, training=True)
    op = ab.from_torch(bn, name="bn")
    x, rm, rv = jnp.asarray(randn((6, 3))), jnp.zeros(3), jnp.ones(3)
    want = _np(bn(_t(x), torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)))
    assert_close(op(x, rm, rv), want)
    np.testing.assert_array_equal(np.asarray(rm), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(rv), np.ones(3))


def test_batch_norm_module_in_train_mode_leaves_params_alone():
    torch.manual_seed(0)
    net = torch.nn.BatchNorm1d(3).double().train()
    params = _state(net)
    kept = {k: np.array(v) for k, v in params.items()}
    op = ab.from_torch(net, discard_state=True)  # (without it: an error, see round 4)
    x = jnp.asarray(randn((6, 3)))
    assert_close(op(params, x), _np(net(_t(x))))
    _unchanged(params, kept)


def _data_ptr_of_input(fn):
    seen = []

    def f(x):
        try:
            seen.append(x.data_ptr())
        except RuntimeError:  # a fake tensor's data_ptr() (the fake run): no memory
            pass
        return fn(x)
    return f, seen


def test_inputs_are_private_copies():
    """Every input is a private copy, so that no write, by any path, reaches XLA's buffer
    (round 4: a write that depends on the data, ``.numpy()`` or ``data_ptr()`` writes,
    a tensor kept and written later are all invisible to a run on fake tensors)."""
    reader, seen_r = _data_ptr_of_input(lambda x: x * 2)
    writer, seen_w = _data_ptr_of_input(lambda x: x.mul_(2))
    x = jnp.asarray(randn((1000,)))
    assert_close(ab.from_torch(reader, name="reader")(x), 2 * np.asarray(x))
    assert_close(ab.from_torch(writer, name="writer")(x), 2 * np.asarray(x))
    assert seen_r[-1] != x.unsafe_buffer_pointer()
    assert seen_w[-1] != x.unsafe_buffer_pointer()


# --------------------------------------- 3. derivatives use the value's random draws

def _dropout():
    return ab.from_torch(lambda x: torch.nn.functional.dropout(x, 0.5) * x, name="drop")


def test_dropout_gradient_uses_the_mask_of_its_value():
    op, x = _dropout(), jnp.asarray(1.0 + np.abs(randn((64,))))
    for vjp in (jax.vjp, jax.jit(jax.vjp, static_argnums=0)):
        y, pullback = vjp(op, x)
        mask = np.asarray(y) != 0
        assert 0 < mask.sum() < 64
        (g,) = pullback(jnp.ones(64))
        assert_close(g, np.where(mask, 4 * np.asarray(x), 0.0))  # d(2 m x²)/dx = 4 m x
    y, t = jax.jvp(op, (x,), (jnp.ones(64),))
    assert_close(t, np.where(np.asarray(y) != 0, 4 * np.asarray(x), 0.0))


def test_random_draws_still_advance_between_calls():
    op, x = _dropout(), jnp.ones(64)
    first, second = np.asarray(op(x)), np.asarray(op(x))
    assert not np.array_equal(first != 0, second != 0)
    state = torch.get_rng_state()
    jax.grad(lambda x: op(x).sum())(x)
    assert not torch.equal(state, torch.get_rng_state())  # the value's draws only


# -------------------------------- 4. modules with buffers: eval, train, and their state

def _bn_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()


def _split(params):
    return ({k: v for k, v in params.items() if "num_batches" not in k},
            {k: v for k, v in params.items() if "num_batches" in k})


def test_eval_mode_module_with_buffers_is_differentiable_in_its_weights():
    net = _bn_net()
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    net.eval()
    op = ab.from_torch(net)
    floats, ints = _split(_state(net))
    x = jnp.asarray(randn((5, 3)))
    loss = lambda w, x: jnp.sum(jnp.sin(op({**w, **ints}, x)))
    got = jax.grad(loss)(floats, x)
    weights = {k for k, _ in net.named_parameters()}
    tp = {k: _t(v) for k, v in floats.items() if k in weights}
    tb = {k: _t(v) for k, v in {**floats, **ints}.items() if k not in weights}
    want = torch.func.grad(lambda p: torch.sin(torch.func.functional_call(
        net, {**p, **tb}, (_t(x),))).sum())(tp)
    for k in floats:
        if k.endswith(("running_mean", "running_var")):
            np.testing.assert_array_equal(np.asarray(got[k]), 0.0)  # never differentiated
        else:
            assert_close(got[k], want[k].numpy())
    check_first_order(lambda x: op({**floats, **ints}, x), (x,))


def test_train_mode_state_returned_trains_like_torch():
    """Two functional training steps give torch's outputs, running statistics and step
    count (``return_state=True``, as torch2jax's ``return_state_dict=True``)."""
    net = _bn_net().train()
    twin = _bn_net().train()
    op = ab.from_torch(net, return_state=True)
    params = _state(net)
    kept = {k: np.array(v) for k, v in params.items()}
    for step in range(2):
        x = randn((6, 3), seed=step)
        out, state = jax.jit(op)(params, x)
        assert_close(out, _np(twin(_t(x))))
        _unchanged(params, kept)
        params = {**params, **state}
        kept = {k: np.array(v) for k, v in params.items()}
    for k, v in twin.state_dict().items():
        assert_close(params[k], v.numpy())
    assert int(params["1.num_batches_tracked"]) == 2
    floats, ints = _split(params)
    got = jax.grad(lambda w: op({**w, **ints}, x)[0].sum() ** 2)(floats)
    weights = {k for k, _ in twin.named_parameters()}
    tp = {k: _t(v) for k, v in floats.items() if k in weights}
    tb = {k: _t(v) for k, v in {**floats, **ints}.items() if k not in weights}
    want = torch.func.grad(lambda p: torch.func.functional_call(
        twin, {**p, **{k: v.clone() for k, v in tb.items()}}, (_t(x),)).sum() ** 2)(tp)
    assert_close(got["0.weight"], want["0.weight"].numpy(), rtol=1e-8, atol=1e-8)


def test_return_state_is_for_modules():
    with pytest.raises(TypeError, match=r"from_torch: return_state=True is for an nn.Module"):
        ab.from_torch(torch.sin, return_state=True)


# ------------------------------------------------------- 5. torch.return_types outputs

@pytest.mark.parametrize("fn", [
    lambda x: torch.max(x, 1), lambda x: torch.sort(x, 1), lambda x: torch.topk(x, 2),
    lambda x: torch.linalg.eigh(x @ x.T), lambda x: torch.linalg.qr(x),
    lambda x: torch.linalg.svd(x, full_matrices=False)],
    ids=["max", "sort", "topk", "eigh", "qr", "svd"])
def test_return_types_outputs_are_tuples(fn):
    op = ab.from_torch(fn)
    x = randn((3, 3))
    got, want = op(x), fn(_t(x))
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w.numpy())
    first = lambda x: op(x)[0]
    check_first_order(lambda x: jnp.sum(jnp.abs(first(x)) ** 2), (jnp.asarray(x),),
                      rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 6. tied weights

class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(3, 3, bias=False)
        self.head = torch.nn.Linear(3, 3, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return torch.tanh(self.head(torch.tanh(self.embed(x))))


@pytest.mark.parametrize("keyed", ["state_dict", "named_parameters"])
def test_tied_weights(keyed):
    torch.manual_seed(0)
    net = _Tied().double()
    op = ab.from_torch(net)
    params = {k: jnp.array(v.detach().numpy()) for k, v in dict(getattr(net, keyed)()).items()}
    x = jnp.asarray(randn((4, 3)))
    assert_close(op(params, x), _np(net(_t(x))))
    got = jax.grad(lambda p: op(p, x).sum())(params)
    net.zero_grad()
    net(_t(x)).sum().backward()
    assert_close(got["embed.weight"], net.embed.weight.grad.numpy())  # both uses
    if "head.weight" in got:  # the tied name's value is the first name's: no gradient
        np.testing.assert_array_equal(np.asarray(got["head.weight"]), 0.0)
    check_first_order(lambda w: op({"embed.weight": w}, x), (params["embed.weight"],))


# ------------------------- 7. second derivatives of an autograd.Function, old style

class _Cube(torch.autograd.Function):
    """forward(ctx, x) and backward only: no setup_context, so torch.func refuses it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g


def test_second_derivatives_of_an_old_style_autograd_function():
    op = ab.from_torch(lambda x: _Cube.apply(x), name="cube")
    x = jnp.asarray(randn((4,)))
    grad = lambda x: jax.grad(lambda x: op(x).sum())(x)
    assert_close(grad(x), 3 * np.asarray(x) ** 2)
    # reverse over reverse (torch has no forward mode for it): a Hessian-vector product
    # against central differences of the gradient, and against 6x·v
    v, h = randn((4,), seed=1), 1e-5
    hvp = jax.grad(lambda x: jnp.vdot(grad(x), v))(x)
    assert_close(hvp, (grad(x + h * v) - grad(x - h * v)) / (2 * h), rtol=1e-6, atol=1e-6)
    assert_close(hvp, 6 * np.asarray(x) * v)


# -------------------------------------- 8. shapes where fake tensors cannot run the code

def test_shapes_of_item_and_of_a_module_made_inside():
    scaled = ab.from_torch(lambda x: x * x.sum().item(), name="item")
    x = randn((3,))
    assert_close(scaled(x), x * x.sum())

    def fresh(x):
        torch.manual_seed(1)
        return torch.nn.Linear(3, 2).to(x)(x)
    op = ab.from_torch(fresh)
    assert jax.eval_shape(op, jax.ShapeDtypeStruct((5, 3), jnp.float64)) == \
        jax.ShapeDtypeStruct((5, 2), jnp.float64)
    assert_close(op(randn((5, 3))), _np(fresh(_t(randn((5, 3))))))
    nz = ab.from_torch(lambda x: torch.nonzero(x), name="nonzero")  # still needs shape=
    with pytest.raises(TypeError, match=r"nonzero.*fake tensors.*Give shape="):
        nz(np.ones(3))


# --------------------------------------------------------- 9. out-of-place semantics

def test_in_place_code_is_out_of_place_with_its_derivatives():
    op = ab.from_torch(lambda x, y: x.mul_(y).sin_(), name="inplace")
    x, y = jnp.asarray(randn((4,))), jnp.asarray(randn((4,), seed=1))
    kept = np.array(x), np.array(y)
    assert_close(op(x, y), np.sin(kept[0] * kept[1]))
    check_first_order(op, (x, y))
    assert_close(jax.jacfwd(jax.grad(lambda x: op(x, y).sum()))(x),
                 np.diag(-np.sin(kept[0] * kept[1]) * kept[1] ** 2))
    np.testing.assert_array_equal(np.asarray(x), kept[0])
    np.testing.assert_array_equal(np.asarray(y), kept[1])


# ---------------------------------------------------------- pickling (trust round 3, F11)

def test_a_from_torch_op_pickles_as_from_torch_of_its_code():
    """An op made by ab.from_torch pickles as that call (its function or module, and the
    options), not as the rules the bridge made: it loads and differentiates as before."""
    import pickle

    net = torch.nn.Linear(3, 2).double()
    for made in (ab.from_torch(torch.sin, name="pickled_sin"), ab.from_torch(net)):
        back = pickle.loads(pickle.dumps(made))
        assert back.name == made.name
        args = ((jnp.linspace(0.1, 1.0, 3),) if made.name == "pickled_sin" else
                ({k: jnp.array(v.detach().numpy()) for k, v in net.state_dict().items()},
                 jnp.linspace(0.1, 1.0, 3)))
        f = lambda *a, op=made: op(*a).sum()  # noqa: E731
        g = lambda *a, op=back: op(*a).sum()  # noqa: E731
        np.testing.assert_allclose(g(*args), f(*args), rtol=1e-12)
        for a, b in zip(jax.tree_util.tree_leaves(jax.grad(g)(*args)),
                        jax.tree_util.tree_leaves(jax.grad(f)(*args))):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_to_torch_pickles_and_op_torch_names_the_way_out():
    import pickle

    back = pickle.loads(pickle.dumps(ab.to_torch(jnp.sin, name="pickled_to_torch")))
    x = torch.linspace(0.1, 1.0, 3, dtype=torch.float64)
    torch.testing.assert_close(back(x), torch.sin(x))
    with pytest.raises(pickle.PicklingError, match="'traced_cos': its op.torch pickles with "
                                                   "the op"):
        pickle.dumps(ab.bind(jnp.cos, traced=True, name="traced_cos").torch)


def test_from_torch_takes_the_vmap_modes_by_jax_names():
    seen = []

    def f(x, w):
        seen.append(tuple(w.shape))
        return x * w

    op = ab.from_torch(f, vmap="broadcast_all", name="bcast_torch")
    out = jax.vmap(op, in_axes=(0, None))(jnp.ones((4, 3)), jnp.arange(3.0))
    np.testing.assert_allclose(out, np.tile(np.arange(3.0), (4, 1)))
    assert (4, 3) in seen


def test_an_op_given_back_by_the_front_end_says_what_to_pickle():
    import pickle

    op = ab.bind(jnp.sin, traced=True, name="given_back")
    back = ab.from_torch(op.torch)
    with pytest.raises(pickle.PicklingError, match="'given_back' was given back by a front "
                                                   "end.*pickle the op it came from"):
        pickle.dumps(back)
