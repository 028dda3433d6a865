"""The examples of torch.func's "Extending torch.func with autograd.Function", bound once
with anybind and used from PyTorch: a cube with double backward, NumPy sort returning
integer indices (jvp and vjp through a NumPy take with integer index operands), and a
vmap rule. References: torch's own x**3, torch.sort and torch.take_along_dim.
"""
import jax
import numpy as np
import pytest
import torch

import anybind as ab
from helpers import check_torch_first_order, randn

F = torch.func


# ------------------------------------------------------------------- cube

@pytest.fixture(scope="module")
def cube():
    """x³ on the host; its traced vjp 3x²·ȳ is plain arithmetic, so it runs on torch."""
    op = ab.bind(lambda x: x**3, shape=ab.like(0), vmap="vectorized", name="cube")
    op.def_vjp(lambda p, ct: (3 * p[0] ** 2 * ct,), traced=True)
    return op


def test_cube_double_backward(cube):
    x = torch.from_numpy(randn(4))
    torch.testing.assert_close(F.grad(F.grad(lambda v: cube.torch(v)))(x[0]), 6 * x[0])
    a = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(cube.torch(a).sum(), a, create_graph=True)
    torch.testing.assert_close(g, 3 * x**2)
    (gg,) = torch.autograd.grad(g.sum(), a)
    torch.testing.assert_close(gg, 6 * x)
    assert torch.autograd.gradcheck(cube.torch, (a,))
    assert torch.autograd.gradgradcheck(cube.torch, (a,))
    # forward mode is the transpose of the traced vjp, to every order too
    torch.testing.assert_close(F.jacfwd(F.jacfwd(lambda v: cube.torch(v).sum()))(x),
                               torch.diag(6 * x))
    torch.testing.assert_close(F.hessian(lambda v: cube.torch(v).sum())(x), torch.diag(6 * x))


# ------------------------------------------------------------ sort and take

def _take_fn(x, ind, ind_inv, *, dim):
    del ind_inv
    return np.take_along_axis(x, ind, axis=dim)


def _sort_fn(x, *, dim):
    ind = np.argsort(x, axis=dim, kind="stable")
    ind_inv = np.argsort(ind, axis=dim, kind="stable")
    return np.take_along_axis(x, ind, axis=dim), ind, ind_inv


def _sort_shape(x, *, dim):
    i = jax.ShapeDtypeStruct(x.shape, np.int64)
    return jax.ShapeDtypeStruct(x.shape, x.dtype), i, i


@pytest.fixture(scope="module")
def take_sort():
    """NumpyTake (integer index operands) and NumpySort whose rules call NumpyTake."""
    # vectorized: every array gets a leading batch axis, so rules are called with dim < 0
    take = ab.bind(_take_fn, shape=ab.like(0), vmap="vectorized", name="numpy_take")
    # take is linear in x: its jvp is itself, its vjp the take by the inverse permutation
    take.def_jvp(lambda p, t, dim: take(t[0], p[1], p[2], dim=dim), traced=True)
    take.def_vjp(lambda p, ct, dim: (take(ct, p[2], p[1], dim=dim), None, None), traced=True)

    sort = ab.bind(_sort_fn, shape=_sort_shape, name="numpy_sort")

    @sort.def_jvp(traced=True)
    def _(primals, tangents, dim):
        _, ind, ind_inv = sort(primals[0], dim=dim)
        return take(tangents[0], ind, ind_inv, dim=dim), None, None

    @sort.def_vjp(traced=True)
    def _(primals, ct, dim):
        _, ind, ind_inv = sort(primals[0], dim=dim)
        return (take(ct[0], ind_inv, ind, dim=dim),)

    @sort.def_vmap
    def _(axis_size, in_batched, x, *, dim):
        # the seed's vmap staticmethod: sort the batch at once along the shifted axis
        dim = dim if dim >= 0 else dim + x.ndim - 1
        return _sort_fn(x, dim=dim + 1), True
    return take, sort


def numpy_sort(sort, x, dim=-1):
    return sort.torch(x, dim=dim)[0]


@pytest.mark.parametrize("dim", [-1, 0])
def test_numpy_sort_values_indices_and_grad(take_sort, dim):
    _, sort = take_sort
    x = torch.from_numpy(randn((2, 3)))
    vals, ind, ind_inv = sort.torch(x, dim=dim)
    ref = torch.sort(x, dim=dim, stable=True)
    torch.testing.assert_close(vals, ref.values)
    assert ind.dtype == torch.int64 and torch.equal(ind, ref.indices)
    assert torch.equal(torch.take_along_dim(ind, ind_inv, dim=dim),
                       torch.arange(x.shape[dim]).expand_as(ind) if dim == -1
                       else torch.arange(x.shape[0])[:, None].expand_as(ind))
    grad_x = F.grad(lambda x: numpy_sort(sort, x, dim).sum())(x)  # the seed's sanity check
    torch.testing.assert_close(grad_x, torch.ones_like(x))
    w = torch.from_numpy(randn((2, 3), seed=1))
    torch.testing.assert_close(F.grad(lambda x: (numpy_sort(sort, x, dim) * w).sum())(x),
                               F.grad(lambda x: (torch.sort(x, dim=dim).values * w).sum())(x))


