"""``ab.from_torch``'s default, ``mode="auto"``: never another number than ``mode="call"``.

Each test here is a way a captured program could silently differ from running the
torch code at each call (a branch on a value, ``.item()``, writes into inputs,
globals, tensors closed over, side effects, Python's and NumPy's random numbers,
a torch.Generator, train/eval switched after a capture, the user's own rules,
options of a torch call), and checks the two modes give the same numbers and the
same effects. Then what a translated op must do as JAX code: draws from ``key=``
per row under vmap, threads, ``jax.export``; sharding is in
``many_devices/md_translate.py``.
"""
import pickle
import random
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import anybind as ab
from anybind.torch import _aten
from anybind.torch._bridges import FromTorch
from helpers import assert_close, host_call_count


def _both(fn, **kw):
    return ab.from_torch(fn, **kw), ab.from_torch(fn, mode="call", **kw)


def _translated(op, *args, **kw) -> bool:
    """Whether the op's program for these arguments is JAX code, with no torch call."""
    return host_call_count(jax.jit(lambda *a: op(*a, **kw)).lower(*args)) == 0


def _smooth(x, y):
    return torch.tanh(x) * y + x ** 2


def test_the_default_is_auto_and_translates_what_it_can():
    op = ab.from_torch(_smooth)
    x, y = jnp.linspace(-1.0, 1.0, 5), jnp.arange(5.0)
    assert _translated(op, x, y)
    xt, yt = torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))
    assert_close(op(x, y), _smooth(xt, yt).numpy())
    assert not isinstance(op, FromTorch) and isinstance(ab.from_torch(_smooth, mode="call"),
                                                        FromTorch)


# -------------------------------------------- programs a capture could bake in

def _branch_on_value(x):
    if x.sum() > 0:  # a Python branch on the data: torch.export cannot capture it
        return x * 2
    return x * 3


def _item(x):
    return x * x.max().item()


def _nonzero_count(x):
    return x * torch.nonzero(x > 0).shape[0]


def test_a_shape_that_depends_on_the_data_needs_shape_as_in_call_mode():
    for mode in ("auto", "call"):  # torch's fake tensors cannot say the shape
        with pytest.raises(TypeError, match="Give shape="):
            ab.from_torch(_nonzero_count, mode=mode)(jnp.ones(3))
    with pytest.raises(TypeError, match="depends on the values"):
        ab.from_torch(_nonzero_count, mode="translate")(jnp.ones(3))


@pytest.mark.parametrize("fn", [_branch_on_value, _item])
def test_value_dependent_programs_are_one_torch_call(fn):
    auto, call = _both(fn)
    pos, neg = jnp.array([1.0, 2.0, -0.5]), jnp.array([-1.0, -2.0, 0.5])
    for f in (lambda o: o, jax.jit):  # jit: the branch is taken at run time, per value
        assert_close(f(auto)(pos), f(call)(pos))
        assert_close(f(auto)(neg), f(call)(neg))
    assert_close(f(auto)(neg), np.asarray(fn(torch.from_numpy(np.array(neg)))))
    assert not _translated(auto, pos)


def _numpy_inside(x):
    return torch.from_numpy(np.sin(x.detach().numpy()))


def test_numpy_code_inside_is_one_torch_call():
    auto, call = _both(_numpy_inside)
    x = jnp.linspace(0.0, 1.0, 4)
    assert_close(jax.jit(auto)(x), np.sin(np.asarray(x)))
    assert_close(auto(x), call(x))


def _writes_input(x):
    x.mul_(2)
    return x + 1


def test_writes_into_an_input_act_on_a_copy():
    auto, call = _both(_writes_input)
    x = jnp.arange(3.0)
    assert _translated(auto, x)
    assert_close(auto(x), call(x))
    assert_close(auto(x), 2 * np.arange(3.0) + 1)
    assert_close(x, np.arange(3.0))  # the JAX array is unchanged


SCALE = 2.0


def _reads_global(x):
    return x * SCALE


def test_a_global_is_read_at_each_call():
    global SCALE
    auto, call = _both(_reads_global)
    x = jnp.ones(3)
    jitted = jax.jit(auto)
    try:
        assert_close(auto(x), 2 * np.ones(3))
        assert_close(jitted(x), 2 * np.ones(3))
        SCALE = 3.0
        assert_close(auto(x), call(x))
        assert_close(jitted(x), 3 * np.ones(3))  # as mode="call" reads it, at run time
    finally:
        SCALE = 2.0


