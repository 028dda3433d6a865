"""Trust, round 4, the PyTorch bridge: random draws carried, writes that never land, and
module state kept explicit.

Each test names the probe it answers. Random draws: a dropout's gradient must be zero
exactly where its value is (the value's own mask), whatever the order, number, threads
and transformations of the calls: f(x) = dropout(x, ½)·x has ∂f/∂x = 4x·m, with m the
mask (the value is 2x²·m). Writes: the caller's array is compared bit for bit. Module
state: the wrapped module's ``state_dict()`` is compared bit for bit.
"""
import functools
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import assert_close, randn, run_fresh_python


def _drop(p=0.5, name="drop"):
    return ab.from_torch(lambda x: torch.nn.functional.dropout(x, p) * x, name=name)


def _x(n=64, seed=0):
    return jnp.asarray(1.0 + np.abs(randn((n,), seed=seed)))


def _grad_of_mask(y, x):
    """∂(2x²·m)/∂x = 4x·m, m read off the value y = 2x²·m."""
    return np.where(np.asarray(y) != 0, 4 * np.asarray(x), 0.0)


def _check(y, g, x):
    y, g = np.asarray(y), np.asarray(g)
    mask = y != 0
    assert 0 < mask.sum() < mask.size, "the draws must zero some entries and keep others"
    np.testing.assert_array_equal(g == 0, ~mask)  # zero exactly where the value is
    assert_close(g, _grad_of_mask(y, x))


# ------------------------------------------------------------- random draws

def test_value_and_grad_of_two_calls_on_one_input():
    """value_and_grad of f(x) + 10·f(x), eager and jit: each call's gradient is its mask's."""
    op, x = _drop(), _x()

    def loss(x):
        a, b = op(x), op(x)
        return a.sum() + 10 * b.sum(), (a, b)
    for run in (jax.value_and_grad(loss, has_aux=True),
                jax.jit(jax.value_and_grad(loss, has_aux=True))):
        (_, (a, b)), g = run(x)
        assert not np.array_equal(np.asarray(a) != 0, np.asarray(b) != 0)  # two draws
        assert_close(g, _grad_of_mask(a, x) + 10 * _grad_of_mask(b, x))


def test_first_calls_vjp_after_a_second_call():
    op, x = _drop(), _x()
    y1, pb1 = jax.vjp(op, x)
    y2, pb2 = jax.vjp(op, x)
    assert not np.array_equal(np.asarray(y1) != 0, np.asarray(y2) != 0)
    _check(y1, pb1(jnp.ones(64))[0], x)
    _check(y2, pb2(jnp.ones(64))[0], x)
    _check(y1, pb1(jnp.ones(64))[0], x)  # again, after both


@pytest.mark.parametrize("differ", [1, 2048])
def test_inputs_differing_in_few_or_many_entries(differ):
    op = _drop()
    x1 = _x(4096)
    x2 = x1.at[:differ].add(1.0)
    y1, pb1 = jax.vjp(op, x1)
    y2, pb2 = jax.vjp(op, x2)
    _check(y2, pb2(jnp.ones(4096))[0], x2)
    _check(y1, pb1(jnp.ones(4096))[0], x1)


def test_jit_value_and_grad_of_lax_map_over_rows():
    op = _drop()
    xs = jnp.stack([_x(8, seed=i) for i in range(10)])

    def loss(xs):
        ys = jax.lax.map(op, xs)
        return ys.sum(), ys
    for run in (jax.jit(jax.value_and_grad(loss, has_aux=True)),
                jax.value_and_grad(loss, has_aux=True)):
        (_, ys), g = run(xs)
        assert_close(g, _grad_of_mask(ys, xs))
        assert len({tuple(np.asarray(r) != 0) for r in ys}) > 1  # rows draw anew


def test_scan_carries_the_draws_of_each_step():
    op = _drop()

    def loss(x):
        def step(c, _):
            y = op(c)
            return c + 0.0 * y, y
        _, ys = jax.lax.scan(step, x, None, length=6)
        return ys.sum(), ys
    x = _x(16)
    (_, ys), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    assert_close(g, _grad_of_mask(ys, jnp.broadcast_to(x, ys.shape)).sum(0))


def test_more_than_256_calls_before_their_gradients():
    op, x = _drop(), _x(32)
    calls = [jax.vjp(op, x) for _ in range(300)]
    for y, pb in reversed(calls):
        _check(y, pb(jnp.ones(32))[0], x)