def test_numpy_sort_jvp_and_vjp(take_sort):
    _, sort = take_sort
    x = torch.from_numpy(randn((2, 5)))
    check_torch_first_order(lambda v: sort.torch(v, dim=-1), (x,))
    t = torch.from_numpy(randn((2, 5), seed=3))
    (vals, ind, _), (dvals, dind, _) = F.jvp(lambda v: sort.torch(v, dim=-1), (x,), (t,))
    torch.testing.assert_close(dvals, torch.take_along_dim(t, ind, dim=-1))
    assert dind is None or not dind.is_floating_point()
    ref = F.jvp(lambda v: torch.sort(v, dim=-1).values, (x,), (t,))[1]
    torch.testing.assert_close(dvals, ref)
    # every order: the rules call NumpyTake, whose rules call NumpyTake
    s = lambda v: (numpy_sort(sort, v) ** 3).sum()
    torch.testing.assert_close(F.hessian(s)(x[0]),
                               F.hessian(lambda v: (torch.sort(v).values ** 3).sum())(x[0]))
    torch.testing.assert_close(F.jacfwd(F.jacrev(s))(x[0]), F.jacrev(F.jacfwd(s))(x[0]))


def test_numpy_take_integer_index_operand(take_sort):
    take, sort = take_sort
    x = torch.from_numpy(randn((3, 4)))
    _, ind, ind_inv = sort.torch(torch.from_numpy(randn((3, 4), seed=5)), dim=-1)
    torch.testing.assert_close(take.torch(x, ind, ind_inv, dim=-1),
                               torch.take_along_dim(x, ind, dim=-1))
    check_torch_first_order(lambda v: take.torch(v, ind, ind_inv, dim=-1), (x,))
    a = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: take.torch(v, ind, ind_inv, dim=-1), (a,))
    assert torch.autograd.gradgradcheck(lambda v: take.torch(v, ind, ind_inv, dim=-1), (a,))
    # vmap over the values with the indices fixed, and over both
    xs = torch.from_numpy(randn((2, 3, 4), seed=6))
    got = torch.vmap(lambda v: take.torch(v, ind, ind_inv, dim=-1))(xs)
    torch.testing.assert_close(got, torch.take_along_dim(xs, ind[None], dim=-1))
    got = torch.vmap(lambda v, i, j: take.torch(v, i, j, dim=-1))(xs, ind.expand(2, 3, 4),
                                                                 ind_inv.expand(2, 3, 4))
    torch.testing.assert_close(got, torch.take_along_dim(xs, ind[None], dim=-1))


def test_numpy_sort_vmap_rule(take_sort):
    """The seed's check: vmap(numpy_sort)(x) equals sorting along axis 1; and the vmap rule
    keeps the derivative rules (grad of vmap, vmap of grad, jacrev)."""
    _, sort = take_sort
    calls = []
    rule = sort.vmap_rule.fn

    def counting(axis_size, in_batched, x, *, dim):
        calls.append(axis_size)
        return rule(axis_size, in_batched, x, dim=dim)

    sort.def_vmap(counting)
    x = torch.from_numpy(randn((2, 3)))
    result = torch.vmap(lambda v: numpy_sort(sort, v))(x)
    torch.testing.assert_close(result, numpy_sort(sort, x, 1))
    assert calls == [2]
    w = torch.from_numpy(randn((2, 3), seed=2))
    g_of_vmap = F.grad(lambda v: (torch.vmap(lambda r: numpy_sort(sort, r))(v) * w).sum())(x)
    vmap_of_g = torch.vmap(F.grad(lambda r, c: (numpy_sort(sort, r) * c).sum()))(x, w)
    ref = F.grad(lambda v: (torch.sort(v, dim=1).values * w).sum())(x)
    torch.testing.assert_close(g_of_vmap, ref)
    torch.testing.assert_close(vmap_of_g, ref)
    jac = F.jacrev(lambda v: numpy_sort(sort, v))(x[0])
    torch.testing.assert_close(jac, F.jacrev(lambda v: torch.sort(v).values)(x[0]))
    nested = torch.vmap(torch.vmap(lambda v: numpy_sort(sort, v)))(torch.stack([x, 2 * x]))
    torch.testing.assert_close(nested, torch.sort(torch.stack([x, 2 * x]), dim=-1).values)