def test_a_tensor_closed_over_is_read_at_each_call():
    w = torch.ones(3, dtype=torch.float64)
    auto = ab.from_torch(lambda x: x * w)
    x = jnp.ones(3)
    assert_close(auto(x), np.ones(3))
    w.add_(1)
    assert_close(auto(x), 2 * np.ones(3))
    assert_close(jax.jit(auto)(x), 2 * np.ones(3))


def test_a_module_closed_over_is_read_at_each_call():
    net = nn.Linear(3, 2).double()
    auto = ab.from_torch(lambda x: net(x))
    x = jnp.ones((1, 3))
    before = auto(x)
    with torch.no_grad():
        net.bias.add_(1.0)  # a training step elsewhere
    assert_close(auto(x), np.asarray(before) + 1.0)
    assert not _translated(auto, x)


def test_python_side_effects_happen_as_in_call_mode():
    """A counter counts each run of the code, print prints: as many times in both modes."""
    runs = {"auto": 0, "call": 0}

    def make(which):
        def f(x):
            runs[which] += 1
            print("ran")
            return x * 2
        return f
    auto, call = ab.from_torch(make("auto")), ab.from_torch(make("call"), mode="call")
    x = jnp.ones(2)
    for _ in range(3):
        assert_close(auto(x), call(x))
    assert_close(jax.jit(auto)(x), jax.jit(call)(x))
    assert runs["auto"] == runs["call"] >= 4


class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(3, 2), 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


def test_a_module_that_changes_its_attributes_is_one_torch_call():
    torch.manual_seed(0)
    m1, m2 = _Counting().double(), _Counting().double()
    m2.load_state_dict(m1.state_dict())
    auto, call = ab.from_torch(m1), ab.from_torch(m2, mode="call")
    p = {k: jnp.array(v.numpy()) for k, v in m1.state_dict().items()}
    x = jnp.ones((2, 3))
    for _ in range(2):
        assert_close(auto(p, x), call(p, x))
    assert m1.calls == m2.calls


def _python_random(x):
    return x * random.random()


def _numpy_random(x):
    return x * np.random.default_rng().random()


@pytest.mark.parametrize("fn", [_python_random, _numpy_random])
def test_python_and_numpy_random_numbers_are_drawn_at_each_call(fn):
    auto = ab.from_torch(fn)
    x = jnp.ones(3)
    assert not np.array_equal(auto(x), auto(x))
    assert not _translated(auto, x)


def test_a_held_generator_draws_as_in_call_mode():
    gen = torch.Generator().manual_seed(5)

    def noisy(x):
        return x + torch.rand(x.shape, generator=gen, dtype=x.dtype)
    auto = ab.from_torch(noisy)
    x = jnp.zeros(4)
    gen.manual_seed(5)
    got = auto(x)
    gen.manual_seed(5)
    assert_close(ab.from_torch(noisy, mode="call")(x), got, rtol=0, atol=0)


def _reseeds(x):
    torch.manual_seed(0)  # process-wide state: the same draws at each call
    return x + torch.randn_like(x)


def test_a_function_that_seeds_torch_draws_as_in_call_mode():
    auto, call = _both(_reseeds)
    x = jnp.zeros(5)
    torch.manual_seed(0)
    expected = torch.randn(5, dtype=torch.float64).numpy()
    for f in (lambda o: o, jax.jit):
        assert_close(f(auto)(x), f(call)(x), rtol=0, atol=0)
        assert_close(f(auto)(x), expected, rtol=0, atol=0)


class _Hidden(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.ones(3, dtype=torch.float64), persistent=False)

    def forward(self, x):
        return x + self.shift


def test_non_persistent_buffers_are_read_at_each_call():
    m = _Hidden()
    auto = ab.from_torch(m)
    x = jnp.zeros(3)
    assert_close(auto({}, x), np.ones(3))
    m.shift.fill_(4.0)
    assert_close(auto({}, x), 4 * np.ones(3))


def test_switching_train_and_eval_after_a_call_is_seen():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double().eval()
    auto = ab.from_torch(m, discard_state=True)
    call = ab.from_torch(m, discard_state=True, mode="call")
    p = {k: jnp.array(v.numpy()) for k, v in m.state_dict().items()}
    x = jnp.asarray(np.random.default_rng(0).standard_normal((6, 3)))
    assert_close(auto(p, x), call(p, x))
    m.train()  # batch statistics now: another program
    assert_close(auto(p, x), call(p, x))
    assert abs(float(jnp.mean(auto(p, x)))) < 1e-6


# ------------------------------------------------------------- module state

def _bn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double().train()
    return m, {k: jnp.array(v.numpy()) for k, v in m.state_dict().items()}