def _vmapped(op, xs):
    """(ys, gradient) of Σ vmap(op)(xs), eagerly and under jit."""
    def loss(xs):
        ys = jax.vmap(op)(xs)
        return ys.sum(), ys
    for run in (jax.value_and_grad(loss, has_aux=True),
                jax.jit(jax.value_and_grad(loss, has_aux=True))):
        (_, ys), g = run(xs)
        yield ys, g


@pytest.mark.parametrize("mode", ["sequential", "expand_dims", "broadcast_all"])
def test_vmap_modes_over_equal_rows(mode):
    op = ab.from_torch(lambda x: torch.nn.functional.dropout(x, 0.5) * x, vmap=mode)
    xs = jnp.tile(_x(32), (6, 1))
    for ys, g in _vmapped(op, xs):
        assert_close(g, _grad_of_mask(ys, xs))
        if mode == "sequential":  # one call per row: each row draws its own mask
            assert len({tuple(np.asarray(r) != 0) for r in ys}) > 1


def test_vmap_by_torch_vmap_and_by_a_rule():
    by_torch = _drop()
    rule = lambda n, in_batched, x: (torch.nn.functional.dropout(x, 0.5) * x, True)
    by_rule = ab.from_torch(lambda x: torch.nn.functional.dropout(x, 0.5) * x, vmap=rule)
    xs = jnp.tile(_x(32), (4, 1))
    for op in (by_torch, by_rule):
        for ys, g in _vmapped(op, xs):
            assert_close(g, _grad_of_mask(ys, xs))


def test_jvp_and_linearize_use_the_values_draws():
    op, x = _drop(), _x()
    for jvp in (jax.jvp, jax.jit(jax.jvp, static_argnums=0)):
        y, t = jvp(op, (x,), (jnp.ones(64),))
        _check(y, t, x)
    y, lin = jax.linearize(op, x)
    _check(y, lin(jnp.ones(64)), x)


def test_hessian_vector_product_uses_the_values_draws():
    """Forward over reverse: the second derivative of 2x²·m is 4·m."""
    op, x = _drop(), _x()

    def loss(x):
        y = op(x)
        return y.sum(), y
    g, hv, y = jax.jvp(jax.grad(loss, has_aux=True), (x,), (jnp.ones(64),), has_aux=True)
    assert_close(g, _grad_of_mask(y, x))
    assert_close(hv, np.where(np.asarray(y) != 0, 4.0, 0.0))


def test_two_threads_calling_one_op():
    op, errors = _drop(), []
    x = _x(80)
    grad = jax.jit(jax.value_and_grad(lambda x: (lambda y: (y.sum(), y))(op(x)), has_aux=True))

    def work():
        try:
            for _ in range(20):
                (_, y), g = grad(x)
                _check(y, g, x)
                y, pb = jax.vjp(op, x)
                _check(y, pb(jnp.ones(80))[0], x)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


_GEN = torch.Generator().manual_seed(3)


def _global_gen_drop(x):
    keep = torch.bernoulli(torch.full_like(x, 0.5), generator=_GEN)
    return 2 * keep * x * x


