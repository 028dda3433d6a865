"""The examples of PyTorch's "Extending torch.func with autograd.Function"
(``docs/source/notes/extending.func.rst`` in pytorch/pytorch), as anybind ops used
through ``op.torch``, with the docs' own sanity checks and the numbers behind
them against torch's sort, take_along_dim and x**3.

The docs' autograd.Functions return intermediates (``ind``, ``ind_inv``, ``dx``)
so that ``setup_context`` can save them; an anybind rule gets the primals
instead and calls the op again for them (or, for work done once in the forward
pass, a ``def_fwd`` rule keeps them as residuals for ``def_bwd``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import anybind as ab

pytestmark = pytest.mark.slow  # a ported suite: PyTorch's own autograd tests

F = torch.func


def _wrap(dim, ndim):
    return dim if dim >= 0 else dim + ndim


# ------------------------------------------- Example 1: calling into another system

def _np_sort(x, *, dim):
    ind = np.argsort(x, axis=dim, kind="stable")
    ind_inv = np.argsort(ind, axis=dim, kind="stable")
    return np.take_along_axis(x, ind, axis=dim), ind, ind_inv


def _take_vmap(axis_size, in_batched, x, ind, ind_inv, *, dim):
    # the docs' NumpyTake.vmap: expand every operand to the batch, take along dim + 1
    dim = _wrap(dim, x.ndim - in_batched[0])
    x, ind = (v if b else np.broadcast_to(v, (axis_size,) + v.shape)
              for v, b in zip((x, ind), in_batched))
    return np.take_along_axis(x, ind, axis=dim + 1), True


def _sort_vmap(axis_size, in_batched, x, *, dim):
    # the docs' NumpySort.vmap: the batch axis at 0, sort again along dim + 1
    return _np_sort(x, dim=_wrap(dim, x.ndim - 1) + 1), True


numpy_take = ab.bind(lambda x, ind, ind_inv, *, dim: np.take_along_axis(x, ind, axis=dim),
                     shape=ab.like(0), vmap=_take_vmap, name="docs_NumpyTake")
numpy_take.def_vjp(lambda p, ct, *, dim: (numpy_take(ct, p[2], p[1], dim=dim), None, None),
                   traced=True)

numpy_sort_op = ab.bind(_np_sort, vmap=_sort_vmap, name="docs_NumpySort",
                        shape=lambda x, *, dim: (x, x.update(dtype=np.int64),
                                                 x.update(dtype=np.int64)))


@numpy_sort_op.def_vjp(traced=True)
def _(p, ct, *, dim):
    # the docs' backward: NumpyTake of the cotangent by the inverse permutation
    _, ind, ind_inv = numpy_sort_op(p[0], dim=dim)
    return (numpy_take(ct[0], ind_inv, ind, dim=dim),)


def numpy_sort(x, dim=-1):
    result, _, _ = numpy_sort_op.torch(x, dim=dim)
    return result


def _x(shape=(2, 3), seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=shape))


# ports Example 1's sanity check: grad of numpy_sort(x).sum() is ones; and the
# gradient and second derivatives of a weighted sort against torch.sort's
def test_example1_numpy_sort_grad():
    x = _x()
    grad_x = F.grad(lambda x: numpy_sort(x).sum())(x)
    torch.testing.assert_close(grad_x, torch.ones_like(x))
    w = _x(seed=1)
    s = lambda sort: lambda x: (sort(x) ** 3 * w).sum()
    ref = lambda x: torch.sort(x, dim=-1, stable=True).values
    torch.testing.assert_close(F.grad(s(numpy_sort))(x), F.grad(s(ref))(x))
    # "this allows us to do double backwards and/or compute second order gradients"
    torch.testing.assert_close(F.hessian(s(numpy_sort))(x), F.hessian(s(ref))(x))

    def double_backward(sort):
        a = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(s(sort)(a), a, create_graph=True)
        return torch.autograd.grad(g.sum(), a)[0]
    torch.testing.assert_close(double_backward(numpy_sort), double_backward(ref))


# ---------------------------------------------- Example 2: custom gradient rules

my_cube_op = ab.bind(lambda x: (x**3, 3 * x**2), shape=lambda x: (x, x), name="docs_MyCube",
                     vmap="vectorized")


@my_cube_op.def_vjp(traced=True)
def _(p, ct):
    # the docs' backward, with the gradient contribution of dx for higher orders
    (x,), (grad_output, grad_dx) = p, ct
    dx = my_cube_op(x)[1]
    return (grad_output * dx + grad_dx * 6 * x,)


def my_cube(x):
    result, _ = my_cube_op.torch(x)
    return result


# ports Example 2's sanity check: second-order gradients of my_cube
def test_example2_my_cube_second_order():
    x = _x(())
    ggx = F.grad(F.grad(my_cube))(x)
    torch.testing.assert_close(ggx, 6 * x)
    a = _x((3,)).requires_grad_()
    assert torch.autograd.gradgradcheck(my_cube, (a,))


# ports Example 2's point (dx computed in the forward pass, not again in backward):
# anybind's def_fwd keeps it as a residual for def_bwd; those rules are host code, so
# they give first derivatives and a second one raises, naming the bwd rule
def test_example2_work_moved_to_the_forward_pass():
    calls = []

    def fwd(x):
        calls.append("fwd")
        return x**3, 3 * x**2

    cube = ab.bind(lambda x: x**3, shape=ab.like(0), name="docs_MyCube_residuals")
    cube.def_fwd(fwd, residuals=ab.like(0))
    cube.def_bwd(lambda dx, grad_output: (grad_output * dx,))
    x = _x(())
    torch.testing.assert_close(F.grad(cube.torch)(x), 3 * x**2)
    assert calls == ["fwd"]
    with pytest.raises(ab.MissingRuleError, match=r"docs_MyCube_residuals.*bwd"):
        F.grad(F.grad(cube.torch))(x)


# ports "Automatically generate a vmap rule": torch-only code (here a traced function,
# plain arithmetic) needs no vmap rule; torch.vmap batches it
def test_generate_vmap_rule_my_cube():
    cube = ab.bind(lambda x: (x**3, 3 * x**2), traced=True, name="docs_MyCube_generated")

    @cube.def_vjp(traced=True)
    def _(p, ct):
        (x,), (grad_output, grad_dx) = p, ct
        return (grad_output * 3 * x**2 + grad_dx * 6 * x,)

    x = _x((3,))
    result = torch.vmap(lambda v: cube.torch(v)[0])(x)
    torch.testing.assert_close(result, x**3)
    torch.testing.assert_close(torch.vmap(F.grad(F.grad(lambda v: cube.torch(v)[0])))(x), 6 * x)


# ports "Defining the vmap staticmethod": vmap(numpy_sort)(x) sorts each row with one
# call of the vmap rule (the docs compare with numpy_sort(result, 1))
def test_vmap_staticmethod_numpy_sort():
    calls = []
    rule = numpy_sort_op.vmap_rule.fn

    def counting(axis_size, in_batched, x, *, dim):
        calls.append(axis_size)
        return rule(axis_size, in_batched, x, dim=dim)

    numpy_sort_op.def_vmap(counting)
    try:
        x = _x()
        result = torch.vmap(numpy_sort)(x)
        torch.testing.assert_close(result, numpy_sort(result, 1))
        torch.testing.assert_close(result, torch.sort(x, dim=1).values)
        assert calls == [2]
    finally:
        numpy_sort_op.def_vmap(rule)


# ports the note on vmap rules: grad(vmap(MyFunc)) should be replaceable with
# grad(map(MyFunc)); anybind's derivatives of the batched op come from the unbatched
# rules, so they agree, and vmap of grad too (NumpyTake's vmap rule runs the backward)
def test_grad_of_vmap_is_grad_of_map():
    x, w = _x((3, 4)), _x((3, 4), seed=1)
    by_vmap = F.grad(lambda v: (torch.vmap(numpy_sort)(v) * w).sum())(x)
    by_map = F.grad(lambda v: (torch.stack([numpy_sort(r) for r in v]) * w).sum())(x)
    torch.testing.assert_close(by_vmap, by_map)
    vmap_of_grad = torch.vmap(F.grad(lambda r, c: (numpy_sort(r) * c).sum()))(x, w)
    torch.testing.assert_close(vmap_of_grad, by_map)
    torch.testing.assert_close(F.jacrev(numpy_sort)(x[0]),
                               F.jacrev(lambda v: torch.sort(v).values)(x[0]))


# ports "torch.func.jvp support": with a jvp rule the op works under torch.func.jvp
# (and its vjp by transposition stays in agreement)
def test_jvp_support():
    sort = _sort_with_jvp()
    x, t = _x(), _x(seed=2)
    _, (dvals, _, _) = F.jvp(lambda v: sort.torch(v, dim=-1), (x,), (t,))
    ref = F.jvp(lambda v: torch.sort(v, dim=-1).values, (x,), (t,))[1]
    torch.testing.assert_close(dvals, ref)
    torch.testing.assert_close(F.jacfwd(lambda v: sort.torch(v, dim=-1)[0])(x[0]),
                               F.jacrev(lambda v: sort.torch(v, dim=-1)[0])(x[0]))


# ports "torch.func.jvp support" with forward AD's dual tensors (torch.autograd.forward_ad)
@pytest.mark.timeout(60)  # a traced rule calling its own op: a defect there recurses
def test_jvp_support_dual_tensors():
    sort = _sort_with_jvp()
    x, t = _x(), _x(seed=2)
    with fwAD.dual_level():
        vals, _, _ = sort.torch(fwAD.make_dual(x, t), dim=-1)
        tangent = fwAD.unpack_dual(vals).tangent
    torch.testing.assert_close(tangent, F.jvp(lambda v: torch.sort(v, dim=-1).values,
                                              (x,), (t,))[1])


def _sort_with_jvp():
    """NumpySort with a jvp rule (a take by the sort's own indices) and no vjp rule."""
    sort = ab.bind(_np_sort, vmap=_sort_vmap, name="docs_NumpySort_jvp",
                   shape=lambda x, *, dim: (x, x.update(dtype=np.int64),
                                            x.update(dtype=np.int64)))

    @sort.def_jvp(traced=True)
    def _(p, t, *, dim):
        _, ind, ind_inv = sort(p[0], dim=dim)
        return numpy_take(t[0], ind, ind_inv, dim=dim), None, None
    return sort