def test_return_state_and_discard_state_as_in_call_mode():
    m, p = _bn()
    x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 3)))
    auto, call = _both(m, return_state=True)
    (ya, sa), (yc, sc) = auto(p, x), call(p, x)
    assert_close(ya, yc)
    assert sorted(sa) == sorted(sc)
    for k in sc:
        assert_close(sa[k], sc[k])
    assert _translated(auto, p, x)
    auto, call = _both(m, discard_state=True)
    assert_close(auto(p, x), call(p, x))
    for mode in ("auto", "call", "translate"):  # neither: the updates would be dropped
        with pytest.raises(TypeError, match=r"updates the buffer.*return_state=True"):
            ab.from_torch(m, mode=mode)(p, x)
    with pytest.raises(TypeError, match="discard_state=True is for an nn.Module"):
        ab.from_torch(_smooth, discard_state=True)


# ----------------------------------------------------- options of a torch call

def test_options_of_a_torch_call_make_the_op_a_torch_call():
    x = jnp.linspace(0.0, 1.0, 4)
    for kw in ({"shape": ab.like(0)}, {"vmap": "sequential"}):
        op = ab.from_torch(torch.sin, **kw)
        assert isinstance(op, FromTorch)  # mode="call"'s op
        assert_close(jax.vmap(op)(x[:, None]), np.sin(np.asarray(x))[:, None])
        with pytest.raises(ValueError, match="describe a torch call"):
            ab.from_torch(torch.sin, mode="translate", **kw)
        with pytest.raises(ValueError, match="describe a torch call"):
            ab.from_torch(torch.sin, check=True, **kw)


def test_the_users_rules_run_with_torch_as_in_call_mode():
    """A rule of the user's replaces the derived one; the primal is the torch call, as in
    mode="call" (the user's rule describes that function, not a translation)."""
    def vjp(primals, ct):
        return (42.0 * ct,)

    def jvp(primals, tangents):
        return 7.0 * tangents[0]
    ops = []
    for mode in ("auto", "call"):
        op = ab.from_torch(torch.sin, mode=mode)
        op.def_vjp(vjp)
        op.def_jvp(jvp)
        ops.append(op)
    x = jnp.linspace(0.0, 1.0, 3)
    for op in ops:
        assert_close(jax.grad(lambda v: op(v).sum())(x), 42.0 * np.ones(3))
        assert_close(jax.jvp(op, (x,), (jnp.ones(3),))[1], 7.0 * np.ones(3))
        assert_close(jax.jit(op)(x), np.sin(np.asarray(x)))
    assert not _translated(ops[0], x)


def test_pickling_keeps_the_mode():
    x = jnp.linspace(0.0, 1.0, 3)
    auto = pickle.loads(pickle.dumps(ab.from_torch(torch.sin)))
    call = pickle.loads(pickle.dumps(ab.from_torch(torch.sin, mode="call")))
    assert _translated(auto, x) and not _translated(call, x)
    assert_close(auto(x), call(x))


# ------------------------------------------------------------- random numbers

def _drop(x):
    return F.dropout(x, 0.5, training=True) * 3.0


def _two_draws(x):
    return F.dropout(x, 0.5, training=True) + torch.randn_like(x)


@pytest.mark.parametrize("fn", [_drop, _two_draws])
def test_without_a_key_the_draws_are_call_modes(fn):
    """One random node runs as a torch call seeded as mode="call" seeds the whole
    function; several make the program one torch call: the same numbers either way."""
    auto, call = _both(fn)
    x = jnp.linspace(1.0, 2.0, 500)
    for f in (lambda o: o, jax.jit):
        torch.manual_seed(11)
        a = np.asarray(f(auto)(x))
        torch.manual_seed(11)
        assert_close(a, f(call)(x), rtol=0, atol=0)


def _masks(op, x, kw):
    """(value, gradient of Σ y) of one call per row, under jit with vmap and lax.map,
    and of one call under jit."""
    def one(v):
        (_, y), g = jax.value_and_grad(lambda u: (lambda y: (y.sum(), y))(op(u, **kw)),
                                       has_aux=True)(v)
        return y, g
    return {"vmap": jax.jit(jax.vmap(one))(x),
            "map": jax.jit(lambda xs: jax.lax.map(one, xs))(x),
            "one": jax.jit(one)(x[0])}