@pytest.mark.parametrize("where", ["closure", "global", "default", "module attribute"])
def test_a_users_generator_object(where):
    g = torch.Generator().manual_seed(7)

    def closure(x):
        return 2 * torch.bernoulli(torch.full_like(x, 0.5), generator=g) * x * x

    def default(x, gen=g):
        return 2 * torch.bernoulli(torch.full_like(x, 0.5), generator=gen) * x * x

    class Mod(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gen = g

        def forward(self, x):
            return 2 * torch.bernoulli(torch.full_like(x, 0.5), generator=self.gen) * x * x
    fn = {"closure": closure, "global": _global_gen_drop, "default": default,
          "module attribute": Mod()}[where]
    op = ab.from_torch(fn)
    call = (lambda x: op({}, x)) if where == "module attribute" else op
    x = _x()
    gen = _GEN if where == "global" else g
    for _ in range(3):
        before = gen.get_state()
        y, pb = jax.vjp(call, x)
        assert not torch.equal(before, gen.get_state())  # the user's generator moves on
        _check(y, pb(jnp.ones(64))[0], x)
        (v, y2), g2 = jax.jit(jax.value_and_grad(lambda x: (lambda y: (y.sum(), y))(call(x)),
                                                 has_aux=True))(x)
        _check(y2, g2, x)


def test_a_generator_that_cannot_be_found_is_an_error_naming_the_op():
    gens = {"g": torch.Generator().manual_seed(1)}
    lookup = gens.get  # a builtin method: nothing anybind looks into

    def fn(x):
        return torch.bernoulli(torch.full_like(x, 0.5), generator=lookup("g")) * x
    op = ab.from_torch(fn, name="hidden_gen")
    with pytest.raises(TypeError, match=r"anybind op 'hidden_gen'.*torch.Generator"):
        op(_x())


def test_draws_are_reproducible_from_torchs_seed_and_move_the_generator():
    op, x = _drop(), _x()
    torch.manual_seed(11)
    a = np.asarray(op(x))
    torch.manual_seed(11)
    b = np.asarray(op(x))
    np.testing.assert_array_equal(a, b)
    state = torch.get_rng_state()
    jax.grad(lambda x: op(x).sum())(x)
    assert not torch.equal(state, torch.get_rng_state())


def test_checkpoint_keeps_the_values_draws():
    op, x = _drop(), _x()

    def loss(x):
        y = jax.checkpoint(op)(x)
        return y.sum(), y
    for run in (jax.value_and_grad(loss, has_aux=True),
                jax.jit(jax.value_and_grad(loss, has_aux=True))):
        (_, y), g = run(x)
        _check(y, g, x)


def test_deterministic_functions_take_no_draws():
    """No seeds for a function that draws nothing: its calls are as before."""
    op = ab.from_torch(lambda x: torch.sin(x) * 2, name="det")
    jaxpr = jax.make_jaxpr(op)(jnp.ones(3))
    assert "draws" not in str(jaxpr)
    rnd = jax.make_jaxpr(_drop(name="rnd"))(jnp.ones(3))
    assert "rnd_draws" in str(rnd)


# ------------------------------------------------------------ module state

def _bn_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()


def _state(module):
    return {k: jnp.array(v.numpy()) for k, v in module.state_dict().items()}


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_state(module, kept):
    now = module.state_dict()
    assert set(now) == set(kept)
    for k, v in kept.items():
        assert torch.equal(now[k], v), k  # bit for bit
        assert now[k].dtype == v.dtype


def test_params_missing_the_buffers_is_an_error_naming_them():
    net = _bn_net().train()
    op = ab.from_torch(net, return_state=True)
    params = {k: jnp.array(v.detach().numpy()) for k, v in net.named_parameters()}
    kept = _snapshot(net)
    with pytest.raises(TypeError, match=r"anybind op 'Sequential'.*missing key\(s\).*"
                                        r"1\.num_batches_tracked.*1\.running_mean"):
        op(params, jnp.ones((5, 3)))
    _same_state(net, kept)


def test_unknown_keys_are_an_error_naming_them():
    net = _bn_net().eval()
    op = ab.from_torch(net)
    params = _state(net)
    params["1.running_meen"] = params.pop("1.running_mean")
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['1\.running_meen'\].*missing "
                                        r"key\(s\) \['1\.running_mean'\]"):
        op(params, jnp.ones((5, 3)))
    with pytest.raises(TypeError, match=r"unknown key\(s\)"):
        jax.jit(op)(params, jnp.ones((5, 3)))


def test_tied_names_need_only_one_of_them():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2).double()
            self.b = self.a

        def forward(self, x):
            return self.b(self.a(x))
    m = Tied()
    op = ab.from_torch(m)
    params = {k: jnp.array(v.detach().numpy()) for k, v in m.named_parameters()}
    assert set(params) == {"a.weight", "a.bias"}
    x = jnp.ones((3, 2))
    assert_close(op(params, x), m(torch.ones(3, 2, dtype=torch.float64)).detach().numpy())


def test_train_mode_updates_without_return_state_are_an_error():
    net = _bn_net().train()
    op = ab.from_torch(net, name="bn_net")
    params, kept = _state(net), _snapshot(net)
    for run in (op, jax.jit(op)):
        with pytest.raises(Exception, match=r"anybind op 'bn_net'.*train mode.*"
                                            r"1\.num_batches_tracked.*return_state=True.*"
                                            r"module\.eval\(\).*discard_state=True"):
            run(params, jnp.ones((5, 3)))
    _same_state(net, kept)


