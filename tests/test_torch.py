"""op.torch: every test op as a PyTorch operation, under autograd and torch.func.

Values against the pure-JAX references of ``ops.py``; jvp (torch.func.jvp)
against central differences of op.torch itself; vjp, ``.backward()`` and
``torch.autograd.grad`` against the jvp by ⟨ȳ, J·ẋ⟩ = ⟨x̄, ẋ⟩ (torch's
conjugate pairing); vmap against a loop; higher orders of the sin/cos pair
(traced rules calling each other) against torch's own sin and cos.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import check_torch_first_order, randn, to_torch, torch_inner, torch_randn_like
from ops import CASES, LINEAR_CASES, VMAP_MODES, mul, sincos, sort

# every test op; the traced axpy ops' function is jax.numpy code, which runs by JAX
TORCH_CASES = {**CASES, **LINEAR_CASES}


def _floats(tree):
    return [l for l in jax.tree.leaves(tree) if l.is_floating_point() or l.is_complex()]


def _case_fn(case, mode):
    """op.torch with the case's keywords bound, and its positional arguments, as torch."""
    op, kw = case.make(mode), to_torch(case.kwargs())
    return (lambda *a: op.torch(*a, **kw)), to_torch(case.args())


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", TORCH_CASES)
def test_values_match_reference(name, mode):
    case = TORCH_CASES[name]
    f, args = _case_fn(case, mode)
    got, want = f(*args), case.reference()(*case.args())
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(g, torch.Tensor) and g.numpy().dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", TORCH_CASES)
def test_first_order(name):
    f, args = _case_fn(TORCH_CASES[name], "vectorized")
    check_torch_first_order(f, args)


