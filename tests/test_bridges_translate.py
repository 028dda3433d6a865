"""``ab.from_torch(..., mode="translate" | "auto")``: torch programs as JAX code, checked
against torch itself on the same inputs (values and gradients).

The models here (``MODELS``) are also what ``docs/gen_translate_coverage.py`` measures
the coverage on.
"""
import functools
import pickle
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import anybind as ab
from anybind.torch import _aten
from helpers import assert_close, central_difference

# ----------------------------------------------------------------- the models

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.l2(self.ln(F.gelu(self.l1(x))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.c2, self.fc = nn.Conv2d(8, 16, 3, stride=2), nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = self.drop(F.relu(self.c2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Block(nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with LayerNorm."""

    def __init__(self, d=16, h=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(6, 12, batch_first=True), nn.Linear(12, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class ResBlock(nn.Module):
    """torchvision's BasicBlock: conv-bn-relu-conv-bn, plus the input, relu."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + x)


# name -> (model, the shape of one input)
MODELS = {"MLP": (MLP, (5, 8)), "CNN": (CNN, (2, 3, 12, 12)), "Block": (Block, (2, 5, 16)),
          "LSTM": (LSTM, (3, 7, 6)), "ResBlock": (ResBlock, (2, 8, 6, 6))}


def _model(name, dtype=torch.float64, train=False):
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    m = cls().to(dtype).train(train)
    x = torch.randn(shape, dtype=dtype)
    return m, x


def _params(m):
    return {k: jnp.array(v.detach().numpy()) for k, v in m.state_dict().items()}


def _torch_grads(m, x):
    m.zero_grad()
    m(x).sum().backward()
    return {k: v.grad.numpy() for k, v in m.named_parameters()}


# -------------------------------------------------------------- whole models

@pytest.mark.parametrize("name", list(MODELS))
def test_models_translate_completely_and_agree_with_torch(name):
    m, x = _model(name)
    op = ab.from_torch(m, mode="translate")  # raises if any node has no translation
    params = _params(m)
    kept = {k: v.clone() for k, v in m.state_dict().items()}
    got = jax.jit(op)(params, x.numpy())
    assert_close(got, m(x).detach().numpy(), rtol=1e-10, atol=1e-12)
    grads = jax.jit(jax.grad(lambda p: op(p, x.numpy()).sum(), allow_int=True))(params)
    for k, g in _torch_grads(m, x).items():
        assert_close(grads[k], g, rtol=1e-9, atol=1e-11)
    for k, v in m.state_dict().items():  # capturing changed nothing
        assert torch.equal(v, kept[k]), k
    prog = op.fn.program(params, x.numpy())
    assert not prog.fallback and not prog.whole_call


@pytest.mark.parametrize("name", ["ResBlock", "CNN"])
def test_train_mode_state_comes_back_as_torchs(name):
    """BatchNorm in train mode: the running statistics and num_batches_tracked after one
    call are torch's; the output uses the batch's statistics. (The CNN's dropout is
    made the identity here with p = 0, so torch's and JAX's draws do not matter.)"""
    m, x = _model(name, train=True)
    if name == "CNN":
        m.drop.p = 0.0
    params = _params(m)
    op = ab.from_torch(m, mode="translate", return_state=True)
    out, state = jax.jit(op)(params, x.numpy(), key=jax.random.key(0))
    ref = m(x)  # updates m's buffers, as torch does
    assert_close(out, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert sorted(state) == sorted(n for n, _ in m.named_buffers())
    for n, b in m.named_buffers():
        assert_close(state[n], b.numpy(), rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------- recurrent layers

RECURRENT = {
    "LSTM 2 layers bidirectional batch_first": (
        lambda: nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True), (3, 7, 6)),
    "LSTM proj_size no bias": (lambda: nn.LSTM(6, 5, proj_size=3, bias=False), (7, 3, 6)),
    "GRU 2 layers": (lambda: nn.GRU(6, 5, num_layers=2), (7, 3, 6)),
    "GRU bidirectional unbatched": (lambda: nn.GRU(6, 5, bidirectional=True), (7, 6)),
    "RNN tanh batch_first": (lambda: nn.RNN(6, 5, batch_first=True), (3, 7, 6)),
    "RNN relu 3 layers": (lambda: nn.RNN(6, 5, num_layers=3, nonlinearity="relu"), (7, 3, 6)),
}


class _WithState(nn.Module):
    """A recurrent layer called with its initial state, returning every output."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h):
        out, h = self.rnn(x, h)
        return (out, *h) if isinstance(h, tuple) else (out, h)


def _initial_state(rnn, x):
    n = rnn.num_layers * (2 if rnn.bidirectional else 1)
    batch = (x.shape[0 if rnn.batch_first else 1],) if x.ndim == 3 else ()
    h = torch.randn(n, *batch, rnn.proj_size or rnn.hidden_size, dtype=x.dtype)
    return (h, torch.randn(n, *batch, rnn.hidden_size, dtype=x.dtype)) \
        if isinstance(rnn, nn.LSTM) else h


@pytest.mark.parametrize("name", list(RECURRENT))
def test_recurrent_layers_translate_whole_as_one_scan_each(name):
    """nn.LSTM, nn.GRU and nn.RNN stay one node each (torch's decomposition would unroll
    the loop over the sequence), translated as one lax.scan per layer and direction:
    the outputs and final states, and the gradients in the parameters, the input and
    the initial state, are torch's."""
    make, shape = RECURRENT[name]
    torch.manual_seed(0)
    m = _WithState(make().double().eval())
    x = torch.randn(shape, dtype=torch.float64)
    h = _initial_state(m.rnn, x)
    op = ab.from_torch(m, mode="translate")
    params = _params(m)
    xj, hj = x.numpy().copy(), jax.tree.map(lambda t: t.numpy().copy(), h)
    prog = op.fn.program(params, xj, hj)
    kept = [str(n.target) for n in prog.graph.nodes if str(n.target).endswith(".input")]
    assert len(kept) == 1 and not prog.fallback, kept
    scans = jax.jit(op).lower(params, xj, hj).as_text().count("stablehlo.while")
    assert scans == m.rnn.num_layers * (2 if m.rnn.bidirectional else 1)
    got = jax.jit(op)(params, xj, hj)
    for t in (x, *jax.tree.leaves(h)):
        t.requires_grad_()
    want = m(x, h)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w.detach().numpy(), rtol=1e-12, atol=1e-13)
    cts = [torch.randn(w.shape, dtype=torch.float64) for w in want]
    m.zero_grad()
    sum((w * c).sum() for w, c in zip(want, cts)).backward()
    loss = lambda p, x, h: sum(jnp.vdot(o, c.numpy())  # noqa: E731
                               for o, c in zip(op(p, x, h), cts))
    gp, gx, gh = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, xj, hj)
    for k, v in m.named_parameters():
        assert_close(gp[k], v.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert_close(gx, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    for g, t in zip(jax.tree.leaves(gh), jax.tree.leaves(h), strict=True):
        assert_close(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_recurrent_dropout_between_layers_is_drawn_from_the_key():
    """Train mode, dropout between layers: torch's kernels apply it (its decomposition
    does not); the translation draws it from the key. With p = 1 every value between
    the layers is dropped, so torch's output is known exactly; with p = 1/2 the same
    key gives the same output, another key another, and neither is eval mode's.
    Without a key, "auto" runs the layer as a torch call, which draws as torch does."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, 6, dtype=torch.float64)
    for p in (1.0, 0.5):
        m = nn.LSTM(6, 5, num_layers=2, dropout=p, batch_first=True).double().train()
        op = ab.from_torch(m, mode="translate", discard_state=True)
        params = _params(m)
        with pytest.raises(TypeError, match=r"lstm.*\n.*key="):
            op(params, x.numpy())
        auto = ab.from_torch(m, discard_state=True).fn.program(params, x.numpy())
        assert [str(n.target) for n in auto.fallback] == ["aten.lstm.input"]  # torch draws
        a = jax.jit(op)(params, x.numpy(), key=jax.random.key(1))
        if p == 1.0:
            for g, w in zip(jax.tree.leaves(a), jax.tree.leaves(m(x)), strict=True):
                assert_close(g, w.detach().numpy(), rtol=1e-12, atol=1e-13)
            continue
        b = jax.jit(op)(params, x.numpy(), key=jax.random.key(1))
        c = jax.jit(op)(params, x.numpy(), key=jax.random.key(2))
        evaluated = m.eval()(x)[0].detach().numpy()
        assert_close(a[0], b[0], rtol=0, atol=0)
        assert not np.allclose(a[0], c[0]) and not np.allclose(a[0], evaluated)


def test_eval_and_train_capture_separately():
    m, x = _model("ResBlock")
    op = ab.from_torch(m, mode="translate")
    params = _params(m)
    assert_close(op(params, x.numpy()), m(x).detach().numpy())


# ------------------------------------------------------------------ random draws

def _dropout(x):
    return F.dropout(x, 0.5, training=True) * 3.0


def test_random_ops_need_a_key_in_translate_mode():
    op = ab.from_torch(_dropout, mode="translate")
    with pytest.raises(TypeError, match=r"native_dropout.*\n.*key="):
        op(jnp.ones(4))


def test_dropout_draws_from_the_key():
    """Node i draws from fold_in(key, i): the same key gives the same mask, another key
    another; kept values are scaled by 1/(1 - p); the gradient uses the value's mask."""
    op = ab.from_torch(_dropout, mode="translate")
    x = jnp.linspace(1.0, 2.0, 4000)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    a, b, c = op(x, key=k1), op(x, key=k1), op(x, key=k2)
    assert_close(a, b, rtol=0, atol=0)
    assert not np.array_equal(np.asarray(a) == 0, np.asarray(c) == 0)
    kept = np.asarray(a) != 0
    assert 0.45 < kept.mean() < 0.55
    assert_close(np.asarray(a)[kept], 6.0 * np.asarray(x)[kept])
    y, pull = jax.vjp(lambda v: op(v, key=k1), x)
    (g,) = pull(jnp.ones_like(y))
    assert_close(np.asarray(g) != 0, np.asarray(y) != 0, rtol=0, atol=0)
    assert_close(np.asarray(g)[kept], 6.0)


def test_auto_runs_random_ops_without_a_key_by_torch():
    op = ab.from_torch(_dropout, mode="auto")
    x = jnp.linspace(1.0, 2.0, 2000)
    prog = op.fn.program(x)
    assert [_aten.name_of(n.target) for n in prog.fallback] == ["aten::native_dropout.default"]
    torch.manual_seed(3)  # torch's generator seeds the call's draws (as in call mode)
    got = np.asarray(jax.jit(op)(x))
    torch.manual_seed(3)
    assert_close(np.asarray(jax.jit(op)(x)), got)
    kept = got != 0  # torch's dropout: each entry dropped or scaled by 1 / (1 - p)
    assert 0.3 < kept.mean() < 0.7
    assert_close(got[kept], 6.0 * np.asarray(x)[kept])


def _samplers(x):
    """torch's samplers, as torch.distributions and in-place fills call them: each row of
    the result is one sampler's draws, each with known moments (``_MOMENTS``)."""
    dist = torch.distributions
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=x.dtype)
    n = x.shape[0]
    return torch.stack([
        torch.empty_like(x).uniform_(-1.0, 3.0), torch.empty_like(x).normal_(2.0, 3.0),
        torch.empty_like(x).exponential_(2.0), torch.empty_like(x).log_normal_(0.1, 0.5),
        torch.empty_like(x).geometric_(0.3), torch.normal(x + 1.0, x + 2.0),
        torch.normal(1.0, 2.0, (n,), dtype=x.dtype),
        dist.Gamma(x + 2.5, x + 2.0, validate_args=False).rsample(),
        dist.Poisson(x + 3.5, validate_args=False).sample(),
        dist.Binomial(10, x + 0.3, validate_args=False).sample(),
        dist.Categorical(probs=p, validate_args=False).sample((n,)).to(x.dtype),
        torch.randint_like(x, 3, 7),
        dist.Dirichlet(torch.tensor([1.0, 2.0, 3.0], dtype=x.dtype),
                       validate_args=False).rsample((n,))[:, 0],
        torch.multinomial(p.expand(n, 4), 2)[:, 1].to(x.dtype),  # the second pick
    ])


# each row's mean and variance; the second pick of a weighted draw without replacement
# is category i with probability Σ_{j≠i} p_j p_i / (1 - p_j)
_P, _SECOND = (0.1, 0.2, 0.3, 0.4), [
    sum(pj * pi / (1 - pj) for j, pj in enumerate((0.1, 0.2, 0.3, 0.4)) if j != i)
    for i, pi in enumerate((0.1, 0.2, 0.3, 0.4))]
_MOMENTS = [(1.0, 4 ** 2 / 12), (2.0, 9.0), (0.5, 0.25),
            (np.exp(0.225), (np.exp(0.25) - 1) * np.exp(0.45)), (1 / 0.3, 0.7 / 0.09),
            (1.0, 4.0), (1.0, 4.0), (1.25, 2.5 / 4), (3.5, 3.5), (3.0, 2.1),
            (2.0, 1.0), (4.5, 15 / 12), (1 / 6, 5 / 252),
            (np.dot(range(4), _SECOND), np.dot(np.arange(4) ** 2, _SECOND)
             - np.dot(range(4), _SECOND) ** 2)]


def test_torch_samplers_draw_from_the_key():
    """Each sampler translates to JAX's draw of the same distribution: the moments of 20,000
    draws within six standard errors, the same draws for the same key; torch.normal has
    no derivative (as torch's), a Gamma draw the reparameterized one, torch's."""
    x = jnp.zeros(20_000)
    op = ab.from_torch(_samplers, mode="translate")
    draws = np.asarray(op(x, key=jax.random.key(0)))
    assert_close(np.asarray(op(x, key=jax.random.key(0))), draws, rtol=0, atol=0)
    for row, (mean, var) in zip(draws, _MOMENTS, strict=True):
        assert abs(row.mean() - mean) < 6 * np.sqrt(var / row.size), (row.mean(), mean)
        assert abs(row.var() / var - 1) < 0.1, (row.var(), var)
    assert len(np.unique(draws[5])) == x.size  # not one draw broadcast
    assert not np.asarray(jax.grad(lambda v: op(v, key=jax.random.key(1))[5].sum())(x)).any()
    grad = jax.grad(lambda v: op(v, key=jax.random.key(1))[7].mean())(x) * x.size
    assert abs(float(grad.mean()) - (1 / 2.0 - 2.5 / 4.0)) < 0.02  # ∂(α/β) through α, β
    # a Gamma draw's derivative is torch's for that draw, up to both approximations
    gamma, alpha, key = ab.from_torch(torch._standard_gamma, mode="translate"), \
        np.linspace(0.2, 30.0, 200), jax.random.key(2)
    drawn = np.array(gamma(alpha, key=key))
    assert_close(jax.grad(lambda a: gamma(a, key=key).sum())(alpha),
                 torch._standard_gamma_grad(torch.from_numpy(alpha), torch.from_numpy(drawn)),
                 rtol=2e-3, atol=0)


def test_rrelu_in_train_mode_draws_its_slopes_from_the_key():
    """Each element below 0 is scaled by its own slope from U(lower, upper), which its
    derivative is; the others pass."""
    op = ab.from_torch(lambda v: F.rrelu(v, 0.1, 0.3, training=True), mode="translate")
    x = np.linspace(-1.0, 1.0, 20_000)
    y = np.asarray(op(x, key=jax.random.key(0)))
    grad = np.asarray(jax.grad(lambda v: op(v, key=jax.random.key(0)).sum())(x))
    neg = x < 0
    slopes = y[neg] / x[neg]
    assert 0.1 <= slopes.min() and slopes.max() <= 0.3 and abs(slopes.mean() - 0.2) < 0.005
    assert_close(grad[neg], slopes)
    assert_close(y[~neg], x[~neg])
    assert_close(grad[~neg], 1.0)


# ------------------------------------------------- translate's errors, auto's calls

def _partly(x):  # two ops with no translation, differentiable both ways by torch
    small = F.interpolate(x.reshape(1, 1, 2, 3), size=(3, 4), mode="bilinear", antialias=True)
    return small.sum() * torch.mode(x).values + x ** 2


def test_translate_names_every_untranslated_op():
    def partly(x):  # torch decomposes zeta to a prim, which the translation keeps out
        return _partly(x) + torch.special.zeta(2.0, x + 1)
    op = ab.from_torch(partly, mode="translate")
    with pytest.raises(TypeError) as e:
        op(jnp.linspace(0.0, 1.0, 6))
    msg = str(e.value)
    assert "'partly'" in msg and "aten::_upsample_bilinear2d_aa" in msg and "aten::mode" in msg
    assert "aten::special_zeta" in msg and "prims::" not in msg


def test_auto_calls_torch_for_the_rest_inside_one_program():
    op = ab.from_torch(_partly, mode="auto")
    x = np.linspace(0.1, 1.0, 6)
    xt = torch.from_numpy(x).requires_grad_()
    expected = _partly(xt)
    assert_close(jax.jit(op)(x), expected.detach().numpy())
    expected.sum().backward()
    assert_close(jax.jit(jax.grad(lambda v: op(v).sum()))(x), xt.grad.numpy())
    prog = op.fn.program(x)
    names = sorted(_aten.name_of(n.target) for n in prog.fallback)
    assert names == ["aten::_upsample_bilinear2d_aa.default", "aten::mode.default"]
    assert not prog.whole_call
    dx = np.cos(np.arange(6.0))
    _, t = jax.jvp(op, (x,), (dx,))
    assert_close(t, central_difference(op, x, dx), rtol=1e-6, atol=1e-6)


def test_a_custom_op_registered_after_a_capture_decomposes_as_torchs_default_table():
    """The split decomposition table is made once per set of registered ops: an op
    registered after a capture is decomposed as ``run_decompositions()`` does it."""
    assert_close(ab.from_torch(torch.sin, mode="translate")(jnp.ones(3)), np.sin(np.ones(3)))
    lib = torch.library.Library("anybind_test_later", "DEF")
    lib.define("affine(Tensor x) -> Tensor")
    lib.impl("affine", lambda x: x * 2 + 1, "CompositeImplicitAutograd")
    op = ab.from_torch(lambda x: torch.ops.anybind_test_later.affine(x), mode="translate")
    x = np.linspace(0.0, 1.0, 5)
    assert_close(op(x), 2 * x + 1)
    names = {_aten.name_of(n.target) for n in op.fn.program(x).graph.nodes
             if n.op == "call_function"}
    assert names == {"aten::mul.Tensor", "aten::add.Tensor"}


def _data_dependent(x):
    if x.sum().item() > 0:  # torch.export cannot capture a branch on a value
        return x * 2
    return -x


def test_auto_runs_an_uncapturable_program_as_one_torch_call():
    op = ab.from_torch(_data_dependent, mode="auto")
    assert_close(op(jnp.ones(3)), 2 * np.ones(3))
    assert_close(op(-jnp.ones(3)), np.ones(3))
    assert op.fn.program(jnp.ones(3)).whole_call
    with pytest.raises(TypeError, match="torch.export"):
        ab.from_torch(_data_dependent, mode="translate")(jnp.ones(3))


def test_bad_mode_and_params_are_named():
    with pytest.raises(ValueError, match="mode must be one of"):
        ab.from_torch(torch.sin, mode="fast")
    m, x = _model("MLP")
    params = _params(m)
    op = ab.from_torch(m, mode="translate")
    with pytest.raises(KeyError, match=r"missing: \['l1.bias'\], unknown: \['l9.bias'\]"):
        op({**{k: v for k, v in params.items() if k != "l1.bias"}, "l9.bias": params["l1.bias"]},
           x.numpy())


# --------------------------------------------------------------- transformations

def _smooth(x, w):
    return torch.tanh(x @ w).sum(-1) + torch.log1p(x ** 2).mean(-1)


def test_every_transformation_is_jaxs():
    op = ab.from_torch(_smooth, mode="translate")
    r = np.random.default_rng(0)
    x, w = r.standard_normal((3, 4)), r.standard_normal((4, 5))
    f = lambda v: op(v, w).sum()  # noqa: E731
    xt = torch.from_numpy(x)
    th = torch.func.hessian(lambda v: _smooth(v, torch.from_numpy(w)).sum())(xt)
    assert_close(jax.hessian(f)(x), th.numpy())
    assert_close(jax.jacfwd(jax.jacrev(f))(x), th.numpy())
    xs = r.standard_normal((7, 3, 4))
    assert_close(jax.vmap(lambda v: op(v, w))(xs), np.stack([op(v, w) for v in xs]))
    dx = r.standard_normal((3, 4))
    _, t = jax.jvp(lambda v: op(v, w), (x,), (dx,))
    assert_close(t, central_difference(lambda v: op(v, w), x, dx), rtol=1e-6, atol=1e-6)
    # no host call: the program exports, and runs where torch is not
    exp = jax.export.export(jax.jit(op))(x, w)
    back = jax.export.deserialize(exp.serialize())
    assert_close(back.call(x, w), _smooth(xt, torch.from_numpy(w)).numpy())
    assert "callback" not in exp.mlir_module()


def test_op_torch_is_the_torch_code_and_ab_check_compares_them():
    op = ab.from_torch(_smooth, mode="translate")
    assert op.torch is _smooth
    r = np.random.default_rng(1)
    report = ab.check(op, r.standard_normal((3, 4)), r.standard_normal((4, 5)), torch=True)
    assert report.ok


def test_pickles_as_from_torch_with_its_mode():
    op = ab.from_torch(_smooth, mode="translate")
    back = pickle.loads(pickle.dumps(op))
    x, w = np.ones((2, 4)), np.ones((4, 3))
    assert back.fn.mode == "translate"
    assert_close(back(x, w), op(x, w))


# ---------------------------------------------------------------- check=True

def test_check_on_first_call_catches_a_wrong_translation(monkeypatch):
    m, x = _model("MLP", dtype=torch.float32)
    params = _params(m)
    op = ab.from_torch(m, mode="translate", check=True)
    jax.jit(op)(params, x.numpy())  # compared with torch at its capture: agrees
    monkeypatch.setitem(_aten.RULES, "aten::gelu.default",
                        lambda n, v, approximate="none": jax.nn.gelu(v, approximate=True) * 1.01)
    bad = ab.from_torch(m, mode="translate", check=True)
    with pytest.raises(ValueError, match="'MLP': check=True: the translated program's outputs"):
        jax.jit(bad)(params, x.numpy())


# ------------------------------------------------------------- torch's semantics

def _semantics(i, f, n):
    return (i + f,                          # int32 + float32 -> float32
            i / 2,                          # true division of ints -> float32
            torch.div(n, 3, rounding_mode="floor"), torch.div(n, 3, rounding_mode="trunc"),
            n % 3, i.sum(), (f > 0).sum(),  # integer sums are int64
            f.mean(0), torch.remainder(f, 0.7), f.to(torch.bfloat16) * 2)


def test_dtype_promotion_division_and_reduction_dtypes():
    i = np.arange(-4, 4, dtype=np.int32).reshape(2, 4)
    f = np.linspace(-1.5, 2.0, 8, dtype=np.float32).reshape(2, 4)
    n = np.arange(-7, 9, 2, dtype=np.int64).reshape(2, 4)
    got = ab.from_torch(_semantics, mode="translate")(i, f, n)
    expected = _semantics(*map(torch.from_numpy, (i, f, n)))
    for g, e in zip(got, expected, strict=True):
        assert str(g.dtype) == str(e.dtype).removeprefix("torch."), (g.dtype, e.dtype)
        assert_close(np.asarray(g, np.float64), e.double().numpy(), rtol=1e-6, atol=1e-6)


def test_inplace_code_is_out_of_place():
    def f(x):
        y = x.clone()
        y[1:] += 1
        x.mul_(2)          # writes into an input: acts on a copy
        return x + y
    v = jnp.arange(3.0)
    got = ab.from_torch(f, mode="translate")(v)
    assert_close(got, f(torch.arange(3.0, dtype=torch.float64)).numpy())
    assert_close(v, np.arange(3.0))


def test_median_picks_and_shares_as_torch_does():
    """Along a dim: the lower middle value and its index, NaN where there is one
    (nanmedian: left out). Over all elements (torch's ``evenly_distribute_backward``):
    the derivative shared among the elements equal to it (three 2s here)."""
    x = torch.tensor([[1.0, np.nan, 0, 2], [3, 1, 0.5, 2], [3, 1, 5, 2]], dtype=torch.float64)
    fns = [lambda v: torch.median(v, 0), lambda v: torch.median(v, 1, keepdim=True),
           lambda v: torch.nanmedian(v, 1), lambda v: torch.nanmedian(v, 0),
           lambda v: torch.median(v), lambda v: torch.nanmedian(v),
           lambda v: torch.median(v[1:])]
    for fn in fns:
        op = ab.from_torch(fn, mode="translate")
        want, got = fn(x), op(x.numpy())
        if isinstance(want, tuple):
            np.testing.assert_array_equal(got[1], want.indices.numpy())
            want, value = want.values, lambda v: op(v)[0]
        else:
            value = op
        np.testing.assert_array_equal(np.asarray(value(x.numpy())), want.numpy())
        xt = x.clone().requires_grad_()
        out = fn(xt)
        (out if isinstance(out, torch.Tensor) else out.values).sum().backward()
        grad = jax.grad(lambda v: value(v).sum())(x.numpy())
        np.testing.assert_array_equal(np.asarray(grad), xt.grad.numpy())


def test_as_strided_reads_the_layout_of_a_contiguous_input_only():
    """``as_strided`` indexes memory: it translates where its input is laid out as JAX's
    row-major arrays are (a program's input); elsewhere the program is one torch call."""
    a = torch.randn(3, 4, dtype=torch.float64)
    f = lambda v: torch.as_strided(v, (3, 2), (1, 3), 1) * 2  # noqa: E731
    assert_close(ab.from_torch(f, mode="translate")(a.numpy()), f(a).numpy())
    assert_close(jax.grad(lambda v: ab.from_torch(f, mode="translate")(v)[1, 1])(a.numpy()),
                 np.eye(12)[1 + 1 + 3].reshape(3, 4) * 2)
    # a transposed view; a view that reaches past its own end into its base's memory
    for g in (lambda v: torch.as_strided(v.t(), (3, 2), (1, 3), 1) * 2,
              lambda v: torch.as_strided(v[:1], (3, 3), (3, 1)) * 2):
        with pytest.raises(TypeError, match="as_strided"):
            ab.from_torch(g, mode="translate")(a.numpy())
        auto = ab.from_torch(g)
        assert_close(auto(a.numpy()), g(a).numpy())
        assert auto.fn.program(a.numpy()).whole_call  # a torch call would see a copy


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_distribution_checks_are_torchs_in_auto_and_left_out_in_translate():
    """torch.distributions check their arguments as the program runs (``_assert_async``):
    ``"auto"`` runs such a program as one torch call, its error included; without the
    checks (``validate_args=False``) it translates, as ``"translate"`` always does."""
    def logp(mu, s, y, check=True):
        return torch.distributions.Normal(mu, s, validate_args=check).log_prob(y)
    mu, s, y = np.linspace(-1.0, 1.0, 4), np.full(4, 0.5), np.linspace(0.0, 1.0, 4)
    ts = [torch.from_numpy(v).requires_grad_() for v in (mu, s, y)]
    want = logp(*ts)
    want.sum().backward()
    unchecked = ab.from_torch(functools.partial(logp, check=False))
    checked = ab.from_torch(logp, mode="translate")
    try:
        torch.export.export(_Fn(logp), tuple(t.detach() for t in ts))
    except Exception:  # noqa: BLE001  (torch 2.13 cannot capture the checks)
        with pytest.raises(TypeError, match="torch.export"):
            checked(mu, s, y)
        checked = None
    for op in (checked, unchecked) if checked else (unchecked,):
        assert_close(op(mu, s, y), want.detach().numpy())
        for g, t in zip(jax.grad(lambda *v: op(*v).sum(), argnums=(0, 1, 2))(mu, s, y), ts,
                        strict=True):
            assert_close(g, t.grad.numpy())
        assert not op.fn.program(mu, s, y).whole_call
    if checked:
        assert np.isnan(np.asarray(checked(mu, -s, y))).all()
    auto = ab.from_torch(logp)
    assert auto.fn.program(mu, s, y).whole_call
    assert_close(auto(mu, s, y), want.detach().numpy())
    with pytest.raises(Exception, match="constraint"):
        jax.block_until_ready(auto(mu, -s, y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_counting_and_bit_level_ops_agree_with_torch_exactly(dtype):
    """Ops whose results are indices, counts or bits (no derivative): equal values, with
    ties (a value found in the sorted sequence) and values outside the bins."""
    torch.manual_seed(0)
    a = torch.randn(3, 6, dtype=dtype)
    s = torch.sort(torch.randn(3, 5, dtype=dtype), 1)[0]
    s[1, 2] = a[1, 0]  # a tie
    fns = [lambda a, s: torch.searchsorted(s, a[:, :4].contiguous()),
           lambda a, s: torch.searchsorted(s, a[:, :4].contiguous(), right=True),
           lambda a, s: torch.searchsorted(s[1], a, side="right", out_int32=True),
           lambda a, s: torch.bucketize(a, s[1]), lambda a, s: torch.bucketize(a, s[1], right=True),
           lambda a, s: torch.histc(a, 7), lambda a, s: torch.histc(a, 4, -0.5, 0.5),
           lambda a, s: torch.frexp(a * 1e3), lambda a, s: torch.signbit(a),
           lambda a, s: torch.nextafter(a, s[:, :1]),
           lambda a, s: torch.nonzero_static(a > 0, size=8),
           lambda a, s: torch.nonzero_static(a > 5, size=2, fill_value=7),
           lambda a, s: (a.abs() * 40).to(torch.uint8) >> 2 | (a * 40).to(torch.int32) << 3,
           lambda a, s: (a * 40).to(torch.int64) >> torch.tensor([0, 1, 7, 63, 64, 70]),
           lambda a, s: F.max_pool1d(a[None], 3, 2, padding=1, return_indices=True)[1],
           lambda a, s: F.max_pool2d(a.round()[None], 2, 1, dilation=(1, 2), ceil_mode=True,
                                     return_indices=True)[1]]
    for fn in fns:
        got = ab.from_torch(fn, mode="translate")(a.numpy(), s.numpy())
        want = fn(a, s)
        for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want)),
                        strict=True):
            assert str(g.dtype) == str(w.dtype).removeprefix("torch."), fn
            np.testing.assert_array_equal(np.asarray(g), w.numpy())


def test_erfcx_agrees_with_torch_on_large_arguments():
    """jax 0.11's erfcx gives 0 on [26.54, 26.64] (float64) and [9.19, 9.42] (float32),
    jax-ml/jax#38607: it translates from jax 0.12 on, and torch runs it before."""
    for dtype, x in ((np.float64, np.linspace(26.5, 26.7, 9)),
                     (np.float32, np.linspace(9.1, 9.5, 9))):
        x = x.astype(dtype)
        assert_close(ab.from_torch(torch.special.erfcx)(x),
                     torch.special.erfcx(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=0)


def _stop_detach(x):
    return x * (x * x).sum().detach()


def _stop_no_grad(x):
    with torch.no_grad():
        s = (x * x).sum()
    return x * s


def _stop_grad_mode(x):
    torch.set_grad_enabled(False)
    s = (x * x).sum()
    torch.set_grad_enabled(True)
    return x * s


def _stop_target_net(x):  # a target network's output under no_grad, a straight-through
    with torch.no_grad():  # estimator, and a no_grad block's output used twice
        target = torch.tanh(x.flip(0)) * 2
        codes = torch.round(x * 3) / 3
    q = x + (codes - x).detach()
    return (x - target) ** 2 + q * target


@pytest.mark.parametrize("fn", [_stop_detach, _stop_no_grad, _stop_grad_mode, _stop_target_net],
                         ids=lambda f: f.__name__)
def test_what_torch_does_not_differentiate_is_not_differentiated(fn):
    """``detach()`` and ``torch.no_grad()`` blocks stop derivatives in a translation as in
    torch's reverse mode: decomposition makes a detach an alias and inlines a no_grad
    block, so their nodes are found by the provenance torch's export records. torch's
    forward mode goes through a no_grad block: a translation's cannot, so ``"auto"``
    runs a program with one as one torch call, and ``"translate"`` stops both modes."""
    x, ct = np.array([0.3, -1.2, 2.0, 0.7]), np.array([1.0, -2.0, 0.5, 3.0])
    t = torch.tensor(x, requires_grad=True)
    (fn(t) * torch.from_numpy(ct)).sum().backward()
    forward = torch.func.jvp(fn, (torch.from_numpy(x),), (torch.from_numpy(ct),))[1]
    translated, auto = ab.from_torch(fn, mode="translate"), ab.from_torch(fn)
    for op in (translated, auto):
        assert_close(op(x), fn(torch.from_numpy(x)).numpy())
        assert_close(jax.grad(lambda v, op=op: op(v) @ ct)(x), t.grad.numpy())
    assert_close(jax.jvp(auto, (x,), (ct,))[1], forward)  # as mode="call"'s
    tangent = jax.jvp(translated, (x,), (ct,))[1]  # the transpose of its own gradient
    assert_close(tangent @ ct, jax.grad(lambda v: translated(v) @ ct)(x) @ ct)
    if fn is _stop_detach:  # translated in the default mode too
        assert_close(tangent, forward)
        assert not auto.fn.program(x).whole_call


def _write_detached(x):  # torch.distributions' idiom: change a value, keep its derivative
    v = x * 2
    v.detach().clamp_(min=0.5)
    return v * 3


def _write_and_read_detached(x):
    v = x * 2
    d = v.detach()
    d.mul_(2)
    return d + v * 3


def _write_in_no_grad(x):
    v = x * 2
    with torch.no_grad():
        v.clamp_(min=0.5)
    return v * 3


@pytest.mark.parametrize("fn", [_write_detached, _write_and_read_detached, _write_in_no_grad],
                         ids=lambda f: f.__name__)
def test_a_write_through_what_torch_does_not_differentiate(fn):
    """torch keeps a tensor's derivative when it is written through a detached view or in
    a no_grad block: a translation writes ``x + stop_gradient(new - x)`` for a detached
    view that is not read again, and otherwise ``"translate"`` says why it cannot and
    ``"auto"`` runs the program as one torch call."""
    x = np.array([0.1, 1.0, -2.0])
    t = torch.tensor(x, requires_grad=True)
    fn(t).sum().backward()
    ops = [ab.from_torch(fn)]
    if fn is _write_detached:
        ops.append(ab.from_torch(fn, mode="translate"))
    else:
        with pytest.raises(TypeError, match="write in place into a tensor"):
            ab.from_torch(fn, mode="translate")(x)
    for op in ops:
        assert_close(op(x), fn(torch.from_numpy(x)).numpy())
        assert_close(jax.grad(lambda v, op=op: op(v).sum())(x), t.grad.numpy())


def test_an_embedding_with_max_norm_differentiates_its_weight_as_torch():
    """``F.embedding(max_norm=)`` renormalizes rows of the weight in place through a
    detached view, and torch differentiates the weight as if unchanged."""
    torch.manual_seed(0)
    m = nn.Embedding(5, 3, max_norm=1.0)
    ids = np.array([0, 2, 2, 3])
    params = _params(m)
    op = ab.from_torch(m)
    got, grad = op(params, ids), jax.grad(lambda p: op(p, ids).sum())(params)["weight"]
    m(torch.from_numpy(ids)).sum().backward()
    assert_close(got, m(torch.from_numpy(ids)).detach().numpy())
    assert_close(grad, m.weight.grad.numpy())


def _kinks(x):
    """Where torch's derivatives pick a side: clamps at their bounds, the first of tied
    maxima, norms and distances of zero vectors, an embedding's padding row and its
    gradient scaled by frequency."""
    z = torch.cat([torch.zeros(1, 3, dtype=x.dtype), x[:2]])  # a zero row
    e = F.embedding(torch.tensor([0, 2, 2, 3]), x, padding_idx=2)
    f = F.embedding(torch.tensor([1, 1, 3]), x, scale_grad_by_freq=True)
    bound = torch.zeros(3, dtype=x.dtype)
    return torch.cat([
        x.clamp(0, 1).flatten(), x.clamp(min=0).flatten(), F.hardtanh(x).flatten(),
        x.clamp(bound, bound + 1).flatten(), x.clamp(max=bound).flatten(),
        F.relu6(x * 6).flatten(), x.max(1).values, x.min(0).values,
        z.norm(dim=1), F.normalize(z, dim=1).flatten(), torch.cdist(z, z).flatten(),
        torch.cdist(z, z, p=3).flatten(), F.pdist(z), F.pairwise_distance(z, z[[0, 0, 1]], eps=0),
        F.cosine_similarity(z, x[:3] + 1, dim=1), e.flatten(), f.flatten()])


def test_a_scattered_product_differentiates_through_zeros_as_torch():
    """Repeated indices, one zero among a place's factors: the first and second derivatives
    are torch's (JAX's own scattered product has none where indices repeat)."""
    index = torch.tensor([[2, 0, 2, 1], [2, 2, 0, 0], [1, 1, 1, 1]])
    f = lambda a, b: a.scatter_reduce(0, index, b, "prod")  # noqa: E731
    rng = np.random.default_rng(0)
    a0, b0, va, vb = (rng.standard_normal((3, 4)) for _ in range(4))
    b0[0, 0] = b0[1, 2] = a0[1, 3] = 0.0
    a, b = (torch.tensor(v, requires_grad=True) for v in (a0, b0))
    ct = rng.standard_normal((3, 4))
    grads = torch.autograd.grad((f(a, b) * torch.from_numpy(ct)).sum(), (a, b), create_graph=True)
    hvp = torch.autograd.grad(sum((g * torch.from_numpy(v)).sum()
                                  for g, v in zip(grads, (va, vb), strict=True)), (a, b))
    op = ab.from_torch(f, mode="translate")
    grad = jax.grad(lambda u, v: jnp.sum(op(u, v) * ct), (0, 1))
    assert_close(op(a0, b0), f(a, b).detach().numpy())
    for got, want in zip(grad(a0, b0), grads, strict=True):
        assert_close(got, want.detach().numpy())
    for got, want in zip(jax.jvp(grad, (a0, b0), (va, vb))[1], hvp, strict=True):
        assert_close(got, want.numpy())


def test_derivatives_at_kinks_are_torchs():
    x = torch.tensor([[0.0, 1.0, -1.0], [1.0, 1.0, 0.5], [-1.0, 0.2, -1.0], [0.3, -0.4, 0.0]],
                     dtype=torch.float64, requires_grad=True)
    y = _kinks(x)
    ct = torch.linspace(-1.0, 2.0, y.numel(), dtype=torch.float64)
    (y * ct).sum().backward()
    for mode in ("translate", "auto"):
        op = ab.from_torch(_kinks, mode=mode)
        v = x.detach().numpy()
        assert_close(op(v), y.detach().numpy())
        assert_close(jax.grad(lambda a: op(a) @ ct.numpy())(v), x.grad.numpy())


def test_derivatives_at_clamps_bounds_follow_the_torch_installed():
    """torch 2.15 changed clamp's derivative at a bound (pytorch/pytorch#191142): the
    translation reads which one the installed torch gives."""
    x = torch.tensor([0.0, 1.0], dtype=torch.float64, requires_grad=True)
    bound = torch.zeros(2, dtype=torch.float64)
    for f in (lambda v: v.clamp(0, 1), lambda v: v.clamp(min=bound)):
        (want,) = torch.autograd.grad(f(x).sum(), x)
        got = jax.grad(lambda v, f=f: ab.from_torch(f, mode="translate")(v).sum())(
            x.detach().numpy())
        assert_close(got, want.numpy())


def test_arguments_that_are_not_arrays():
    """A number given positionally (an operand, as in every mode), None, and a module's
    static keyword (a number, a string, a flag) are what torch's program is captured
    with."""
    x = np.arange(3.0)
    scale = lambda a, s: a * s  # noqa: E731
    maybe = lambda a, b: a if b is None else a + b  # noqa: E731
    for mode in ("auto", "translate"):
        for s_ in (2.5, 2, True):
            assert_close(ab.from_torch(scale, mode=mode)(x, s_), x * s_)
        assert_close(ab.from_torch(maybe, mode=mode)(x, None), x)

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, v, alpha=1.0, act="none"):
            y = self.lin(v) * alpha
            return torch.tanh(y) if act == "tanh" else y
    m = Scaled().double()
    for mode in ("auto", "translate"):
        for kw in (dict(alpha=3.0), dict(act="tanh")):
            assert_close(ab.from_torch(m, mode=mode)(_params(m), x, **kw),
                         m(torch.from_numpy(x), **kw).detach().numpy())


def test_a_function_of_its_own_key_takes_it_by_keyword():
    """Attention's ``key``: where the torch function has a parameter ``key``, ``key=``
    that is not a JAX key is the function's argument; a typed JAX key is the op's."""
    def attention(query, key, value):
        return F.dropout(torch.softmax(query @ key.mT, -1) @ value, 0.5)
    q = np.arange(6.0).reshape(2, 3) / 6
    want = torch.softmax(torch.from_numpy(q) @ torch.from_numpy(q).mT, -1) @ torch.from_numpy(q)
    for mode in ("auto", "translate"):
        op = ab.from_torch(attention, mode=mode)
        got = np.asarray(op(q, q, q, key=jax.random.key(1)))
        kept = got != 0
        assert 0 < kept.sum() < got.size
        assert_close(got[kept], 2 * want.numpy()[kept])
    for mode in ("auto", "translate"):
        plain = ab.from_torch(lambda query, key, value: torch.softmax(query @ key.mT, -1)
                              @ value, mode=mode)
        assert_close(plain(q, key=q, value=q), want.numpy())
        assert_close(jax.jit(lambda a, plain=plain: plain(a, key=a, value=a))(q), want.numpy())


def test_a_setting_changed_after_a_call_is_read_again():
    """A capture bakes in a module's numbers and a function's closed-over ones: changing
    one after a call makes the next call capture again, as ``"call"`` reads them anew."""
    x = np.array([-2.0, -1.0, 1.0])
    act = nn.LeakyReLU(0.1)
    s = 2.0
    scaled = lambda v: v * s  # noqa: E731
    for mode in ("auto", "translate"):
        act.negative_slope, s = 0.1, 2.0
        op, fn = ab.from_torch(act, mode=mode), ab.from_torch(scaled, mode=mode)
        op({}, x), fn(x)
        act.negative_slope, s = 0.5, 5.0
        assert_close(op({}, x), act(torch.from_numpy(x)).numpy())
        assert_close(fn(x), x * 5.0)


def test_params_must_be_the_modules_shapes_and_dtypes():
    ln = nn.LayerNorm(4)
    params = {**_params(ln), "weight": jnp.ones(1)}
    for mode in ("auto", "translate"):
        with pytest.raises(TypeError, match=r"params\['weight'\] has shape \(1,\)"):
            ab.from_torch(ln, mode=mode)(params, np.ones((2, 4), np.float32))


def test_nan_is_largest_in_a_descending_sort_and_has_sign_0():
    v = np.array([1.0, np.nan, 3.0, -np.inf, np.inf, 2.0, 3.0])
    for f in (lambda a: a.sort(descending=True, stable=True)[1], lambda a: a.sign(),
              lambda a: a.sort(descending=True)[0], lambda a: a.sgn()):
        np.testing.assert_array_equal(ab.from_torch(f, mode="translate")(v),
                                      f(torch.from_numpy(v)).numpy())


def test_programs_captured_on_several_threads_at_once():
    """torch.export sets process-wide state: captures of different ops, on four threads at
    once, each get their own program, and none falls back to a torch call. (torch code
    run on another thread while a capture runs is torch's to keep apart: not done here.)"""
    fns = [lambda v, i=i: torch.tanh(v) * (i + 1) + v.sum() for i in range(4)]
    ops = [ab.from_torch(f) for f in fns]
    xs = {(i, n): np.linspace(-1.0, 1.0, n * (i + 1)) for i in range(4) for n in (3, 4)}
    want = {k: fns[k[0]](torch.from_numpy(x)).numpy() for k, x in xs.items()}
    failed: list = []

    def work(i):
        try:
            for n in (3, 4):
                x = xs[i, n]
                assert_close(ops[i](x), want[i, n])
                assert not ops[i].fn.program(x).whole_call
        except Exception as e:  # noqa: BLE001
            failed.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed


def test_a_node_left_to_torch_returns_its_int64_as_int32_where_x64_is_off():
    """With x64 off, a torch call's int64 output (max pooling's indices) comes back as
    JAX's int32, as in mode="call"."""
    f = lambda a: F.max_pool2d(a, 2, return_indices=True)  # noqa: E731
    a = np.random.default_rng(0).standard_normal((1, 2, 4, 6)).astype(np.float32)
    values, at = f(torch.from_numpy(a))
    with jax.enable_x64(False):
        got = ab.from_torch(f)(a)
    assert got[1].dtype == np.int32
    assert_close(got[0], values.numpy())
    np.testing.assert_array_equal(got[1], at.numpy())


def test_a_magnitude_spectrum_translates_in_the_default_mode():
    """Real in, real out, complex inside: ``"auto"`` translates it whole, and the
    magnitude of a complex tensor keeps its imaginary part."""
    x = np.random.default_rng(0).standard_normal(16)
    f = lambda v: torch.fft.rfft(v).abs() + torch.fft.fft(v).angle()[:9]  # noqa: E731
    op = ab.from_torch(f)
    assert_close(op(x), f(torch.from_numpy(x)).numpy())
    prog = op.fn.program(x)
    assert not prog.whole_call and not prog.fallback


def test_a_decomposition_that_changes_an_output_is_not_used():
    """Every output keeps the shape and dtype of the captured op's: torch 2.15's core
    decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` gives the attention
    weights where the op gives their log-sum-exp."""
    q = np.random.default_rng(0).standard_normal((2, 2, 3, 4))
    f = lambda q: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)  # noqa: E731
    want = f(torch.from_numpy(q))
    try:
        got = ab.from_torch(f, mode="translate")(q)
    except TypeError as e:
        assert "change its outputs' shapes or dtypes" in str(e)
    else:  # a torch whose decomposition keeps them
        for g, w in zip(got, want, strict=True):
            assert_close(g, w.numpy())
    for g, w in zip(ab.from_torch(f)(q), want, strict=True):
        assert_close(g, w.numpy())


def test_a_dtype_jax_has_no_arrays_of_runs_as_one_torch_call():
    f = lambda v: v.to(torch.float8_e4m3fn).to(v.dtype)  # noqa: E731  (a float8 inside)
    x = np.linspace(0.0, 1.0, 5)
    with pytest.raises(TypeError, match=r"_to_copy \(torch.float8_e4m3fn\)"):
        ab.from_torch(f, mode="translate")(x)
    auto = ab.from_torch(f)
    assert_close(auto(x), f(torch.from_numpy(x)).numpy())
    assert auto.fn.program(x).whole_call


def test_a_singular_matrix_is_torchs_error_in_auto_and_inf_or_nan_in_translate():
    """torch checks the error flags of ``solve``, ``inv`` and ``cholesky`` (an effect in the
    captured program) and raises; XLA has no such check. ``"auto"`` keeps torch's
    behaviour, running the program as one torch call; ``"translate"`` computes what
    ``jnp.linalg`` computes."""
    f = lambda a, b: torch.linalg.solve(a, b) + torch.linalg.inv(a)  # noqa: E731
    singular, eye = np.ones((3, 3)), np.eye(3)
    assert not np.isfinite(np.asarray(ab.from_torch(f, mode="translate")(singular, eye))).all()
    assert_close(ab.from_torch(f, mode="translate")(2 * eye, eye), eye)
    auto = ab.from_torch(f)
    assert auto.fn.program(eye, eye).whole_call
    with pytest.raises(Exception, match="singular"):
        jax.block_until_ready(jax.jit(auto)(singular, eye))
    chol = ab.from_torch(torch.linalg.cholesky, mode="translate")
    assert np.isnan(np.asarray(chol(-eye))).any()


def test_a_matrix_copied_along_the_batch_enters_one_product():
    """torch's matmul decomposition writes ``x.permute(1, 0, 2) @ w`` (nn.LSTM's input
    projection) as ``bmm`` with ``w`` copied along the batch by ``expand``; the
    translation multiplies by ``w`` itself, forward and backward: no batched product."""
    op = ab.from_torch(lambda x, w: x.permute(1, 0, 2) @ w, mode="translate")
    x, w = np.ones((4, 3, 5)), np.ones((5, 2))
    targets = {str(n.target) for n in op.fn.program(x, w).graph.nodes}
    assert {"aten.expand.default", "aten.bmm.default"} <= targets, targets
    for f in (op, jax.grad(lambda x, w: op(x, w).sum(), argnums=(0, 1))):
        text = jax.jit(f).lower(x, w).as_text()
        assert "dot_general" in text and "batching_dims" not in text, text


class Fourier(nn.Module):
    """A Fourier layer (FNO's spectral convolution): the lowest modes of the input's
    real FFT mixed by complex weights, written into a zero spectrum, transformed back,
    plus a pointwise convolution."""

    def __init__(self, c=3, modes=4):
        super().__init__()
        self.modes = modes
        self.w = nn.Parameter(torch.randn(c, c, modes, dtype=torch.cdouble) / c)
        self.lin = nn.Conv1d(c, c, 1, dtype=torch.double)

    def forward(self, x):
        xf = torch.fft.rfft(x)
        out = torch.zeros(x.shape[0], self.w.shape[1], xf.shape[-1], dtype=xf.dtype)
        out[..., :self.modes] = torch.einsum("bix,iox->box", xf[..., :self.modes], self.w)
        return F.gelu(torch.fft.irfft(out, n=x.shape[-1]) + self.lin(x))


def test_a_fourier_layer_with_complex_weights_translates_and_agrees_with_torch():
    """Values and gradients against torch's; the complex weight's gradient is JAX's
    (the conjugate of torch's ``.grad``), as in call mode."""
    torch.manual_seed(0)
    m, x = Fourier(), torch.randn(2, 3, 15, dtype=torch.double)
    params = _params(m)
    op = ab.from_torch(m, mode="translate")  # raises if any node has no translation
    assert_close(jax.jit(op)(params, x.numpy()), m(x).detach().numpy(), rtol=1e-10,
                 atol=1e-12)
    grads = jax.jit(jax.grad(lambda p: op(p, x.numpy()).sum()))(params)
    called = jax.grad(lambda p: ab.from_torch(m, mode="call")(p, x.numpy()).sum())(params)
    m.zero_grad()
    m(x).sum().backward()
    for k, v in m.named_parameters():
        want = v.grad.numpy().conj()
        assert_close(grads[k], want, rtol=1e-9, atol=1e-11)
        assert_close(called[k], want, rtol=1e-9, atol=1e-11)
    # the input's derivative by central differences, along a random direction
    t = np.random.default_rng(1).standard_normal(x.shape)
    jvp = jax.jvp(lambda v: op(params, v), (x.numpy(),), (t,))[1]
    assert_close(jvp, central_difference(lambda v: np.asarray(op(params, v)), x.numpy(), t),
                 rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------- per-op agreement sweep

def _shapes(*s):
    return s


def _eye(a):
    return torch.eye(a.shape[-1], dtype=a.dtype)


def _index_reduce(a, dim, index, src, reduce, **kw):
    with warnings.catch_warnings():  # torch's notice, once a process: "... is in beta"
        warnings.filterwarnings("ignore", r"index_reduce\(\) is in beta", UserWarning)
        return a.index_reduce(dim, torch.tensor(index), src, reduce, **kw)


# name -> (function of tensors, input shapes, float inputs differentiable)
OPS = {
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=0.5), _shapes((3, 1, 5), (4, 1))),
    "sub_mul_div": (lambda a, b: (a - b) * a / (b.abs() + 1), _shapes((5, 3), (3,))),
    "pow": (lambda a, b: (a.abs() + 0.5) ** b, _shapes((2, 3), (2, 3))),
    "unary": (lambda a: a.sin() + a.cos().exp() + a.tanh() + a.sigmoid() + torch.erf(a)
              + a.abs().sqrt() + torch.log1p(a.abs()) + a.atan(), _shapes((3, 7))),
    "maximum_where_clamp": (lambda a, b: torch.where(a > b, torch.maximum(a, b),
                                                     a.clamp(-0.5, 0.5)), _shapes((4, 5), (5,))),
    "softmax_logsoftmax": (lambda a: a.softmax(-1) + a.log_softmax(0), _shapes((3, 6))),
    "reductions": (lambda a: a.sum(1) + a.mean(1) + a.amax(1) + a.var(1) + a.std(1)
                   + a.logsumexp(1), _shapes((4, 5))),
    "cumsum_cumprod": (lambda a: a.cumsum(1) + a.cumprod(0), _shapes((3, 4))),
    "matmul": (lambda a, b: a @ b, _shapes((2, 3, 5), (5, 4))),
    # torch's matmul of a permuted 3-d input: expand + bmm; bmm of matrices copied along
    # the batch, one operand or both; an expand that widens a dim other than the batch
    "matmul_copied_along_the_batch": (
        lambda a, b, c, d: a.permute(1, 0, 2) @ b
        + torch.bmm(c.unsqueeze(0).expand(3, 2, 5), b.unsqueeze(0).expand(3, 5, 4))
        + torch.bmm(a.permute(1, 0, 2), d.expand(3, 5, 4)),
        _shapes((2, 3, 5), (5, 4), (2, 5), (3, 5, 1))),
    "bmm_baddbmm": (lambda a, b, c: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
                    _shapes((2, 3, 4), (2, 4, 5), (2, 3, 5))),
    "linear": (lambda a, w, b: F.linear(a, w, b), _shapes((3, 7), (5, 7), (5,))),
    "conv1d": (lambda a, w: F.conv1d(a, w, padding=2, stride=2), _shapes((2, 3, 9), (4, 3, 3))),
    "conv2d_groups_dilation": (lambda a, w: F.conv2d(a, w, groups=2, dilation=2, padding=1),
                               _shapes((1, 4, 7, 6), (6, 2, 3, 3))),
    "conv_transpose2d": (lambda a, w: F.conv_transpose2d(a, w, stride=2, padding=1,
                                                         output_padding=1),
                         _shapes((1, 3, 5, 4), (3, 2, 3, 3))),
    "conv_transpose_groups": (lambda a, w, b: torch.cat([
        F.conv_transpose2d(a, w, stride=(2, 1), groups=2, dilation=(1, 2)).flatten(),
        F.conv_transpose1d(a[0], w[:, :, 0], stride=2, groups=4, output_padding=1).flatten(),
        F.conv_transpose3d(a[:, :, None], b, groups=2, padding=(0, 1, 1)).flatten()]),
        _shapes((2, 4, 4, 3), (4, 3, 2, 2), (4, 1, 1, 3, 3))),
    "max_pool_ceil": (lambda a: F.max_pool2d(a, 3, 2, padding=1, ceil_mode=True),
                      _shapes((1, 2, 7, 8))),
    "avg_pool": (lambda a: F.avg_pool2d(a, 3, 2, padding=1) + 0
                 * F.avg_pool2d(a, 3, 2, padding=1, count_include_pad=False),
                 _shapes((1, 2, 7, 8))),
    "adaptive_avg_pool": (lambda a: F.adaptive_avg_pool2d(a, (3, 2)), _shapes((1, 2, 7, 5))),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (5,), w, b), _shapes((3, 5), (5,), (5,))),
    "group_norm": (lambda a, w, b: F.group_norm(a, 2, w, b), _shapes((2, 4, 3, 3), (4,), (4,))),
    "batch_norm_train": (lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True),
                         _shapes((4, 3, 5), (3,), (3,))),
    "views": (lambda a: a.t().reshape(2, 6)[:, 1::2].unsqueeze(0).expand(3, 2, 3).flip(2)
              .permute(2, 0, 1), _shapes((4, 3))),
    "cat_stack_split": (lambda a, b: torch.cat([a, b], 1).split([2, 3], 1)[1]
                        + torch.stack([a[:, 0], b[:, 0]], 1).sum(1, keepdim=True),
                        _shapes((3, 2), (3, 3))),
    "index_gather": (lambda a: a[torch.tensor([2, 0, 1])] + a.gather(1, torch.tensor(
        [[0, 1], [1, 0], [2, 2]]))[:, :1], _shapes((3, 3))),
    "pad_tril_roll": (lambda a: F.pad(a, (1, 2, 0, 1)).tril(1).roll(1, 0), _shapes((3, 4))),
    "activations": (lambda a: F.silu(a) + F.elu(a) + F.leaky_relu(a, 0.1) + F.softplus(a)
                    + F.hardtanh(a) + F.gelu(a, approximate="tanh"), _shapes((4, 6))),
    "embedding": (lambda w: F.embedding(torch.tensor([[1, 3], [0, 1]]), w), _shapes((4, 5))),
    "sort_topk": (lambda a: a.sort(1, descending=True)[0] + a.topk(4, 1)[0], _shapes((3, 4))),
    "scaled_dot_product_attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        _shapes((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4))),
    "diagonal_repeat": (lambda a: a.diagonal(1).repeat(2, 1) + 0 * a[0, 0], _shapes((4, 5))),
    "reflect_replicate_pad": (lambda a: F.pad(a, (2, 1, 1, 2), mode="reflect")
                              + F.pad(a, (2, 1, 1, 2), mode="replicate"), _shapes((1, 2, 4, 5))),
    "upsample": (lambda a: F.interpolate(a, size=(7, 9), mode="bilinear")
                 + F.interpolate(a, size=(7, 9), mode="bilinear", align_corners=True)
                 + F.interpolate(a, size=(7, 9), mode="nearest"), _shapes((1, 2, 3, 4))),
    "cdist": (lambda a, b: torch.cdist(a, b) + torch.cdist(a, b, p=1.0),
              _shapes((2, 4, 3), (2, 5, 3))),
    "scatter_reduce": (lambda a, b: a.scatter_reduce(0, torch.tensor([[0, 1, 0], [2, 0, 1]]),
                                                     b, "sum")
                       + a.scatter_reduce(0, torch.tensor([[0, 1, 0], [2, 0, 1]]), b, "mean",
                                          include_self=False), _shapes((3, 3), (2, 3))),
    # no rule of its own: torch's decomposition of grid_sampler_2d, translated; every
    # mode and padding, inside the grid and out
    "grid_sample": (lambda a, g: F.grid_sample(a, g, align_corners=False)
                    + F.grid_sample(a, g, mode="nearest", padding_mode="reflection",
                                    align_corners=True)
                    + F.grid_sample(a, g, mode="bicubic", padding_mode="border",
                                    align_corners=False), _shapes((1, 2, 5, 6), (1, 3, 4, 2))),
    # a rule of its own, torch's 2-d decomposition in three dims; an affine grid
    "grid_sample_3d": (lambda a, g, t: F.grid_sample(a, g, align_corners=True)
                       + F.grid_sample(a, g, mode="nearest", padding_mode="border",
                                       align_corners=False)
                       + F.grid_sample(a, g, padding_mode="reflection",
                                       align_corners=False).flip(2)
                       + F.grid_sample(a, F.affine_grid(t, (1, 2, 2, 3, 3), align_corners=False),
                                       padding_mode="border", align_corners=False),
                       _shapes((1, 2, 3, 4, 5), (1, 2, 3, 3, 3), (1, 3, 4))),
    # real to complex, one-sided and not; complex to complex, both ways; complex to real,
    # of an odd length; every normalization; a complex product; the real part
    "fft": (lambda a, b: torch.fft.irfft(torch.fft.rfft(a, norm="ortho") * b, n=7)
            + torch.fft.ifft(torch.fft.fft(a, dim=0), dim=0, norm="forward").real
            + torch.view_as_real(torch.fft.fftn(a, norm="forward")).sum(-1)
            + torch.fft.irfft2(torch.fft.rfft2(a), s=(3, 7)),
            _shapes((3, 7), (3, 4))),
    "median_logcumsumexp_unfold": (lambda a: a.median(1, keepdim=True)[0]
                                   + a.nanmedian(0)[0] + a.median() + a.logcumsumexp(1)
                                   + a.unfold(1, 2, 1).sum(-1).repeat(1, 2)[:, :4],
                                   _shapes((3, 4))),
    "adaptive_max_pool": (lambda a: F.adaptive_max_pool2d(a, (3, 2)).sum((-1, -2))
                          + F.adaptive_max_pool1d(a[..., 0], 2).sum(-1), _shapes((1, 2, 7, 5))),
    # sum with weights by sample, an empty bag, the last offset included; mean and max with
    # a padding index left out of its bag
    "embedding_bag": (lambda w, s: F.embedding_bag(torch.tensor([3, 1, 4, 1, 5, 9, 2]), w,
                                                   torch.tensor([0, 2, 2, 5, 7]), mode="sum",
                                                   per_sample_weights=s[0, :7],
                                                   include_last_offset=True)
                      + F.embedding_bag(torch.tensor([3, 1, 4, 3, 5, 9, 2]), w,
                                        torch.tensor([0, 2, 2, 5]), mode="mean", padding_idx=3)
                      + F.embedding_bag(torch.tensor([3, 1, 4, 3, 5, 9, 2]), w,
                                        torch.tensor([0, 2, 2, 5]), mode="max", padding_idx=3),
                      _shapes((10, 3), (1, 8))),
    "bilinear": (lambda a, b, w, c: F.bilinear(a, b, w, c), _shapes((4, 3), (4, 5), (2, 3, 5),
                                                                    (2,))),
    # torch reads one triangle of eigh's and cholesky's input: a matrix that is not
    # symmetric; only the eigenvalues and singular values, which are unique
    "linalg": (lambda a, b: torch.linalg.solve(a @ a.mT + 3 * _eye(a), b)
               + torch.linalg.inv(a + 3 * _eye(a))
               + torch.linalg.cholesky(a @ a.mT + torch.triu(a, 1) + 3 * _eye(a))
               + torch.linalg.solve_triangular(a + 3 * _eye(a), b, upper=True)
               + torch.cholesky_solve(b, torch.tril(a) + 4 * _eye(a))
               + torch.linalg.pinv(a) + torch.linalg.qr(a).Q + torch.linalg.qr(a).R
               + (torch.linalg.det(a) + torch.linalg.slogdet(a)[1]
                  + torch.linalg.eigvalsh(a, UPLO="U") + torch.linalg.svdvals(a))[:, None],
               _shapes((4, 4), (4, 4))),
    # a short-time Fourier transform: windows by unfold, an FFT, the magnitude
    "stft": (lambda a: torch.stft(a.flatten(), 4, hop_length=2, return_complex=True,
                                  window=torch.hann_window(4, dtype=a.dtype)).abs(),
             _shapes((3, 4))),
    "special_functions": (lambda a, b: torch.i0(a) + torch.special.i0e(a) + torch.special.i1(a)
                          + torch.special.i1e(a) + torch.special.ndtri(b.sigmoid())
                          + torch.igamma(torch.full_like(b, 2.5), b.abs() + 0.1)
                          + torch.igammac(torch.full_like(b, 0.5), b.abs() + 0.1)
                          + torch.fmax(a, b) + torch.fmin(a, b), _shapes((3, 5), (3, 5))),
    # the index torch's kernels keep among ties is the last one (cummax, cummin)
    "erfcx_log_ndtr": (lambda a: torch.special.erfcx(a) + torch.special.log_ndtr(a),
                       _shapes((3, 5))),
    # x[mask] = v: one value for every element, one per trailing element (added)
    "mask_put": (lambda a, b: a.index_put((a > 0,), b[0, 0] * 2)
                 + a.index_put((a[:, 0] > 0,), b[0], accumulate=True), _shapes((3, 4), (3, 4))),
    "running_and_order": (lambda a, b: torch.cummax(a, 1)[0] + torch.cummin(a, 0)[0]
                          + torch.kthvalue(a, 2, 1, keepdim=True)[0]
                          + torch.var_mean(a, 1, keepdim=True)[0] * torch.var_mean(a, 0)[1]
                          + torch.dist(a, b) + torch.dist(a, b, 1.5), _shapes((3, 5), (3, 5))),
    "addmv_addbmm": (lambda c, a, v, b1, b2: torch.addmv(c, a, v, beta=0.5, alpha=2.0)[:, None]
                     + torch.addbmm(a[:, :1], b1, b2), _shapes((3,), (3, 4), (4,), (2, 3, 4),
                                                             (2, 4, 4))),
    "solvers": (lambda a, b: torch.cholesky_inverse(torch.tril(a) + 4 * _eye(a))
                + torch.linalg.matrix_exp(0.3 * a) + torch.diagonal_scatter(a, b[0, :3], 1),
                _shapes((4, 4), (4, 4))),
    # indices that repeat, the product's among them (JAX differentiates a scattered product
    # only where indices are unique); put's flat indices, negative ones too
    "index_reduce_put": (lambda a, b: _index_reduce(a, 0, [2, 0, 2, 1, 2], b, "prod")
                         + _index_reduce(a, 0, [1, 1, 0, 1, 2], b, "amax", include_self=False)
                         + _index_reduce(a, 1, [3, 0, 3, 3], a.flip(0), "mean")
                         + _index_reduce(a, 1, [1, 1, 2, 1], a.flip(1), "amin")
                         + a.scatter_reduce(0, torch.tensor([[0, 2, 0, 0]] * 4), b[:4], "prod",
                                            include_self=False)
                         + a.put(torch.tensor([0, -1, 5, 5]), b[1], accumulate=True)
                         + a.put(torch.tensor([3, 7]), b[2, :2]), _shapes((3, 4), (5, 4))),
    # torch's tolerances: an absolute one (a tensor, or a float with rtol then 0),
    # pinverse's rcond
    "pinv_tolerances": (lambda a: torch.linalg.pinv(a, atol=torch.tensor(0.5, dtype=a.dtype))
                        + torch.linalg.pinv(a, atol=0.1, rtol=0.3)
                        + torch.pinverse(a, rcond=0.2), _shapes((4, 4))),
    # the copying forms of views; nearest upsampling by its explicit-size overload
    "copies_and_nearest": (lambda a: torch.cat([
        torch.ops.aten.select_copy.int(a, 1, 0).flatten(),
        torch.ops.aten.slice_copy.Tensor(a, 1, 1, 3).flatten(),
        torch.ops.aten.upsample_nearest2d(a[None], [5, 7]).flatten()]), _shapes((2, 4, 3))),
    # max pooling's indices, read by unpooling
    "max_unpool": (lambda a: F.max_unpool2d(*F.max_pool2d(a, 2, return_indices=True), 2),
                   _shapes((1, 2, 4, 6))),
    # eval mode: a leaky ReLU of the mean slope
    "rrelu_eval": (lambda a: F.rrelu(a, 0.1, 0.3, training=False), _shapes((3, 4))),
    # the embedding losses make their zeros with empty_permuted
    "embedding_losses": (lambda a, b: F.cosine_embedding_loss(a, b, torch.tensor([1, -1, 1]),
                                                              margin=0.1)
                         + F.hinge_embedding_loss(a, torch.tensor([[1, -1, 1, -1]] * 3)),
                         _shapes((3, 4), (3, 4))),
    # abs and angle of complex numbers are real; the conjugate; polar form
    "complex": (lambda a, b: (torch.polar(a.abs() + 0.5, b) * (a + 1j * b).conj()).abs()
                + (a + 1j * b).angle(), _shapes((3, 4), (3, 4))),
}
_NO_BFLOAT16 = ("cdist", "fft", "stft", "linalg", "complex", "special_functions", "solvers",
                "erfcx_log_ndtr", "pinv_tolerances")