def test_discard_state_opts_out_and_changes_nothing():
    net, twin = _bn_net().train(), _bn_net().train()
    op = ab.from_torch(net, discard_state=True)
    params, kept = _state(net), _snapshot(net)
    arrays = {k: np.array(v) for k, v in params.items()}
    x = randn((5, 3))
    assert_close(op(params, x), twin(torch.from_numpy(x)).detach().numpy())
    floats = {k: v for k, v in params.items() if "num_batches" not in k}
    ints = {k: v for k, v in params.items() if "num_batches" in k}
    jax.grad(lambda w: op({**w, **ints}, x).sum())(floats)
    _same_state(net, kept)
    for k, v in arrays.items():
        np.testing.assert_array_equal(np.asarray(params[k]), v)


def test_discard_and_return_state_are_for_modules():
    with pytest.raises(TypeError, match=r"discard_state=True is for an nn.Module"):
        ab.from_torch(torch.sin, discard_state=True)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_wrapped_module_never_changes(mode):
    """Its state_dict() is bit-identical after eager calls, jit, grad, vmap, jvp (fake
    runs included: num_batches_tracked stays 0)."""
    net = _bn_net()
    getattr(net, mode)()
    kept = _snapshot(net)
    op = ab.from_torch(net, return_state=True)
    params = _state(net)
    x = jnp.asarray(randn((5, 3)))
    f = lambda p, x: op(p, x)[0].sum()
    floats = {k: v for k, v in params.items() if "num_batches" not in k}
    ints = {k: v for k, v in params.items() if "num_batches" in k}
    op(params, x)
    jax.jit(op)(params, x)
    jax.grad(lambda w: f({**w, **ints}, x))(floats)
    jax.jit(jax.grad(lambda w: f({**w, **ints}, x)))(floats)
    jax.jvp(lambda x: op(params, x)[0], (x,), (jnp.ones_like(x),))
    if mode == "eval":  # (torch.vmap refuses a batch norm that updates its statistics)
        jax.vmap(lambda x: op(params, x)[0])(jnp.stack([x, x]))
    _same_state(net, kept)
    assert int(net[1].num_batches_tracked) == 0


def test_eval_then_train_after_the_first_call_leaves_the_callers_arrays():
    """mode="call" reads the module's flags at each run, compiled or not. The default
    mode="auto" reads them at each call it traces: an eager call raises as "call" does,
    while a program compiled before keeps the eval program it traced (JAX code)."""
    net = _bn_net().eval()
    op = ab.from_torch(net, name="switch", mode="call")
    auto = ab.from_torch(net, name="switch")
    params = _state(net)
    arrays = {k: np.array(v) for k, v in params.items()}
    x = jnp.asarray(randn((5, 3)))
    op(params, x)
    jitted, jitted_auto = jax.jit(op), jax.jit(auto)
    jitted(params, x)
    evaluated = np.asarray(jitted_auto(params, x))
    net.train()
    for run in (op, jitted, auto):
        with pytest.raises(Exception, match=r"anybind op 'switch'.*train mode"):
            jax.block_until_ready(run(params, x))
    assert_close(jitted_auto(params, x), evaluated)
    for k, v in arrays.items():
        np.testing.assert_array_equal(np.asarray(params[k]), v, err_msg=k)


def test_non_persistent_buffers_are_the_modules_and_never_change():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(3, dtype=torch.float64), persistent=False)
            self.w = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))

        def forward(self, x):
            self.seen.add_(1)
            return x * self.w + self.seen
    m = Counter()
    op = ab.from_torch(m, discard_state=True)
    out = op({"w": jnp.ones(3)}, jnp.zeros(3))
    assert_close(out, np.ones(3))
    assert_close(op({"w": jnp.ones(3)}, jnp.zeros(3)), np.ones(3))
    assert torch.equal(m.seen, torch.zeros(3, dtype=torch.float64))


# ------------------------------------------------------------------- writes

def _writes_for_some_values(x):
    if float(x.sum()) > 0:  # fake tensors cannot tell: the write depends on the data
        x.add_(1)
    return x * 2


def test_a_data_dependent_write_never_lands():
    op = ab.from_torch(_writes_for_some_values, shape=ab.like(0), name="dd")
    neg, pos = -jnp.ones(4), jnp.ones(4)
    assert_close(op(neg), -2 * np.ones(4))
    for run in (op, jax.jit(op)):
        got = run(pos)
        np.testing.assert_array_equal(np.asarray(pos), np.ones(4))  # the caller's array
        assert_close(got, 4 * np.ones(4))  # out-of-place: (x + 1) * 2


