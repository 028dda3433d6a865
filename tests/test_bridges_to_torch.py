"""ab.to_torch: JAX code as a torch operation, its derivatives taken from JAX.

Values and every derivative are checked against torch's own (the same function
written with torch) and JAX's own: an MLP (gradients in the parameters,
Hessian-vector products in the input), a complex-valued function, integer
outputs, pytrees; ``ab.check(..., torch=True)`` passes on the complex and the
integer one (its torch checks compare op.torch with JAX's own). Then autograd,
torch.func, gradcheck/gradgradcheck with forward AD, torch.compile, and
op.torch of a traced op written with jax.numpy.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import randn, to_torch


def _close(got, want, rtol=1e-10, atol=1e-10):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if isinstance(w, torch.Tensor):
            w = w.detach().resolve_conj().numpy()
        g = g.detach().resolve_conj().numpy() if isinstance(g, torch.Tensor) else g
        np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol)


def _t(x, grad=False):
    return torch.from_numpy(np.array(x)).requires_grad_(grad)


# ------------------------------------------------------------------------ MLP

def _jax_mlp(p, x):
    return jnp.tanh(x @ p["w1"] + p["b1"][None]) @ p["w2"]


def _torch_mlp(p, x):
    return torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]


def test_mlp_parameter_gradients_and_input_hvp():
    p = {"w1": randn((3, 5)), "b1": randn(5, seed=1), "w2": randn((5, 2), seed=2)}
    x, v = randn((4, 3), seed=3), randn((4, 3), seed=4)
    f = ab.to_torch(_jax_mlp)
    tp = {k: _t(a, True) for k, a in p.items()}
    out = f(tp, _t(x))
    _close(out, _torch_mlp(tp, _t(x)))
    _close(out, _jax_mlp(p, x))
    # parameter gradients by .backward(), against torch's own and JAX's own
    torch.sin(out).sum().backward()
    want = {k: t.grad.clone() for k, t in tp.items()}
    for t in tp.values():
        t.grad = None
    torch.sin(_torch_mlp(tp, _t(x))).sum().backward()
    _close([tp[k].grad for k in sorted(tp)], [want[k] for k in sorted(want)])
    _close([want[k] for k in sorted(want)], jax.grad(
        lambda p: jnp.sum(jnp.sin(_jax_mlp(p, x))))(p))
    # Hessian-vector product in the input: torch.func forward over reverse
    loss = lambda g: lambda x: torch.sin(g({k: t.detach() for k, t in tp.items()}, x)).sum()
    hvp = lambda g: torch.func.jvp(torch.func.grad(loss(g)), (_t(x),), (_t(v),))[1]
    _close(hvp(f), hvp(_torch_mlp))
    _close(hvp(f), jax.jvp(jax.grad(lambda x: jnp.sum(jnp.sin(_jax_mlp(p, x)))), (x,), (v,))[1])
    # reverse over reverse, and torch.vmap of the function
    h = lambda g: torch.func.hessian(loss(g))(_t(x[:1]))
    _close(h(f), h(_torch_mlp))
    xs = randn((3, 4, 3), seed=5)
    pd = {k: t.detach() for k, t in tp.items()}
    _close(torch.vmap(lambda x: f(pd, x))(_t(xs)), torch.vmap(lambda x: _torch_mlp(pd, x))(_t(xs)))


# -------------------------------------------------------------------- complex

def _jax_cplx(z, w):
    return z * jnp.sin(w) + jnp.conj(z) ** 2


def _torch_cplx(z, w):
    return z * torch.sin(w) + torch.conj(z) ** 2


def test_complex_gradients_follow_torch():
    f = ab.to_torch(_jax_cplx)
    z, w = randn(4, np.complex128), randn(4, np.complex128, seed=1)
    dz, dw = randn(4, np.complex128, seed=2), randn(4, np.complex128, seed=3)
    args = (_t(z), _t(w))
    _close(f(*args), _torch_cplx(*args))
    _close(torch.func.jvp(f, args, (_t(dz), _t(dw))),
           torch.func.jvp(_torch_cplx, args, (_t(dz), _t(dw))))
    ybar = _t(randn(4, np.complex128, seed=4))
    _close(torch.func.vjp(f, *args)[1](ybar), torch.func.vjp(_torch_cplx, *args)[1](ybar))
    a, b = _t(z, True), _t(w, True)
    assert torch.autograd.gradcheck(f, (a, b), check_forward_ad=True)


# ------------------------------------------------------------ integer outputs

def test_integer_outputs():
    f = ab.to_torch(lambda x: (x ** 3, jnp.argmax(x, axis=-1)))
    x = _t(randn((3, 4)), True)
    y, i = f(x)
    assert i.dtype == torch.int64 and not i.requires_grad
    torch.testing.assert_close(i, torch.argmax(x, -1))
    y.sum().backward()
    _close(x.grad, 3 * x.detach() ** 2)
    _, (dy, di) = torch.func.jvp(f, (x.detach(),), (torch.ones_like(x),))
    _close(dy, 3 * x.detach() ** 2)
    torch.testing.assert_close(torch.vmap(f)(x.detach())[1], torch.argmax(x.detach(), -1))


# -------------------------------------------------------------------- pytrees

def _jax_tree(d, *, k, scale):
    x, (y, n) = d["x"], d["pair"]
    return {"s": x * jnp.cos(y) * k * scale, "t": [x.sum() ** 2, n + 1]}


def _torch_tree(d, *, k, scale):
    x, (y, n) = d["x"], d["pair"]
    return {"s": x * torch.cos(y) * k * scale, "t": [x.sum() ** 2, n + 1]}


def test_pytrees_and_keywords():
    f = ab.to_torch(_jax_tree)
    d = {"x": _t(randn(3)), "pair": (_t(randn(3, seed=1)), torch.arange(2))}
    kw = dict(k=_t(randn(3, seed=2)), scale=2.0)
    got = f(d, **kw)
    assert jax.tree.structure(got) == jax.tree.structure(_torch_tree(d, **kw))
    _close(got, _torch_tree(d, **kw))
    floats = lambda x, y: jax.tree.leaves(f({"x": x, "pair": (y, d["pair"][1])}, **kw))[:2]
    tfloats = lambda x, y: jax.tree.leaves(_torch_tree({"x": x, "pair": (y, d["pair"][1])},
                                                       **kw))[:2]
    args = (d["x"], d["pair"][0])
    _close(torch.func.jacrev(floats, argnums=(0, 1))(*args),
           torch.func.jacrev(tfloats, argnums=(0, 1))(*args))
    _close(torch.func.jacfwd(floats, argnums=(0, 1))(*args),
           torch.func.jacfwd(tfloats, argnums=(0, 1))(*args))


# --------------------------------------------------------- checks and compile

def test_gradcheck_and_gradgradcheck_with_forward_ad():
    f = ab.to_torch(lambda x, y: jnp.sin(x) * jnp.exp(y))
    args = (_t(randn(3), True), _t(randn(3, seed=1), True))
    assert torch.autograd.gradcheck(f, args, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, args, check_fwd_over_rev=True,
                                        check_rev_over_rev=True)


@pytest.mark.parametrize("fn, args", [
    (_jax_cplx, (randn(4, np.complex128), randn(4, np.complex128, seed=1))),
    (lambda x: (x ** 3, jnp.argmax(x, axis=-1)), (randn((3, 4)),)),
])
def test_ab_check_through_torch(fn, args):
    report = ab.check(ab.bind(fn, traced=True), *args, torch=True)
    rows = {r.check: r.status for r in report.rows if r.check.startswith("torch")}
    assert {"torch eager", "torch jvp", "torch vjp", "torch vmap"} <= set(rows), rows
    assert all(s in ("ok", "skipped") for s in rows.values()), str(report)


# torch.compile on CPython 3.13.0 exactly warns that its guards may run slower there (an
# interpreter bug fixed in 3.13.1): a notice about the interpreter, not about this code
@pytest.mark.filterwarnings("ignore:Guards may run slower on Python 3.13.0:RuntimeWarning")
def test_torch_compile_sees_one_opaque_op():
    f = ab.to_torch(lambda x: jnp.sin(x) ** 2)
    torch._dynamo.reset()  # aot_eager: the capture and its derivatives, not inductor's kernels
    g = torch.compile(lambda v: f(v) * 2 + 1, fullgraph=True, backend="aot_eager")
    x = _t(randn(5), True)
    y = g(x)
    _close(y, 2 * torch.sin(x) ** 2 + 1)
    y.sum().backward()
    _close(x.grad, 2 * torch.sin(2 * x.detach()))


# ------------------------------------------------- traced ops and round trips

def test_op_torch_of_jax_numpy_code_runs_by_jax():
    op = ab.bind(lambda x: jnp.sum(jnp.sin(x) ** 2), traced=True)
    x = _t(randn(3), True)
    op.torch(x).backward()
    _close(x.grad, torch.sin(2 * x.detach()))
    assert op.torch.bridge is not None  # decided once, kept
    # plain arithmetic still runs on the tensors themselves
    plain = ab.bind(lambda x: x * x, traced=True)
    _close(plain.torch(x), x * x)
    assert plain.torch.bridge is None


def test_round_trips_and_no_aliasing():
    f = ab.to_torch(lambda x: x)  # JAX gives its input back: torch gets a tensor of its own
    x = _t(randn(3))
    y = f(x)
    assert y.data_ptr() != x.data_ptr()
    _close(y, x)
    assert ab.to_torch(f) is f
    g = lambda t: torch.cos(t)
    assert ab.to_torch(ab.from_torch(g)) is g
    with pytest.raises(TypeError, match="expects a JAX function"):
        ab.to_torch(3)


def test_float32_and_float64_keep_their_dtypes():
    f = ab.to_torch(lambda x: jnp.sin(x) + jnp.zeros((), x.dtype))
    for dt in (torch.float32, torch.float64):
        with jax.enable_x64(False):  # x64 is on while the bridge runs, whatever JAX's setting
            y = f(torch.ones(2, dtype=dt))
        assert y.dtype == dt
    _close(f(to_torch(np.ones(2))), np.sin(np.ones(2)))


# -------------------------------------------------- first-order backward, directly

def _mixed(p, x, *, w, scale):
    """A pytree input, a complex input, an unused output, an integer output, a keyword
    operand and a static keyword: what torch's first-order backward sees."""
    y = scale * jnp.sin(p["a"]) * x.real + w
    return {"y": y, "z": jnp.conj(x) * p["b"], "n": jnp.argmax(p["a"]), "unused": p["a"] ** 2}