# forward AD with dual tensors (torch.autograd.forward_ad), outside torch.func: the
# rules, host or traced, see plain primals, and the tangents are torch.func.jvp's
@pytest.mark.parametrize("name", TORCH_CASES)
def test_dual_tensors_match_func_jvp(name):
    import torch.autograd.forward_ad as fwAD
    f, args = _case_fn(TORCH_CASES[name], "vectorized")
    is_float = lambda t: t.is_floating_point() or t.is_complex()
    full = jax.tree.map(lambda t, d: torch.zeros_like(t) if d is None else d, args,
                        torch_randn_like(args, 3), is_leaf=lambda x: x is None)
    want = torch.func.jvp(f, args, full)[1]
    with fwAD.dual_level():
        duals = jax.tree.map(lambda t, d: fwAD.make_dual(t, d) if is_float(t) else t,
                             args, full)
        got = [fwAD.unpack_dual(o).tangent for o in _floats(f(*duals))]
    for g, w in zip(got, _floats(want), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", TORCH_CASES)
def test_vmap_matches_loop(name, mode):
    case = TORCH_CASES[name]
    f, _ = _case_fn(case, mode)
    batched = to_torch(case.batched_args(3))
    got = torch.vmap(f)(*batched)
    for b in range(3):
        row = f(*jax.tree.map(lambda x: x[b], batched))
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(row), strict=True):
            torch.testing.assert_close(g[b], r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_axes_unbatched_and_nested(mode):
    """in_dims at 1 and None, out_dims 1, and vmap of vmap against the JAX reference."""
    op = mul(mode)
    x1, x2 = randn((4, 3)), randn((4,), seed=1)
    got = torch.vmap(op.torch, in_dims=(1, None), out_dims=1)(*to_torch((x1, x2)))
    np.testing.assert_allclose(got.numpy(), x1 * x2[:, None] ** 2, rtol=1e-12)
    y1, y2 = randn((2, 3, 4), seed=2), randn((3, 4), seed=3)
    nested = torch.vmap(torch.vmap(op.torch, in_dims=(0, 0)), in_dims=(0, None))
    np.testing.assert_allclose(nested(*to_torch((y1, y2))).numpy(), y1 * y2 ** 2, rtol=1e-12)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", ["mul", "sin", "matvec", "tree", "scale", "sort"])
def test_derivatives_of_vmap_and_vmap_of_derivatives(name, mode):
    """vmap never removes a rule: grad of vmap = vmap of grad = a loop; jacrev = jacfwd."""
    case = TORCH_CASES[name]
    f, args = _case_fn(case, mode)
    batched = to_torch(case.batched_args(2))
    s = lambda *a: sum((o * o).sum() for o in _floats(f(*a)))
    argnums = tuple(range(len(args)))
    per_row = torch.vmap(torch.func.grad(s, argnums=argnums))(*batched)
    of_vmap = torch.func.grad(lambda *a: torch.vmap(s)(*a).sum(), argnums=argnums)(*batched)
    for b in range(2):
        row = torch.func.grad(s, argnums=argnums)(*jax.tree.map(lambda x: x[b], batched))
        for p, q, r in zip(_floats(per_row), _floats(of_vmap), _floats(row), strict=True):
            torch.testing.assert_close(p[b], r, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(q[b], r, rtol=1e-12, atol=1e-12)
    rev, fwd = torch.func.jacrev(s, argnums=argnums)(*args), \
        torch.func.jacfwd(s, argnums=argnums)(*args)
    for p, q in zip(_floats(rev), _floats(fwd), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


ONE_ARGUMENT = [n for n, c in TORCH_CASES.items() if len(c.args()) == 1]


def _summed_jacobian(jacfwd, fn, floats, cast):
    """v ↦ Σ jacfwd(u ↦ 0.7·Re f(cast(u)))(v), over the floating outputs."""
    def s(v):
        jac = jacfwd(lambda u: [0.7 * o.real for o in floats(fn(cast(u)))])(v)
        return sum(j.sum() for j in jax.tree.leaves(jac))
    return s


# ops whose jvp rule is host code and depends on x: a second derivative raises
HOST_SECOND_ORDER = ("sort", "tree", "scale")


# grad of vmap of jacfwd: the tangents the outer grad leaves unset reach the op's
# forward mode as torch's ZeroTensors, which hold no data for host code to view;
# against JAX's grad of vmap of jacfwd of the reference (in a real input: torch's
# jacfwd takes no complex one)
@pytest.mark.parametrize("name", ONE_ARGUMENT)
def test_grad_of_vmap_of_jacfwd(name):
    case = TORCH_CASES[name]
    f, _ = _case_fn(case, "vectorized")
    (xs,) = case.batched_args(2)
    cplx = any(np.iscomplexobj(x) for x in jax.tree.leaves(xs))
    xs = jax.tree.map(np.real, xs)
    s = _summed_jacobian(torch.func.jacfwd, f, _floats,
                         (lambda u: u.to(torch.complex128)) if cplx else (lambda u: u))
    run = lambda: torch.func.grad(lambda v: torch.vmap(s)(v).sum())(to_torch(xs))
    if name in HOST_SECOND_ORDER:
        with pytest.raises(ab.MissingRuleError, match=rf"'{name}_vectorized'.*differentiates "
                                                      rf"its jvp rule, which is host code"):
            run()
        return
    got = run()
    s_ref = _summed_jacobian(
        jax.jacfwd, case.reference(),
        lambda out: [o for o in jax.tree.leaves(out) if jnp.issubdtype(o.dtype, jnp.inexact)],
        (lambda u: u.astype(jnp.complex128)) if cplx else (lambda u: u))
    want = jax.grad(lambda v: jax.vmap(s_ref)(v).sum())(xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- higher orders

def _sc(sin, cos):
    return lambda x: (sin.torch(x) * cos.torch(2 * x) + sin.torch(x) ** 2).sum()


def _sc_ref(x):
    return (torch.sin(x) * torch.cos(2 * x) + torch.sin(x) ** 2).sum()


def _double_backward(f):
    def run(x):
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        return torch.stack([torch.autograd.grad(g[i], x, retain_graph=True)[0]
                            for i in range(len(x))])
    return run


SECOND = {
    "hessian": torch.func.hessian,
    "jacfwd_jacrev": lambda f: torch.func.jacfwd(torch.func.jacrev(f)),
    "jacrev_jacfwd": lambda f: torch.func.jacrev(torch.func.jacfwd(f)),
    "jacrev_jacrev": lambda f: torch.func.jacrev(torch.func.jacrev(f)),
    "double_backward": _double_backward,
    "vmap_hessian": lambda f: (lambda x: torch.vmap(torch.func.hessian(f))(
        torch.stack([x, 2 * x]))),
    "hessian_of_vmap": lambda f: torch.func.hessian(
        lambda x: torch.vmap(f)(torch.stack([x, 2 * x])).sum()),
    "third_fwd": lambda f: torch.func.jacfwd(torch.func.hessian(f)),
    "jacfwd_jacfwd": lambda f: torch.func.jacfwd(torch.func.jacfwd(f)),
    "third_rev": lambda f: torch.func.jacrev(torch.func.jacrev(torch.func.grad(f))),
}
MATRIX = [(r, m, t) for r in ("jvp", "vjp", "both") for m in VMAP_MODES for t in SECOND
          if m == "vectorized" or t in ("hessian", "vmap_hessian")]


@pytest.mark.parametrize("rules,mode,transform", MATRIX)
def test_sin_cos_every_order(rules, mode, transform):
    """Traced rules that call the other op run on torch tensors: all orders, as in JAX."""
    sin, cos = sincos(mode, rules)
    x = torch.from_numpy(randn(3))
    t = SECOND[transform]
    torch.testing.assert_close(t(_sc(sin, cos))(x), t(_sc_ref)(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rules", ["jvp", "vjp", "both"])
def test_sin_cos_gradcheck_gradgradcheck(rules):
    sin, cos = sincos("vectorized", rules)
    x = torch.from_numpy(randn(3)).requires_grad_()
    f = lambda x: sin.torch(x) * cos.torch(x)
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
    ggg = torch.func.jvp(torch.func.grad(torch.func.grad(lambda x: sin.torch(x).sum())),
                         (x.detach()[0],), (torch.tensor(1.0, dtype=torch.float64),))[1]
    torch.testing.assert_close(ggg, -torch.cos(x.detach()[0]))


@pytest.mark.parametrize("name", ["mul", "matvec", "fft", "tree", "split", "axpy_host"])
def test_gradcheck_first_order(name):
    case = TORCH_CASES[name]
    f, args = _case_fn(case, "vectorized")
    leaves, tree = jax.tree.flatten(args)
    leaves = [l.requires_grad_() for l in leaves]
    g = lambda *ls: tuple(jax.tree.leaves(f(*jax.tree.unflatten(tree, ls))))
    assert torch.autograd.gradcheck(g, tuple(leaves))


def test_linear_ops_every_order():
    """linear=True with a host transpose: the transpose of the transpose is the op, so
    double backward and gradgradcheck work although the rules are host code."""
    f, (x,) = _case_fn(TORCH_CASES["fft"], "vectorized")
    x = x.requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: f(x), (x,))
    ref = torch.func.vjp(torch.fft.fft, x.detach())[1]
    y = torch.from_numpy(randn(4, np.complex128, seed=5))
    torch.testing.assert_close(torch.func.vjp(f, x.detach())[1](y)[0], ref(y)[0])


def test_host_rules_higher_order_raise_naming_the_rule():
    op = mul("vectorized")
    x = torch.from_numpy(randn(3))
    s = lambda a: op.torch(a, x).sum()
    with pytest.raises(ab.MissingRuleError, match=r"mul_vectorized.*vjp rule.*host code"):
        torch.func.hessian(s)(x)
    with pytest.raises(ab.MissingRuleError, match=r"mul_vectorized.*jvp rule.*host code"):
        torch.func.jacfwd(torch.func.jacfwd(s))(x)
    with pytest.raises(ab.MissingRuleError, match=r"mul_vectorized.*vjp rule.*host code"):
        _double_backward(s)(x)
    a = x.clone().requires_grad_()
    with pytest.raises(ab.MissingRuleError, match=r"mul_vectorized.*vjp rule"):
        torch.autograd.gradgradcheck(lambda v: op.torch(v, x), (a,))
    # the vjp rule's derivative in its cotangent is the jvp rule (the double-backward
    # trick for forward mode): that one works
    ybar = torch.from_numpy(randn(3, seed=1)).requires_grad_()
    (g,) = torch.autograd.grad(op.torch(a, x), a, ybar, create_graph=True)
    v = torch.from_numpy(randn(3, seed=2))
    (jv,) = torch.autograd.grad(g, ybar, v)
    torch.testing.assert_close(jv, torch.func.jvp(lambda u: op.torch(u, x), (x,), (v,))[1])


def test_missing_rules_raise_never_zeros():
    only_vjp = ab.bind(np.sin, shape=ab.like(0), name="sin_only_vjp",
                       vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    only_jvp = ab.bind(np.sin, shape=ab.like(0), name="sin_only_jvp",
                       jvp=lambda p, t: np.cos(p[0]) * t[0])
    x = torch.from_numpy(randn(3))
    with pytest.raises(ab.MissingRuleError, match="sin_only_vjp.*no jvp rule"):
        torch.func.jvp(only_vjp.torch, (x,), (torch.ones(3, dtype=torch.float64),))
    with pytest.raises(ab.MissingRuleError, match="sin_only_jvp.*no vjp rule"):
        torch.func.grad(lambda x: only_jvp.torch(x).sum())(x)
    with pytest.raises(ab.MissingRuleError, match="sin_only_jvp.*no vjp rule"):
        only_jvp.torch(x.clone().requires_grad_()).sum().backward()
    torch.testing.assert_close(torch.func.grad(lambda x: only_vjp.torch(x).sum())(x),
                               torch.cos(x))
    torch.testing.assert_close(torch.func.jvp(only_jvp.torch, (x,), (x,))[1], torch.cos(x) * x)


def test_fwd_bwd_residuals_and_traced_linear_op():
    calls = []

    def fwd(x):
        calls.append("fwd")
        e = np.exp(x)
        return e, e

    op = ab.bind(np.exp, shape=ab.like(0), name="exp_fwd_bwd",
                 jvp=lambda p, t: np.exp(p[0]) * t[0])
    op.def_fwd(fwd, residuals=ab.like(0))
    op.def_bwd(lambda e, ct: (e * ct,))
    x = torch.from_numpy(randn(3)).requires_grad_()
    op.torch(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.exp(x.detach()))
    assert calls == ["fwd"]
    torch.testing.assert_close(torch.func.grad(lambda v: op.torch(v).sum())(x.detach()),
                               torch.exp(x.detach()))
    check_torch_first_order(op.torch, (x.detach(),))
    # a traced linear op written with plain arithmetic: torch differentiates it to every order
    double = ab.bind(lambda v: 2 * v, linear=True, traced=True, name="double_traced")
    torch.testing.assert_close(torch.func.grad(lambda v: double.torch(v).sum())(x.detach()),
                               torch.full((3,), 2.0, dtype=torch.float64))
    double.def_transpose(lambda ct: (2 * ct,), traced=True)
    check_torch_first_order(double.torch, (x.detach(),))


def test_keyword_operand_is_not_differentiable():
    f, (x,) = _case_fn(TORCH_CASES["scale"], "vectorized")
    op = TORCH_CASES["scale"].make("vectorized")
    w = torch.from_numpy(randn((2, 3), seed=4)).requires_grad_()
    y = op.torch(x, w=w, power=3, axis=-1)
    with pytest.raises(TypeError, match=r"scale_vectorized.*keyword argument \['w'\].*"
                                        r"non-differentiable"):
        y.sum().backward()
    with pytest.raises(TypeError, match=r"keyword argument \['w'\].*non-differentiable"):
        torch.func.jvp(lambda w: op.torch(x, w=w, power=3, axis=-1), (w.detach(),),
                       (torch.ones_like(w),))


def test_cpu_tensors_reach_host_code_without_copies():
    seen = {}

    def fn(x, *, w):
        seen["x"], seen["w"] = x.ctypes.data, w.ctypes.data
        seen["writeable"] = x.flags.writeable
        return x * w

    op = ab.bind(fn, shape=ab.like(0), name="zero_copy", vjp=lambda p, ct, w: (w * ct,))
    x, w = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
    op.torch(x, w=w)
    assert seen == {"x": x.data_ptr(), "w": w.data_ptr(), "writeable": False}
    x.requires_grad_()
    op.torch(x, w=w).sum().backward()  # through autograd too
    assert seen["x"] == x.data_ptr()
    t = x.detach().t()  # a strided view is seen as one, not copied
    op.torch(t, w=w.t())
    assert seen["x"] == t.data_ptr()


def test_functional_call_of_a_module():
    op = mul("vectorized")

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.from_numpy(randn(3, seed=6)))

        def forward(self, x):
            return op.torch(x, self.w).sum()

    m, x = Scale(), torch.from_numpy(randn(3, seed=7))
    params = {"w": torch.from_numpy(randn(3, seed=8))}
    g = torch.func.grad(lambda p: torch.func.functional_call(m, p, (x,)))(params)
    torch.testing.assert_close(g["w"], 2 * x * params["w"])
    m(x).backward()
    torch.testing.assert_close(m.w.grad, 2 * x * m.w.detach())


def test_pytrees_and_static_keywords_match_jax():
    op = TORCH_CASES["tree"].make("vectorized")
    d = {"a": randn((2, 3), seed=1), "b": randn((2, 3), seed=2)}
    got = op.torch(to_torch(d))
    want = op(d)
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-12)
    s = sort("vectorized")
    vals, idx = s.torch(torch.from_numpy(randn(5)))
    assert idx.dtype == torch.int64 and not idx.requires_grad


def test_errors():
    bad = ab.bind(lambda x: x[:2], shape=ab.like(0), name="bad_shape")
    with pytest.raises(ab.HostError, match=r"bad_shape.*shape \(2,\).*declared shape \(3,\)"):
        bad.torch(torch.ones(3))
    jnp_rule = ab.bind(np.sin, shape=ab.like(0), name="jnp_rule",
                       jvp=lambda p, t: jax.numpy.cos(p[0]) * t[0], traced=False)
    jnp_rule.def_jvp(lambda p, t: jax.numpy.cos(p[0]) * t[0], traced=True)
    with pytest.raises(TypeError, match=r"(?s)jnp_rule.*jvp rule.*plain array arithmetic and "
                                        r"bound ops"):
        torch.func.jvp(jnp_rule.torch, (torch.ones(3),), (torch.ones(3),))
    with pytest.raises(ab.HostError, match=r"bad_shape.*shape \(2,\) and dtype bfloat16"):
        bad.torch(torch.ones(3, dtype=torch.bfloat16))  # bfloat16 is viewed like any dtype
    with pytest.raises(TypeError, match=r"bad_shape.*must be a torch tensor"):
        bad.torch("x")


def test_in_place_functions_and_symbolic_zeros():
    """out=True functions write into the output tensors' memory; symbolic_zeros rules get
    None for a zero cotangent and ``needs`` for what is asked."""
    def fn(x1, x2, *, out):
        np.multiply(x1, x2 * x2, out=out)

    seen = []

    def vjp(p, ct, needs):
        seen.append(needs)
        return (p[1] ** 2 * ct if needs[0] else None, 2 * p[0] * p[1] * ct if needs[1] else None)

    op = ab.bind(fn, shape=ab.like(0), out=True, vmap="vectorized", name="mul_inplace",
                 jvp=lambda p, t: p[1] ** 2 * t[0] + 2 * p[0] * p[1] * t[1])
    op.def_vjp(vjp, symbolic_zeros=True)
    x1, x2 = to_torch((randn(3), randn(3, seed=1)))
    torch.testing.assert_close(op.torch(x1, x2), x1 * x2**2)
    torch.testing.assert_close(torch.vmap(op.torch)(x1[:, None], x2[:, None])[:, 0], x1 * x2**2)
    g = torch.func.grad(lambda a: op.torch(a, x2).sum())(x1)
    torch.testing.assert_close(g, x2**2)
    assert seen[-1] == (True, False)
    check_torch_first_order(op.torch, (x1, x2))


def test_unsupported_kinds_of_op_raise():
    mlin = ab.bind(lambda x, y: x * y, shape=ab.like(0), multilinear=True, name="mlin",
                   transpose=(lambda p, ct: p[1] * ct, lambda p, ct: p[0] * ct))
    with pytest.raises(NotImplementedError, match="mlin.*multilinear"):
        mlin.torch(torch.ones(2), torch.ones(2))


def test_jax_calls_are_unchanged_after_torch_use():
    """A bound op dispatches on torch tensors only; JAX arrays still go to JAX."""
    op = mul("vectorized")
    op.torch(torch.ones(2), torch.ones(2))
    out = jax.jit(op)(np.ones(2), np.full(2, 3.0))
    assert isinstance(out, jax.Array)
    np.testing.assert_allclose(out, np.full(2, 9.0))


def test_transpose_identity_of_backward_for_complex_ops():
    """torch's gradients of a complex linear map are conjugated: x̄ = Aᴴ·ȳ."""
    f, (x,) = _case_fn(TORCH_CASES["fft"], "vectorized")
    dx = torch_randn_like((x,), 3)[0]
    ybar = torch_randn_like((x,), 4)[0]
    _, jdx = torch.func.jvp(f, (x,), (dx,))
    xbar = torch.func.vjp(f, x)[1](ybar)[0]
    np.testing.assert_allclose(torch_inner(ybar, jdx), torch_inner(xbar, dx), rtol=1e-10)


@pytest.mark.parametrize("name", ["mul", "sin", "fft", "sort", "tree", "scale"])
def test_ab_check_runs_the_checks_through_torch(name):
    case = TORCH_CASES[name]
    report = ab.check(case.make("vectorized"), *case.args(), torch=True, **case.kwargs())
    rows = {r.check: r.status for r in report.rows if r.check.startswith("torch")}
    assert {"torch eager", "torch vjp", "torch jvp", "torch vmap"} <= set(rows), rows
    assert all(s in ("ok", "skipped") for s in rows.values()), str(report)
    if name in ("sin", "cos"):
        assert rows["torch 2nd order"] == "ok"


def test_ab_check_torch_side_names_a_rule_that_fails_on_torch():
    op = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="sin_jnp_jvp")
    op.def_jvp(lambda p, t: jax.numpy.cos(p[0]) * t[0], traced=True)
    with pytest.raises(ab.RuleError) as e:
        ab.check(op, randn(3), torch=True)
    assert e.value.check == "torch jvp" and "jvp rule" in str(e.value)
    assert [r.status for r in e.value.report.rows if not r.check.startswith("torch ")] \
        == ["ok"] * len([r for r in e.value.report.rows if not r.check.startswith("torch ")])


def test_command_line_check_through_torch(tmp_path, capsys):
    from anybind.cli import _main as _cli
    (tmp_path / "torch_ops.py").write_text(
        "import numpy as np, anybind as ab\n"
        "mul = ab.bind(lambda a, b: a * b**2, shape=ab.like(0), vmap='vectorized', name='mul',\n"
        "              jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],\n"
        "              vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct),\n"
        "              examples=lambda: ((np.ones(3), np.full(3, 2.0)), {}))\n")
    assert _cli.main(["check", str(tmp_path / "torch_ops.py"), "--x64", "--torch"]) == 0
    out = capsys.readouterr().out
    assert "torch vjp" in out and "torch vmap" in out


def test_docstring_examples():
    import doctest

    from anybind.torch._front import TorchOp
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner()
    for name, doc in [("Op.torch", ab.Op.torch.__doc__), ("TorchOp", TorchOp.__doc__)]:
        result = runner.run(parser.get_doctest(doc, {}, name, None, 0))
        assert result.attempted > 0 and result.failed == 0, name