def test_under_jit_another_consumer_reads_the_unwritten_values():
    op = ab.from_torch(_writes_for_some_values, shape=ab.like(0), name="dd2")

    @jax.jit
    def f(x):
        return op(x), x * 10
    a, b = f(jnp.ones(4))
    assert_close(a, 4 * np.ones(4))
    assert_close(b, 10 * np.ones(4))


def test_a_tensor_kept_past_the_call_cannot_be_written_later():
    kept = []

    def keep(x):
        kept.append(x)
        return x * 2
    op = ab.from_torch(keep, name="keeper")
    x = jnp.arange(4.0)
    assert_close(op(x), 2 * np.arange(4.0))
    kept[-1].add_(100)  # a private copy: the write stays there
    np.testing.assert_array_equal(np.asarray(x), np.arange(4.0))


def _ctypes_write(x):
    import ctypes
    ctypes.memset(x.data_ptr(), 0, 8)  # writes through the address, as C extensions do
    return x * 2


def test_a_data_ptr_write_does_not_crash_the_fake_run():
    """A fake tensor's data_ptr() is no memory: the fake run refuses it and the example
    run (or shape=) gives the spec; the write itself reaches a private copy."""
    op = ab.from_torch(_ctypes_write, name="ctw")
    x = jnp.arange(1.0, 5.0)
    out = op(x)
    assert out.shape == (4,)
    np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 5.0))


# ----------------------------------------------------------------- pickling

def _halving_vjp(primals, ct):
    return (0.5 * ct,)


def _sin_torch(x):
    return torch.sin(x)


def test_a_pickled_op_keeps_the_rule_the_user_set():
    op = ab.from_torch(_sin_torch, name="sin_rule")
    op.def_vjp(_halving_vjp)
    x = jnp.linspace(0.1, 1.0, 4)
    back = pickle.loads(pickle.dumps(op))
    assert_close(jax.grad(lambda x: back(x).sum())(x), 0.5 * np.ones(4))
    assert_close(back(x), np.sin(np.asarray(x)))
    plain = pickle.loads(pickle.dumps(ab.from_torch(_sin_torch)))
    assert_close(jax.grad(lambda x: plain(x).sum())(x), np.cos(np.asarray(x)))