@pytest.mark.parametrize("keyed", [False, True])
def test_value_and_gradient_use_the_same_draws(keyed):
    """y = 6·m·x with m the dropout mask: the gradient of Σ y is 6·m, where the value is
    non-zero, under jit, vmap and lax.map, drawn by torch or from the key."""
    op = ab.from_torch(_drop)
    x = jnp.linspace(1.0, 2.0, 4 * 64).reshape(4, 64)
    kw = {"key": jax.random.key(3)} if keyed else {}
    assert _translated(op, x[0], **kw) == keyed
    for y, g in _masks(op, x, kw).values():
        y, g = np.asarray(y), np.asarray(g)
        assert_close(g, 6.0 * (y != 0), rtol=0, atol=0)
        assert 0.2 < (y != 0).mean() < 0.8
    if not keyed:  # rows draw apart, as mode="call"'s rows do
        y, _ = _masks(op, x, kw)["map"]
        assert not np.array_equal(np.asarray(y)[0] != 0, np.asarray(y)[1] != 0)


def test_vmap_over_keys_draws_per_row_from_each_key():
    op = ab.from_torch(_drop)
    x = jnp.ones((4, 300))
    keys = jax.random.split(jax.random.key(0), 4)
    rows = jax.jit(jax.vmap(lambda v, k: op(v, key=k)))(x, keys)
    assert _translated(jax.vmap(lambda v, k: op(v, key=k)), x, keys)
    for i in range(4):
        assert_close(rows[i], op(x[i], key=keys[i]), rtol=0, atol=0)
    masks = np.asarray(rows) != 0
    assert all(not np.array_equal(masks[0], masks[i]) for i in range(1, 4))
    same = jax.vmap(lambda v: op(v, key=keys[0]))(x)  # one key for every row: one mask
    assert all(np.array_equal(same[0], same[i]) for i in range(4))


# ------------------------------------------------- JAX code: threads, export

def test_two_threads_call_one_translated_op():
    """Both threads' first calls capture at once; each gets its own numbers."""
    op = ab.from_torch(_smooth)
    inputs = [(jnp.linspace(-1.0, 1.0, 7) * (i + 1), jnp.arange(7.0) + i) for i in range(2)]
    got: dict = {}
    errors: list = []
    start = threading.Barrier(2)

    def run(i):
        try:
            start.wait()
            for _ in range(3):
                got[i] = (np.asarray(op(*inputs[i])),
                          np.asarray(jax.jit(jax.grad(lambda a, b: op(a, b).sum()))(
                              *inputs[i])))
        except Exception as e:  # noqa: BLE001  (raised below, on the test's thread)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (a, b) in enumerate(inputs):
        at = torch.from_numpy(np.array(a)).requires_grad_()
        y = _smooth(at, torch.from_numpy(np.array(b)))
        y.sum().backward()
        assert_close(got[i][0], y.detach().numpy())
        assert_close(got[i][1], at.grad.numpy())
    assert len(op.fn.programs) == 1  # one signature, one capture


def test_jax_export_of_a_default_op():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2))
    op = ab.from_torch(m)
    p = {k: jnp.array(v.numpy()) for k, v in m.state_dict().items()}
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 3)), jnp.float32)
    exp = jax.export.export(jax.jit(jax.value_and_grad(lambda p, x: op(p, x).sum())))(p, x)
    back = jax.export.deserialize(exp.serialize())
    (y, g), (y0, g0) = back.call(p, x), jax.value_and_grad(lambda p, x: op(p, x).sum())(p, x)
    assert_close(y, y0, rtol=1e-6, atol=1e-6)
    for k in g0:
        assert_close(g[k], g0[k], rtol=1e-6, atol=1e-6)
    assert_close(y, m(torch.from_numpy(np.array(x))).sum().item(), rtol=1e-5, atol=1e-5)


def test_export_of_a_program_left_to_torch_is_a_clear_error():
    op = ab.from_torch(_branch_on_value)
    with pytest.raises(Exception, match="(?i)serializ|export|callback"):
        jax.export.export(jax.jit(op))(jnp.ones(3))


def test_fallback_nodes_are_named_by_the_program():
    op = ab.from_torch(_drop)
    prog = op.fn.program(jnp.ones(8))
    assert [_aten.name_of(n.target) for n in prog.fallback] == ["aten::native_dropout.default"]
    assert ab.from_torch(_two_draws).fn.program(jnp.ones(8)).whole_call


def test_examples_and_name_as_in_call_mode():
    x, y = np.linspace(-1.0, 1.0, 4), np.linspace(0.5, 1.5, 4)
    op = ab.from_torch(_smooth, examples=lambda: ((x, y), {}), name="smooth_named")
    assert op.name == "smooth_named" and _translated(op, x, y)
    assert ab.check(op).ok  # examples= give ab.check its arguments
    assert ab.check(op, x, y, torch=True).ok  # and the translation agrees with torch