@pytest.mark.parametrize("used", [("y",), ("z",), ("y", "z", "unused")])
def test_first_order_backward_is_jaxs_vjp(used):
    p = {"a": randn(4), "b": randn(4, seed=1)}
    x, w = randn(4, np.complex128, seed=2), randn(4, seed=3)
    cts = {k: randn(4, np.complex128 if k == "z" else np.float64, seed=4 + i)
           for i, k in enumerate(used)}
    f = ab.to_torch(_mixed)
    tp, tx = {k: _t(v, True) for k, v in p.items()}, _t(x, True)
    out = f(tp, tx, w=_t(w), scale=2.0)
    assert out["n"].dtype == torch.int64 and not out["n"].requires_grad
    got = torch.autograd.grad([out[k] for k in used], [tp["a"], tp["b"], tx],
                              [_t(cts[k]) for k in used], allow_unused=True)
    # torch's gradients are the conjugates of JAX's transposed vjp of conj(ȳ)
    full = {k: (np.conj(cts[k]) if k in cts else np.zeros(4, np.complex128 if k == "z"
                                                            else np.float64))
            for k in ("y", "z", "unused")}
    full["n"] = np.zeros((), jax.dtypes.float0)
    _, pullback = jax.vjp(lambda p, x: _mixed(p, x, w=w, scale=2.0), p, x)
    gp, gx = pullback(full)
    for g, want in zip(got, [gp["a"], gp["b"], gx]):
        want = np.conj(np.asarray(want))
        np.testing.assert_allclose(np.zeros_like(want) if g is None else g.numpy(), want,
                                   rtol=1e-12, atol=1e-12)
    # the same numbers with a graph kept for a second order (the general path)
    out = f(tp, tx, w=_t(w), scale=2.0)
    again = torch.autograd.grad([out[k] for k in used], [tp["a"], tp["b"], tx],
                                [_t(cts[k]) for k in used], allow_unused=True,
                                create_graph=True)
    for g, h in zip(got, again):
        assert (g is None) == (h is None)
        if g is not None:
            np.testing.assert_allclose(h.detach().numpy(), g.numpy(), rtol=1e-12, atol=0)


def test_first_order_backward_in_bfloat16():
    f = ab.to_torch(lambda x: jnp.sin(x) * 2)
    x = torch.linspace(0, 1, 5, dtype=torch.bfloat16, requires_grad=True)
    y = f(x)
    (g,) = torch.autograd.grad(y, [x], torch.ones_like(y))
    assert y.dtype == g.dtype == torch.bfloat16
    np.testing.assert_allclose(g.float().numpy(), 2 * np.cos(x.detach().float().numpy()),
                               rtol=1e-2)
