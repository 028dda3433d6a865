"""PyTorch's ``test/functorch/test_eager_transforms.py`` (pytorch/pytorch), classes
TestAutogradFunction and TestAutogradFunctionVmapAPI, rewritten for anybind ops
used through ``op.torch``.

How a case translates: the autograd.Function becomes an op whose rules do what
the staticmethods do (``backward`` → vjp rule, ``jvp`` → jvp rule, ``vmap`` →
vmap rule with the batch axis at 0 and ``in_batched`` for ``in_dims``);
``ctx.set_materialize_grads(False)`` and ``ctx.needs_input_grad`` become a
``symbolic_zeros=True`` rule, which gets ``None`` for zero cotangents and
``needs``. What PyTorch refuses and anybind does on purpose (vmap without a vmap
rule, keyword tensors, a vmap rule on an op that torch.vmap could batch itself)
asserts anybind's numbers instead; ``save_for_backward``/``mark_dirty`` have no
counterpart (anybind keeps what its rules need, and has no in-place ops).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import anybind as ab

pytestmark = pytest.mark.slow  # a ported suite: PyTorch's own autograd tests

F = torch.func


def _t(*values):
    return torch.tensor(values if len(values) != 1 else values[0], dtype=torch.float64)


# ------------------------------------------------------------ TestAutogradFunction

# ports test_unwrap_dead_wrappers: a tensor that escaped a torch.func transform (a dead
# wrapper) is an ordinary tensor to op.torch, alone or among live ones
def test_unwrap_dead_wrappers():
    op = ab.bind(lambda x, y: x * y, shape=ab.like(0), name="dead_mul",
                 vjp=lambda p, ct: (ct * p[1], ct * p[0]))
    escaped = []

    def f(x):
        escaped.append(x)
        return (x**2).sum()

    base = torch.from_numpy(np.arange(1.0, 4.0))
    F.grad(f)(base)
    dead = escaped[0]
    assert torch._C._functorch.is_dead_tensor_wrapper(dead)
    live = base + 1
    for args in ((dead, live), (live, dead), (dead, dead)):
        want = torch.mul(*[base if a is dead else a for a in args])
        torch.testing.assert_close(op.torch(*args), want)
    torch.testing.assert_close(F.grad(lambda v: op.torch(v, dead).sum())(live), base)
    torch.testing.assert_close(F.grad(lambda v: op.torch(dead, v).sum())(live), base)


# ports test_set_materialize_grads: a cotangent nobody sent arrives as None
# (symbolic_zeros=True), the one that flows arrives as a tensor, at every order
def test_set_materialize_grads():
    seen = []

    def vjp(p, ct, needs):
        gx, gy = ct
        seen.append((gx is not None, gy is None))
        return gx, gy

    pair = ab.bind(lambda x, y: (np.copy(x), np.copy(y)), shape=lambda x, y: (x, y),
                   name="materialize_pair")
    pair.def_vjp(vjp, traced=True, symbolic_zeros=True)

    def f(y, x):
        x, y = pair.torch(x, y)
        return x**2

    x, y = _t(2.0), _t(3.0)
    torch.testing.assert_close(F.grad(f)(y, x), _t(0.0))
    torch.testing.assert_close(F.grad(f, argnums=1)(y, x), 2 * x)
    torch.testing.assert_close(F.grad(F.grad(f, argnums=1), argnums=1)(y, x), _t(2.0))
    assert seen and all(a and b for a, b in seen)


def _identity(fn_kind: str, save_for: str):
    """x ↦ x, as host code (which op.torch copies) or traced code (which returns x
    itself), with only a jvp rule (save_for="jvp") or only a vjp rule ("vjp")."""
    if fn_kind == "host":
        op = ab.bind(lambda x: x, shape=ab.like(0), name=f"returns_input_host_{save_for}")
    else:
        op = ab.bind(lambda x: x, traced=True, name=f"returns_input_traced_{save_for}")
    if save_for == "jvp":
        op.def_jvp(lambda p, t: t[0], traced=True)
    else:
        op.def_vjp(lambda p, ct: (ct,), traced=True)
    return op


def _returns_input_case(op, transform, inner_requires_grad):
    a = torch.tensor(2.0, dtype=torch.float64, requires_grad=inner_requires_grad)
    a_t = torch.tensor(3.0, dtype=torch.float64, requires_grad=inner_requires_grad)
    fn = lambda x: op.torch(x.clone())
    if transform == "grad":
        torch.testing.assert_close(F.grad(fn)(a), _t(1.0))
    elif transform == "jvp":
        out, tangent = F.jvp(fn, (a,), (a_t,))
        torch.testing.assert_close((out, tangent), (a.detach(), a_t.detach()))
    elif transform == "apply":
        a = a.clone()
        b = op.torch(a)
        torch.testing.assert_close(b.detach(), a.detach())
        if inner_requires_grad:
            torch.testing.assert_close(torch.autograd.grad(b, a)[0], _t(1.0))
    else:
        with fwAD.dual_level():
            out = fwAD.unpack_dual(op.torch(fwAD.make_dual(a.clone(), a_t.clone())))
        torch.testing.assert_close(out.tangent, a_t.detach())


def _returns_input_params():
    out = []
    for irg in (True, False):
        for save_for in ("jvp", "vjp"):
            for fn_kind in ("host", "traced"):
                for transform in ("grad", "jvp", "apply", "dual"):
                    marks = [pytest.mark.timeout(60)] if transform == "dual" else []
                    out.append(pytest.param(irg, save_for, fn_kind, transform, marks=marks))
    return out


# ports test_function_returns_input (inner_requires_grad × save_for; its save_tensors
# and mark_dirty have no counterpart): where PyTorch refuses an input returned as-is
# and saved, anybind's identity op works under every transform, host or traced
@pytest.mark.parametrize("inner_requires_grad,save_for,fn_kind,transform",
                         _returns_input_params())
def test_function_returns_input(inner_requires_grad, save_for, fn_kind, transform):
    _returns_input_case(_identity(fn_kind, save_for), transform, inner_requires_grad)


# ports test_needs_input_grads: grad differentiates in argument 0 only, and the rule
# is told so (needs, symbolic_zeros=True), also under grad of grad
def test_needs_input_grads():
    seen = []

    def vjp(p, ct, needs):
        seen.append(tuple(needs))
        return None, None

    op = ab.bind(lambda x, y: x * y, shape=ab.like(0), name="needs_mul")
    op.def_vjp(vjp, traced=True, symbolic_zeros=True)
    x, y = _t(2.0), _t(3.0)
    torch.testing.assert_close(F.grad(op.torch)(x, y), _t(0.0))
    torch.testing.assert_close(F.grad(F.grad(op.torch))(x, y), _t(0.0))
    assert seen and set(seen) == {(True, False)}


def _numpy_cube_not_composable():
    """NumpyCubeNotComposable: host code whose backward is host code too (the
    counterpart of @once_differentiable): first derivatives only."""
    return ab.bind(lambda x: x**3, shape=ab.like(0), name="cube_not_composable",
                   vjp=lambda p, ct: (3 * p[0] ** 2 * ct,))


# ports test_once_differentiable_autograd_vjp: regular autograd over torch.func.vjp;
# differentiating the host backward raises, naming it (PyTorch: "marked with
# @once_differentiable")
def test_once_differentiable_autograd_vjp():
    op = _numpy_cube_not_composable()
    x = torch.randn([], dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn_like(x, requires_grad=True)
    _, vjp_fn = F.vjp(op.torch, x)
    (gx,) = vjp_fn(grad_y)
    torch.testing.assert_close(gx.detach(), 3 * x.detach() ** 2 * grad_y.detach())
    with pytest.raises(ab.MissingRuleError, match=r"cube_not_composable.*vjp rule, which is "
                                                  r"host code"):
        gx.backward()


# ports test_once_differentiable_grad_vjp (an expected failure in PyTorch): grad over
# vjp of a host backward raises, naming the rule to make traced; with the rule traced
# it gives the numbers
def test_once_differentiable_grad_vjp():
    op = _numpy_cube_not_composable()
    x, grad_y = _t(1.5), _t(0.7)

    def h(op):
        return lambda x, grad_y: F.vjp(op.torch, x)[1](grad_y)[0]

    with pytest.raises(ab.MissingRuleError, match=r"cube_not_composable.*vjp rule.*host code"):
        F.grad(h(op), argnums=(0, 1))(x, grad_y)
    op.def_vjp(lambda p, ct: (3 * p[0] ** 2 * ct,), traced=True)
    gx, gg = F.grad(h(op), argnums=(0, 1))(x, grad_y)
    torch.testing.assert_close((gx, gg), (6 * x * grad_y, 3 * x**2))


# ports test_grad_fn_name: the node autograd records is named after the function
def test_grad_fn_name():
    op = ab.bind(lambda x: np.copy(x), shape=ab.like(0), name="FooBar",
                 vjp=lambda p, ct: (ct,))
    names = []

    def f(x):
        y = op.torch(x)
        names.append(type(y.grad_fn).__name__)
        return y

    F.grad(f)(_t(1.0))
    assert len(names) == 1 and "FooBar" in names[0]


# --------------------------------------------------- TestAutogradFunctionVmapAPI

def _np_cube_pair(x):
    return x**3, 3 * x**2


def _cube_pair_shape(x):
    return x, x


# ports test_no_vmap_staticmethod_and_no_generate_vmap_rule: PyTorch refuses to vmap a
# Function without a vmap rule; an anybind host op without one batches sequentially
def test_no_vmap_rule_batches_sequentially():
    calls = []

    def fn(x):
        calls.append(x.shape)
        return _np_cube_pair(x)

    op = ab.bind(fn, shape=_cube_pair_shape, name="cube_no_vmap_rule")
    x = torch.from_numpy(np.linspace(-1, 1, 3))
    y, dy = torch.vmap(op.torch)(x)
    torch.testing.assert_close((y, dy), (x**3, 3 * x**2))
    assert calls == [()] * 3


# ports test_has_vmap_staticmethod_and_has_generate_vmap_rule: PyTorch refuses a
# Function with both; anybind allows a vmap rule on a traced op (which torch.vmap
# could batch itself) and the rule decides
@pytest.mark.parametrize("with_jvp", [False, True])
def test_vmap_rule_on_a_traced_op_is_used(with_jvp):
    calls = []

    def rule(axis_size, in_batched, x):
        calls.append(axis_size)
        return (x**3, 3 * x**2), True

    op = ab.bind(lambda x: (x**3, 3 * x**2), traced=True, name=f"cube_traced_rule_{with_jvp}")
    op.def_vmap(rule, traced=True)
    if with_jvp:
        op.def_jvp(lambda p, t: (3 * p[0] ** 2 * t[0], 6 * p[0] * t[0]), traced=True)
    x = torch.from_numpy(np.linspace(-1, 1, 3))
    torch.testing.assert_close(torch.vmap(op.torch)(x), (x**3, 3 * x**2))
    assert calls == [3]


# the same op, its vmap rule its only rule: torch differentiates the traced function
# (grad, jacfwd, dual tensors, gradcheck), under vmap too, where the rule runs
def test_traced_op_with_only_a_vmap_rule_is_differentiated_by_torch():
    calls = []

    def rule(axis_size, in_batched, x):
        calls.append(axis_size)
        return (x**3, 3 * x**2), True

    op = ab.bind(lambda x: (x**3, 3 * x**2), traced=True, name="cube_traced_lone_rule")
    op.def_vmap(rule, traced=True)
    x = torch.from_numpy(np.linspace(-1, 1, 3))
    s = lambda v: sum(o.sum() for o in op.torch(v))
    torch.testing.assert_close(F.grad(s)(x), 3 * x**2 + 6 * x)
    torch.testing.assert_close(F.grad(lambda v: torch.vmap(op.torch)(v)[0].sum())(x), 3 * x**2)
    torch.testing.assert_close(F.jacfwd(lambda v: torch.vmap(op.torch)(v)[1])(x),
                               torch.diag(6 * x))
    assert calls == [3, 3]
    torch.testing.assert_close(F.hessian(s)(x), torch.diag(6 * x + 6))
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(op.torch(fwAD.make_dual(x, torch.ones_like(x)))[0]).tangent
    torch.testing.assert_close(tangent, 3 * x**2)
    a = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(op.torch, (a,), check_forward_ad=True,
                                    check_batched_grad=True)
    assert torch.autograd.gradgradcheck(op.torch, (a,), check_fwd_over_rev=True)


# ports test_info_object: the rule gets the batch size (anybind's rules get no
# randomness flag: vmap's randomness setting does not change what they see)
@pytest.mark.parametrize("randomness", ["error", "different", "same"])
def test_info_object(randomness):
    batch_size, seen = 10, []

    def rule(axis_size, in_batched, x):
        seen.append(axis_size)
        return x, in_batched[0]

    op = ab.bind(lambda x: np.copy(x), shape=ab.like(0), vmap=rule, name="info_id")
    x = torch.randn(batch_size, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(op.torch, randomness=randomness)(x), x)
    assert seen == [batch_size]


# ports test_in_dims_single_input: in_dims=1 reaches the rule as in_batched (True,)
# with the batch axis moved to 0
def test_in_dims_single_input():
    B, seen = 10, []

    def rule(axis_size, in_batched, x):
        seen.append((tuple(in_batched), x.shape))
        return x, in_batched[0]

    op = ab.bind(lambda x: np.copy(x), shape=ab.like(0), vmap=rule, name="in_dims_id")
    x = torch.randn(3, B, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(op.torch, in_dims=1)(x), x.T)
    torch.testing.assert_close(torch.vmap(op.torch, in_dims=(1,))(x), x.T)
    assert seen == [((True,), (B, 3))] * 2


# ports test_in_dims_multiple_inputs: in_batched mirrors the arguments' pytrees
def test_in_dims_multiple_inputs():
    seen = []

    def rule(axis_size, in_batched, x, ys):
        seen.append(in_batched)
        return (x, list(ys)), tuple(in_batched)

    op = ab.bind(lambda x, ys: (np.copy(x), [np.copy(y) for y in ys]),
                 shape=lambda x, ys: (x, list(ys)), vmap=rule, name="in_dims_pytree")
    x = torch.randn(2, dtype=torch.float64)
    out = torch.vmap(op.torch)(x, [x, x])
    torch.testing.assert_close(out, (x, [x, x]))
    (in_batched,) = seen
    assert isinstance(in_batched, tuple) and isinstance(in_batched[1], list)
    assert tuple(in_batched) == (True, [True, True])


# ports test_skips_empty_layer: an op applied to an unbatched tensor inside vmap runs
# unbatched; its vmap rule is not called
def test_skips_empty_layer():
    def rule(axis_size, in_batched, x):
        raise RuntimeError("expected to not be called")

    op = ab.bind(lambda x: np.copy(x), shape=ab.like(0), vmap=rule, name="skips_empty")

    def f(x):
        op.torch(_t(1.0))
        return x * 1

    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(f)(x), x)


# ports test_none_returns: outputs the rule returns unbatched (out_dims None) are
# broadcast over the batch
def test_none_returns():
    def zeros_rule(axis_size, in_batched, x):
        assert tuple(in_batched) == (True,)
        return np.zeros(x.shape[1:]), False

    zeros = ab.bind(lambda x: np.zeros(x.shape), shape=ab.like(0), vmap=zeros_rule,
                    name="none_zeros")
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(zeros.torch)(x), torch.zeros_like(x))

    def two_rule(axis_size, in_batched, x):
        r = np.zeros(x.shape[1:])
        return (r, r), False

    two = ab.bind(lambda x: (np.zeros(x.shape),) * 2, shape=lambda x: (x, x), vmap=two_rule,
                  name="none_two_zeros")
    y, z = torch.vmap(two.torch)(x)
    torch.testing.assert_close((y, z), (torch.zeros_like(x), torch.zeros_like(x)))


# ports test_none_returns, its outputs left unbatched: declared unbatched
# (out_batched=False), they leave torch.vmap with out_dims=None, as under jax.vmap
def test_none_returns_leave_vmap_unbatched():
    zeros = ab.bind(lambda x: np.zeros(x.shape), shape=ab.like(0), name="none_zeros_declared")
    zeros.def_vmap(lambda n, ib, x: (np.zeros(x.shape[1:]), False), out_batched=False)
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(zeros.torch, out_dims=None)(x),
                               torch.zeros(3, dtype=torch.float64))


# ports test_should_have_two_returns: a rule that returns something other than
# (output, out_batched) is an error saying so
@pytest.mark.parametrize("returns", ["single", "four"])
def test_should_have_two_returns(returns):
    def rule(axis_size, in_batched, x):
        r = np.zeros(x.shape[1:])
        return r if returns == "single" else (r, r, 0, 0)

    op = ab.bind(lambda x: np.zeros(x.shape), shape=ab.like(0), vmap=rule,
                 name=f"two_returns_{returns}")
    with pytest.raises(Exception, match=r"two_returns.*vmap rule must return a pair"):
        torch.vmap(op.torch)(torch.randn(2, 3, dtype=torch.float64))


# ports test_incompatible_out_dims_error_msg: out_batched not structured like the
# output is an error naming out_batched
@pytest.mark.parametrize("output", ["tensor", "list"])
def test_incompatible_out_dims_error_msg(output):
    def rule(axis_size, in_batched, x):
        r = np.zeros(x.shape[1:])
        return (r if output == "tensor" else [r]), (False,)

    wrap = (lambda r: r) if output == "tensor" else (lambda r: [r])
    op = ab.bind(lambda x: wrap(np.zeros(x.shape)), shape=lambda x: wrap(x), vmap=rule,
                 name=f"incompatible_{output}")
    with pytest.raises(Exception, match=r"incompatible_.*vmap rule returned out_batched of "
                                        r"structure"):
        torch.vmap(op.torch)(torch.randn(2, 3, dtype=torch.float64))


# ports test_kwarg_only_tensors: PyTorch refuses keyword-only tensors; anybind takes
# them as non-differentiable operands, batched, seen by the rule in in_batched.kwargs
def test_kwarg_only_tensors():
    seen = []

    def rule(axis_size, in_batched, x, *, y):
        seen.append((tuple(in_batched), dict(in_batched.kwargs)))
        return x + y, True

    op = ab.bind(lambda x, *, y: x + y, shape=ab.like(0), vmap=rule, name="kwarg_tensor")
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(torch.vmap(lambda x, y: op.torch(x, y=y))(x, y), x + y)
    assert seen == [((True,), {"y": True})]
