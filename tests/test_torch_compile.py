"""op.torch under torch.compile(fullgraph=True): the forward, and how derivatives behave.

Dynamo sees op.torch as one opaque call (``nonstrict_trace``) and AOTAutograd
traces it with fake tensors: the host code is the ``anybind::run`` library op,
whose fake implementation comes from the output spec. References: eager op.torch
and torch's own functions.
"""
import pytest
import torch

import anybind as ab
import anybind.torch  # noqa: F401  (dynamo does not trace the front end's first import)
from helpers import randn, to_torch
from ops import mul, sincos, sort, tree

# torch.compile on CPython 3.13.0 exactly warns that its guards may run slower there (an
# interpreter bug fixed in 3.13.1): a notice about the interpreter, not about this code
pytestmark = pytest.mark.filterwarnings(
    "ignore:Guards may run slower on Python 3.13.0:RuntimeWarning")

# the backend that runs AOTAutograd's graphs without code generation: what is tested is
# the capture (fullgraph) and the derivatives, not inductor's kernels
BACKEND = "aot_eager"


def compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, fullgraph=True, backend=BACKEND)


def test_forward_compiles_fullgraph():
    op, (sin, cos) = mul("vectorized"), sincos("vectorized", "jvp")
    x1, x2 = to_torch((randn(3), randn(3, seed=1)))
    f = compiled(lambda a, b: op.torch(a, b) * sin.torch(a) + cos.torch(b))
    torch.testing.assert_close(f(x1, x2), x1 * x2**2 * torch.sin(x1) + torch.cos(x2))
    s, t = sort("vectorized"), tree("vectorized")
    vals, ind = compiled(s.torch)(x1)
    assert torch.equal(ind, torch.sort(x1, stable=True).indices)
    d = to_torch({"a": randn((2, 3)), "b": randn((2, 3), seed=2)})
    got = compiled(lambda d: t.torch(d))(d)
    torch.testing.assert_close(got[0], d["a"] * torch.sin(d["b"]))
    # static keywords and keyword operands are part of the graph's constants and inputs
    from ops import scale
    sc = scale("vectorized")
    w = torch.from_numpy(randn((2, 3), seed=3))
    got = compiled(lambda x, w: sc.torch(x, w=w, power=3, axis=-1))(d["a"], w)
    torch.testing.assert_close(got, (w * d["a"] ** 3).sum(-1))


def test_backward_of_a_compiled_forward():
    """AOTAutograd traces the rules too: .backward() of a compiled function works."""
    op = mul("vectorized")
    sin, cos = sincos("vectorized", "vjp")
    f = compiled(lambda a, b: (op.torch(a, b) * sin.torch(a)).sum())
    a, b = (t.requires_grad_() for t in to_torch((randn(3), randn(3, seed=1))))
    f(a, b).backward()
    ad, bd = a.detach(), b.detach()
    torch.testing.assert_close(a.grad, bd**2 * torch.sin(ad) + ad * bd**2 * torch.cos(ad))
    torch.testing.assert_close(b.grad, 2 * ad * bd * torch.sin(ad))


def test_torch_func_inside_compile():
    """grad, hessian and vmap inside the compiled function (traced rules: every order)."""
    sin, _ = sincos("vectorized", "jvp")
    x = torch.from_numpy(randn(3))
    g = compiled(torch.func.grad(lambda v: sin.torch(v).sum()))
    torch.testing.assert_close(g(x), torch.cos(x))
    h = compiled(torch.func.hessian(lambda v: sin.torch(v).sum()))
    torch.testing.assert_close(h(x), torch.diag(-torch.sin(x)))
    v = compiled(torch.vmap(sin.torch))
    xs = torch.from_numpy(randn((2, 3), seed=1))
    torch.testing.assert_close(v(xs), torch.sin(xs))


def test_double_backward_through_a_compiled_region_is_torchs_limit():
    """Documented: AOTAutograd's compiled backward cannot be differentiated again; the
    error is torch's, raised, never a wrong number. Second derivatives go inside."""
    sin, _ = sincos("vectorized", "jvp")
    f = compiled(lambda v: sin.torch(v).sum())
    a = torch.from_numpy(randn(3)).requires_grad_()
    (g,) = torch.autograd.grad(f(a), a, create_graph=True)
    torch.testing.assert_close(g, torch.cos(a.detach()))
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(g.sum(), a)


def test_traced_outputs_that_alias_an_input():
    """A traced op returning its input as-is, or a view of it, with a rule: a library
    op's outputs may alias nothing, so the run copies them (as XLA's buffers are)."""
    ident = ab.bind(lambda x: x, traced=True, name="compiled_identity")
    ident.def_vjp(lambda p, ct: (ct,), traced=True)
    row = ab.bind(lambda x: x[0], traced=True, name="compiled_row")
    row.def_jvp(lambda p, t: t[0][0], traced=True)
    x = torch.from_numpy(randn((2, 3)))
    torch.testing.assert_close(compiled(lambda v: 2 * ident.torch(v))(x), 2 * x)
    torch.testing.assert_close(compiled(lambda v: 2 * row.torch(v))(x), 2 * x[0])
    a = x.clone().requires_grad_()
    compiled(lambda v: (ident.torch(v) * row.torch(v)).sum())(a).backward()
    want = x[0].expand(2, 3).clone()
    want[0] += x.sum(0)
    torch.testing.assert_close(a.grad, want)