_TOL = {torch.float64: (1e-9, 1e-11), torch.float32: (2e-5, 2e-5),
        torch.bfloat16: (3e-2, 3e-2)}


def _inputs(shapes, dtype, transposed):
    """Fixed-seed inputs; ``transposed``: each 2-d-or-more input a non-contiguous view."""
    torch.manual_seed(0)
    out = []
    for s in shapes:
        if transposed and len(s) >= 2:
            t = torch.randn(*s[:-2], s[-1], s[-2], dtype=torch.float64).transpose(-1, -2)
        else:
            t = torch.randn(*s, dtype=torch.float64)
        out.append(t.to(dtype))
    return out


@pytest.mark.slow  # one capture per op and dtype: about a minute in all
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_each_translated_op_agrees_with_torch(name, dtype):
    fn, shapes = OPS[name]
    if name in _NO_BFLOAT16 and dtype == torch.bfloat16:
        pytest.skip(f"torch has no bfloat16 {name} on the CPU to compare with")
    ts = _inputs(shapes, dtype, transposed=dtype == torch.float64)
    if name == "erfcx_log_ndtr" and jax.__version_info__ < (0, 12):  # torch runs erfcx
        with pytest.raises(TypeError, match="aten::special_erfcx"):
            ab.from_torch(fn, mode="translate")(*[_numpy(t) for t in ts])
        return
    for t in ts:
        t.requires_grad_()
    expected = fn(*ts)
    ct = torch.randn(expected.shape, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(1))
    (expected.double() * ct).sum().backward()
    rtol, atol = _TOL[dtype]
    np_in = [_numpy(t.detach()) for t in ts]
    op = ab.from_torch(fn, mode="translate")
    got = jax.jit(op)(*np_in)
    assert str(got.dtype) == str(expected.dtype).removeprefix("torch.")
    scale = max(1.0, float(expected.detach().double().abs().max()))
    assert_close(np.asarray(got, np.float64), expected.detach().double().numpy(),
                 rtol=rtol, atol=atol * scale)
    grads = jax.jit(jax.grad(lambda *v: jnp.sum(op(*v).astype(jnp.float64) * ct.numpy()),
                             argnums=tuple(range(len(np_in)))))(*np_in)
    for g, t in zip(grads, ts, strict=True):
        gs = max(1.0, float(t.grad.double().abs().max()))
        assert_close(np.asarray(g, np.float64), t.grad.double().numpy(), rtol=rtol,
                     atol=atol * gs * (4 if dtype == torch.bfloat16 else 1))


def _numpy(t):
    if t.dtype == torch.bfloat16:
        return np.asarray(jnp.asarray(t.float().numpy()).astype(jnp.bfloat16))
    return t.numpy()


@pytest.mark.slow  # captures every model twice
def test_the_coverage_page_is_what_its_script_writes():
    import pathlib
    import sys
    docs = pathlib.Path(__file__).resolve().parent.parent / "docs"
    sys.path.insert(0, str(docs))
    import gen_translate_coverage
    assert gen_translate_coverage.PAGE.read_text() == gen_translate_coverage.render(), (
        "run: python docs/gen_translate_coverage.py")