@pytest.mark.slow
def test_a_pickled_op_keeps_the_rule_in_a_fresh_process(tmp_path):
    import sys
    op = ab.from_torch(_sin_torch, name="sin_rule")
    op.def_vjp(_halving_vjp)
    path = tmp_path / "op.pkl"
    path.write_bytes(pickle.dumps(op))
    res = run_fresh_python(
        "import pickle, sys, jax, jax.numpy as jnp\n"
        f"sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})\n"
        f"op = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "print(list(map(float, jax.grad(lambda x: op(x).sum())(jnp.linspace(0.1, 1.0, 4)))))\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == str([0.5] * 4), (res.stdout, sys.version)


# ------------------------------------------- plain host code that calls torch

@pytest.mark.parametrize("wrap", ["from_numpy", "from_dlpack", "as_tensor", "asarray",
                                  "utils.dlpack.from_dlpack"])
def test_host_code_wrapping_its_input_with_torch_cannot_write_it(wrap):
    import torch.utils.dlpack  # noqa: F401  (torch.utils.dlpack.from_dlpack)

    def host(x):
        t = functools.reduce(getattr, wrap.split("."), torch)(x)
        t.mul_(3)  # into what torch wrapped: a private copy
        return t.numpy() + 1
    op = ab.bind(host, shape=ab.like(0), name=f"host_{wrap.replace('.', '_')}")
    for run in (op, jax.jit(op)):
        x = jnp.arange(4.0)
        got = run(x)
        np.testing.assert_array_equal(np.asarray(x), np.arange(4.0))
        assert_close(got, 3 * np.arange(4.0) + 1)


def test_torch_wrappers_are_torchs_own_outside_host_code():
    a = np.arange(3.0)
    t = torch.from_numpy(a)
    t.add_(1)
    np.testing.assert_array_equal(a, np.arange(3.0) + 1)  # shares memory, as torch does


# ------------------------------------------- how the carried draws could go wrong

def _drop_p(x, *, p):
    return torch.nn.functional.dropout(x, p) * x


def test_static_keywords_and_keyword_operands_with_draws():
    op = ab.from_torch(_drop_p, name="drop_p")
    x = _x()
    y, pb = jax.vjp(lambda x: op(x, p=0.3), x)
    g, m = np.asarray(pb(jnp.ones(64))[0]), np.asarray(y) != 0
    assert 0 < m.sum() < 64
    assert_close(g, np.where(m, 2 * np.asarray(x) / 0.7, 0.0))  # d(x²·m/0.7)/dx
    op2 = ab.from_torch(lambda x, *, w: torch.nn.functional.dropout(x, 0.5) * x * w)
    y, pb = jax.vjp(lambda x: op2(x, w=jnp.full(64, 1.0)), x)
    _check(y, pb(jnp.ones(64))[0], x)


def test_a_pickled_random_op_still_carries_its_draws():
    back = pickle.loads(pickle.dumps(ab.from_torch(_drop_p)))
    x = _x()
    y, pb = jax.vjp(lambda x: back(x, p=0.5), x)
    _check(y, pb(jnp.ones(64))[0], x)


def test_a_users_rule_on_a_random_op_gets_no_hidden_operand():
    op = ab.from_torch(lambda x: torch.nn.functional.dropout(x, 0.5) * x, name="ruled")
    seen = []

    @op.def_vjp
    def _(primals, ct, **kw):
        seen.append(sorted(kw))
        return (ct,)
    x = _x()
    g = jax.grad(lambda x: op(x).sum())(x)
    assert_close(g, np.ones(64))
    assert seen == [[]]


@pytest.mark.parametrize("mode", ["call", "translate"])
def test_instance_norm_running_statistics_positional(mode):
    """Probe: torch refuses a gradient in the running statistics of a norm; the vjp asked
    for every input. Like batch_norm's, instance_norm's statistics are buffers: the
    gradient in input, weight and bias is torch's own, the statistics' is what the
    function's other uses give (here the returned statistic, updated in place with no
    derivative recorded: its own cotangent), the same in both modes, and the caller's
    arrays keep their bits."""
    def g(x, rm, rv, w, b):
        out = torch.nn.functional.instance_norm(x, rm, rv, w, b, use_input_stats=True)
        return out, rm
    x, rm, w, b = (jnp.asarray(randn(s, seed=i)) for i, s in enumerate([(2, 3, 5), (3,),
                                                                         (3,), (3,)]))
    rv = jnp.asarray(0.5 + np.abs(randn((3,), seed=9)))
    ins = (x, rm, rv, w, b)
    kept = [np.array(a) for a in ins]
    op = ab.from_torch(g, mode=mode)
    loss = lambda *a: sum((o ** 2).sum() for o in op(*a))  # noqa: E731
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*ins)
    ts = [torch.from_numpy(np.array(a)).requires_grad_(i in (0, 3, 4))
          for i, a in enumerate(ins)]
    out, new_rm = g(*ts)
    ((out ** 2).sum() + (new_rm ** 2).sum()).backward()
    for i in (0, 3, 4):
        assert_close(got[i], ts[i].grad.numpy())
    assert_close(got[1], 2 * new_rm.detach().numpy())  # d Σ rm_new² through rm_new = rm
    np.testing.assert_array_equal(np.asarray(got[2]), 0.0)
    for a, k in zip(ins, kept):
        np.testing.assert_array_equal(np.asarray(a), k)


def test_a_derivative_retried_on_copies_draws_the_values_draws():
    """Probe: a function that draws and then writes into its input. torch.func refuses
    the write, and the derivative runs again on copies; that second run must draw what
    the value drew, not what follows the failed run's draws. f = dropout(x)·(2x) = 4x²·m
    (x written to 2x after the draw), so ∂f/∂x = 8x·m, zero exactly where f is."""
    def f(x):
        y = torch.nn.functional.dropout(x, 0.5)
        x.mul_(2)
        return y * x
    op = ab.from_torch(f, name="draw_then_write")
    x = _x()
    y, pb = jax.vjp(op, x)
    m = np.asarray(y) != 0
    assert 0 < m.sum() < 64
    assert_close(pb(jnp.ones(64))[0], np.where(m, 8 * np.asarray(x), 0.0))
    y, t = jax.jvp(op, (x,), (jnp.ones(64),))
    assert_close(t, np.where(np.asarray(y) != 0, 8 * np.asarray(x), 0.0))
    for run in (jax.jit(jax.value_and_grad(lambda x: op(x).sum())),
                jax.value_and_grad(lambda x: op(x).sum())):
        v, g = run(x)
        nz = np.asarray(g) != 0
        assert 0 < nz.sum() < 64
        assert_close(np.asarray(g)[nz], 8 * np.asarray(x)[nz])
        assert_close(float(v), float(np.sum(4 * np.asarray(x)[nz] ** 2)))
