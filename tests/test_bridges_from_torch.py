"""ab.from_torch: torch code as a JAX primitive, its derivatives taken from torch.func.

Every value and derivative is checked against torch's own (the same code run by
torch.func) and against JAX's own (the same function written with jax.numpy):
an MLP ``nn.Module`` (gradients in the parameters, Hessian-vector products in
the input), a complex-valued function, a function with integer outputs, and
pytrees; ``ab.check`` passes on each (jvp against central differences, vjp
against jvp, second orders, vmap). Then every transformation, the round trips,
and the errors.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import (
    assert_close,
    assert_tree_close,
    randn,
    run_fresh_python,
    to_torch,
    tree_randn_like,
)


def _np(t):
    return t.detach().resolve_conj().numpy()


# ---------------------------------------------------------------- an MLP module

def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2)).double()


def _jax_mlp(p, x):
    h = jnp.tanh(x @ p["0.weight"].T + p["0.bias"][None])
    return h @ p["2.weight"].T + p["2.bias"][None]


def _params(net):
    return {k: jnp.array(v.numpy()) for k, v in net.state_dict().items()}


def test_mlp_module_values_parameter_gradients_and_input_hvp():
    net = _mlp()
    op, params = ab.from_torch(net), _params(net)
    x, v = randn((4, 3)), randn((4, 3), seed=1)
    loss = lambda f: lambda p, x: jnp.sum(jnp.sin(f(p, x)))
    tparams = {k: torch.from_numpy(np.array(a)) for k, a in params.items()}
    tloss = lambda p, x: torch.sin(torch.func.functional_call(net, p, (x,))).sum()

    assert_close(op(params, x), net(torch.from_numpy(x)).detach().numpy())
    assert_close(op(params, x), _jax_mlp(params, x))
    # gradients with respect to the parameters, under jit
    got = jax.jit(jax.grad(loss(op)))(params, x)
    want_torch = torch.func.grad(tloss)(tparams, torch.from_numpy(x))
    assert_close(got, {k: want_torch[k].numpy() for k in got})
    assert_close(got, jax.grad(loss(_jax_mlp))(params, x))
    # Hessian-vector products with respect to the input: forward over reverse
    hvp = lambda f: jax.jvp(jax.grad(loss(f), argnums=1), (params, x), (
        jax.tree.map(jnp.zeros_like, params), v))[1]
    got = jax.jit(lambda: hvp(op))()
    want_torch = torch.func.jvp(lambda x: torch.func.grad(tloss, argnums=1)(tparams, x),
                                (torch.from_numpy(x),), (torch.from_numpy(v),))[1]
    assert_close(got, want_torch.numpy())
    assert_close(got, hvp(_jax_mlp))
    # batched inputs, parameters shared
    xs = randn((3, 4, 3), seed=2)
    assert_close(jax.vmap(op, in_axes=(None, 0))(params, xs), jax.vmap(
        _jax_mlp, in_axes=(None, 0))(params, xs))
    assert ab.check(op, params, x).ok


# -------------------------------------------------------- complex-valued code

def _torch_cplx(z, w):
    return z * torch.sin(w) + torch.conj(z) ** 2, (z.abs() ** 2).sum()


def _jax_cplx(z, w):
    return z * jnp.sin(w) + jnp.conj(z) ** 2, (jnp.abs(z) ** 2).sum()


def test_complex_function_matches_jax_and_torch():
    """A non-holomorphic map (conj): jvp, vjp and a second order against JAX's own;
    the vjp (JAX's convention, ȳ ↦ Jᵀȳ) against torch's (conjugated) too."""
    op = ab.from_torch(_torch_cplx)
    z, w = randn(4, np.complex128), randn(4, np.complex128, seed=1)
    args, dargs = (z, w), tree_randn_like((z, w), seed=2)
    assert_close(op(*args), _jax_cplx(*args))
    assert_close(jax.jvp(op, args, dargs), jax.jvp(_jax_cplx, args, dargs))
    ybar = tree_randn_like(_jax_cplx(*args), seed=3)
    got = jax.vjp(op, *args)[1](ybar)
    assert_close(got, jax.vjp(_jax_cplx, *args)[1](ybar))
    conj = lambda t: torch.conj(t) if t.is_complex() else t
    _, pull = torch.func.vjp(_torch_cplx, *to_torch(args))
    torch_xbar = pull(tuple(conj(c) for c in to_torch(ybar)))
    assert_close(got, [np.conj(_np(c)) for c in torch_xbar])
    s = lambda f: lambda z: jnp.real(jnp.sum(f(z, w)[0] * ybar[0]))
    assert_close(jax.jvp(jax.grad(s(op)), (z,), (dargs[0],)),
                 jax.jvp(jax.grad(s(_jax_cplx)), (z,), (dargs[0],)))
    assert ab.check(op, *args).ok  # and jvp against central differences, vjp against jvp


# ------------------------------------------------------------ integer outputs

def test_integer_outputs_are_values_without_derivatives():
    op = ab.from_torch(lambda x: (x ** 3, torch.argmax(x, dim=-1), (x > 0).sum()))
    x = randn((3, 4))
    y, i, n = op(x)
    assert i.dtype == jnp.int64 and n.dtype == jnp.int64
    assert_tree_close((y, i, n), (x ** 3, np.argmax(x, -1), (x > 0).sum()))
    _, (dy, di, dn) = jax.jvp(op, (x,), (np.ones_like(x),))
    assert_close(dy, 3 * x ** 2) and di.dtype == dn.dtype == jax.dtypes.float0
    assert_close(jax.grad(lambda x: op(x)[0].sum())(x), 3 * x ** 2)
    assert_close(jax.hessian(lambda x: op(x)[0][0, 0])(x)[0, 0, 0, 0], 6 * x[0, 0])
    assert_tree_close(jax.vmap(op)(x), (x ** 3, np.argmax(x, -1), (x > 0).sum(-1)))
    assert ab.check(op, x).ok


# ---------------------------------------------------------------------- pytrees

def _torch_tree(d, *, k, scale):
    x, (y, n) = d["x"], d["pair"]
    return {"s": x * torch.cos(y) * k * scale, "t": [x.sum() ** 2, n + 1]}


def _jax_tree(d, *, k, scale):
    x, (y, n) = d["x"], d["pair"]
    return {"s": x * jnp.cos(y) * k * scale, "t": [x.sum() ** 2, n + 1]}


def test_pytrees_keyword_operands_and_static_keywords():
    op = ab.from_torch(_torch_tree)
    d = {"x": randn(3), "pair": (randn(3, seed=1), np.arange(2))}
    kw = dict(k=randn(3, seed=2), scale=2.0)
    assert_tree_close(op(d, **kw), _jax_tree(d, **kw))
    dd = tree_randn_like((d,), seed=3)
    assert_tree_close(jax.jvp(lambda d: op(d, **kw), (d,), dd),
                      jax.jvp(lambda d: _jax_tree(d, **kw), (d,), dd))
    ybar = tree_randn_like(_jax_tree(d, **kw), seed=4)
    assert_tree_close(jax.vjp(lambda d: op(d, **kw), d)[1](ybar),
                      jax.vjp(lambda d: _jax_tree(d, **kw), d)[1](ybar))
    batched = jax.tree.map(lambda a: np.stack([a, a + 1]), d)
    assert_tree_close(jax.vmap(lambda d: op(d, **kw))(batched),
                      jax.vmap(lambda d: _jax_tree(d, **kw))(batched))
    assert ab.check(op, d, **kw).ok


# ------------------------------------------------------------- transformations

def test_every_transformation_matches_jax():
    op = ab.from_torch(lambda x, y: torch.sin(x) * torch.exp(y))
    ref = lambda x, y: jnp.sin(x) * jnp.exp(y)
    x, y = randn(3), randn(3, seed=1)
    scalar = lambda f: lambda x: f(x, y).sum()
    for t in (jax.grad, jax.jacfwd, jax.jacrev, jax.hessian,
              lambda f: jax.jacfwd(jax.jacrev(f)), lambda f: jax.grad(jax.checkpoint(f))):
        assert_close(jax.jit(t(scalar(op)))(x), t(scalar(ref))(x))
    carry = lambda f: lambda c, x: (f(c, x), None)
    assert_close(jax.lax.scan(carry(op), x, np.stack([y, y]))[0],
                 jax.lax.scan(carry(ref), x, np.stack([y, y]))[0])
    cond = lambda f: lambda x: jax.lax.cond(x[0] > 0, lambda v: f(v, y), lambda v: -v, x)
    assert_close(jax.jit(jax.grad(lambda x: cond(op)(x).sum()))(x),
                 jax.grad(lambda x: cond(ref)(x).sum())(x))
    assert_close(jax.vmap(jax.grad(scalar(op)))(np.stack([x, y])),
                 jax.vmap(jax.grad(scalar(ref)))(np.stack([x, y])))
    lin = jax.linearize(lambda x: op(x, y), x)[1]
    assert_close(lin(y), jax.jvp(lambda x: ref(x, y), (x,), (y,))[1])


# ------------------------------------------------------------------ round trips

def test_round_trips_add_nothing():
    fn = lambda x: torch.tanh(x) * 2
    op = ab.from_torch(fn)
    assert op.torch is fn and ab.to_torch(op) is fn
    assert ab.from_torch(op) is op
    net = _mlp()
    mod = ab.from_torch(net)
    x = torch.from_numpy(randn((2, 3)))
    p = dict(net.state_dict())
    torch.testing.assert_close(mod.torch(p, x), net(x))
    # JAX code sent to torch and back is JAX's own: the op itself, no host call in it
    jax_fn = lambda x: jnp.tanh(x) * 2
    back = ab.from_torch(ab.to_torch(jax_fn))
    assert back.fn is jax_fn and back.traced
    assert "custom_call" not in jax.jit(back).lower(randn(3)).as_text()


# ---------------------------------------------------------- options and errors

def test_user_rules_override_the_derived_ones():
    op = ab.from_torch(lambda x: torch.sin(x))
    op.def_jvp(lambda p, t: 2 * t[0])  # host code: replaces torch.func.jvp
    x = randn(3)
    assert_close(jax.jvp(op, (x,), (np.ones(3),))[1], 2 * np.ones(3))
    assert_close(jax.grad(lambda x: op(x).sum())(x), np.cos(x))  # the vjp is still torch's


def test_vmap_modes():
    x = randn((4, 3))
    seq = ab.from_torch(lambda v: v * float(v.sum().item()), vmap="sequential",
                        shape=ab.like(0))  # .item() has no fake value to infer with
    assert_close(jax.vmap(seq)(x), x * x.sum(1, keepdims=True))
    calls = []

    def rule(axis_size, in_batched, v):
        calls.append(axis_size)
        return v * 3, True
    ruled = ab.from_torch(lambda v: v * 3, vmap=rule)
    assert_close(jax.vmap(ruled)(x), 3 * x) and calls == [4]
    assert_close(jax.vmap(jax.grad(lambda v: ruled(v).sum()))(x), 3 * np.ones_like(x))


def test_shape_is_inferred_or_given():
    op = ab.from_torch(lambda x: x.reshape(-1)[:2].to(torch.float32))
    assert jax.eval_shape(op, jax.ShapeDtypeStruct((3, 2), jnp.float64)) == \
        jax.ShapeDtypeStruct((2,), jnp.float32)
    nz = ab.from_torch(lambda x: torch.nonzero(x), name="nonzero")
    with pytest.raises(TypeError, match=r"nonzero.*fake tensors.*Give shape="):
        nz(np.ones(3))
    given = ab.from_torch(lambda x: torch.nonzero(x)[:, 0],
                          shape=lambda x: jax.ShapeDtypeStruct((3,), jnp.int64))
    np.testing.assert_array_equal(given(np.ones(3)), np.arange(3))


def test_writing_into_an_input_acts_on_a_private_copy():
    """torch2jax's out-of-place semantics: x.mul_(2) is 2x, and the JAX array stays."""
    op = ab.from_torch(lambda x: x.mul_(2), name="in_place")
    x = jnp.asarray(randn((3,)))
    kept = np.array(x)
    assert_close(op(x), 2 * kept)
    assert_close(jax.jit(op)(x), 2 * kept)
    np.testing.assert_array_equal(np.asarray(x), kept)


def test_export_is_a_clear_error():
    op = ab.from_torch(torch.sin, name="tsin", mode="call")  # (mode="auto" translates it)
    with pytest.raises(ValueError, match=r"tsin.*Python host code.*jax.export cannot"):
        jax.export.export(jax.jit(op))(jax.ShapeDtypeStruct((3,), jnp.float64))


@pytest.mark.slow  # starts a process
def test_importing_anybind_imports_no_torch():
    proc = run_fresh_python("""
        import sys, anybind as ab
        assert "torch" not in sys.modules and "from_torch" in dir(ab)
    """)
    assert proc.returncode == 0, proc.stderr


def test_docstring_examples():
    import doctest

    from anybind.torch import _bridges
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for fn in (_bridges.from_torch, _bridges.to_torch):
        with jax.enable_x64(False):
            result = runner.run(doctest.DocTestParser().get_doctest(
                fn.__doc__, {}, fn.__name__, None, 0))
        assert result.attempted > 0 and result.failed == 0, fn.__name__
