"""anybind.contrib.finufft's plans and threads: transforms on fixed points as ops,
jax-finufft 1.3.1's tests/freethreaded_test.py ported (run here with or without the GIL),
and the plans' own checks: values, transposes, derivatives, vmap, a CG solve, lifetime."""
from __future__ import annotations

import concurrent.futures
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import check_first_order, check_transpose_identity

pytest.importorskip("ducc0")
finufft = pytest.importorskip("anybind.contrib.finufft")

from test_finufft_ops import check_close, nudft1, nudft2, nudft3  # noqa: E402


def _points(seed=0, m=40, nd=2):
    return list(np.random.default_rng(seed).uniform(-np.pi, np.pi, (nd, m)))


# ported from jax-finufft tests/freethreaded_test.py::test_threaded_pool_nufft1 (200
# transforms of 300 points, not 1000 of 1000; jax-finufft skips it unless Python is
# free-threaded, here it runs on every build: the host calls run on the pool's threads)
@pytest.mark.slow  # ported (jax-finufft's freethreaded tests), or tens of seconds of transforms
def test_threaded_pool_nufft1(N_transforms=200, N_points=300):
    rng = np.random.default_rng(42)
    modes, eps = 64, 1e-7
    x_values = rng.uniform(-np.pi, np.pi, size=(N_transforms, N_points))
    c_values = rng.normal(size=(N_transforms, N_points)) + 1j * rng.normal(
        size=(N_transforms, N_points))

    def compute_transform(idx):
        return np.array(finufft.nufft1(modes, c_values[idx], x_values[idx], eps=eps))

    sequential_results = [compute_transform(i) for i in range(N_transforms)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as executor:
        futures = [executor.submit(compute_transform, i) for i in range(N_transforms)]
        parallel_results = [future.result() for future in futures]
    assert len(sequential_results) == len(parallel_results) == N_transforms
    for seq_res, par_res in zip(sequential_results, parallel_results):
        check_close(seq_res, par_res, rtol=1e-3)
    check_close(sequential_results[7], nudft1(c_values[7], [x_values[7]], (modes,), 1), 1e-6)


@pytest.mark.slow  # ported (jax-finufft's freethreaded tests), or tens of seconds of transforms
def test_one_plan_from_many_threads():
    """ducc0's plans are not reentrant: calls of one plan from a pool take turns and give
    the sequential results (each thread its own values)."""
    x, y = _points(1, m=500)
    plan = finufft.Plan((32, 24), x, y, eps=1e-9)
    r = np.random.default_rng(2)
    cs = r.normal(size=(64, 500)) + 1j * r.normal(size=(64, 500))
    t1 = jax.jit(plan.nufft1)
    seq = [np.asarray(t1(c)) for c in cs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        par = list(ex.map(lambda c: np.asarray(t1(c)), cs))
    for a, b in zip(seq, par):
        np.testing.assert_array_equal(a, b)
    check_close(seq[3], nudft1(cs[3], [x, y], (32, 24), 1), 1e-8)


@pytest.mark.parametrize("iflag", [-1, 1])
@pytest.mark.parametrize("modeord", [False, True])
def test_plan_types_1_and_2_match_the_direct_sums(iflag, modeord):
    x, y = _points(3)
    opts = finufft.Opts(modeord=modeord)
    plan = finufft.Plan((7, 6), x, y, eps=1e-11, opts=opts)
    r = np.random.default_rng(4)
    c = r.normal(size=(3, 40)) + 1j * r.normal(size=(3, 40))
    g = r.normal(size=(3, 7, 6)) + 1j * r.normal(size=(3, 7, 6))
    check_close(plan.nufft1(c, iflag=iflag), nudft1(c, [x, y], (7, 6), iflag, modeord), 1e-9)
    check_close(plan.nufft2(g, iflag=iflag), nudft2(g, [x, y], iflag, modeord), 1e-9)
    # the same as the unplanned transforms
    check_close(plan.nufft1(c, iflag=iflag),
                finufft.nufft1((7, 6), c, x, y, eps=1e-11, iflag=iflag, opts=opts), 1e-9)


@pytest.mark.parametrize("iflag", [-1, 1])
def test_plan3_matches_the_direct_sum(iflag):
    r = np.random.default_rng(5)
    x, y = r.uniform(-2, 2, (2, 30))
    s, t = r.uniform(-5, 5, (2, 12))
    plan = finufft.Plan3(x, y, s, t, eps=1e-11)
    c = r.normal(size=(2, 30)) + 1j * r.normal(size=(2, 30))
    check_close(plan.nufft3(c, iflag=iflag), nudft3(c, [x, y], [s, t], iflag), 1e-9)


@pytest.mark.slow  # ported (jax-finufft's freethreaded tests), or tens of seconds of transforms
@pytest.mark.parametrize("kind", ["nufft1", "nufft2", "nufft3"])
def test_plan_ops_derivatives_transposes_and_vmap(kind):
    x, y = _points(6)
    r = np.random.default_rng(7)
    c = r.normal(size=40) + 1j * r.normal(size=40)
    g = r.normal(size=(5, 4)) + 1j * r.normal(size=(5, 4))
    s, t = r.uniform(-4, 4, (2, 9))
    if kind == "nufft3":
        f, a = finufft.Plan3(x, y, s, t, eps=1e-12).nufft3, c
        ref = lambda a: nudft3(a, [x, y], [s, t], -1)                      # noqa: E731
    else:
        plan = finufft.Plan((5, 4), x, y, eps=1e-12)
        f, a = getattr(plan, kind), (c if kind == "nufft1" else g)
        ref = ((lambda a: nudft1(a, [x, y], (5, 4), 1)) if kind == "nufft1"
               else (lambda a: nudft2(a, [x, y], -1)))
    fj = jax.jit(f)
    check_first_order(fj, (a,), rtol=1e-7, atol=1e-7)
    ybar = np.asarray(fj(a)) * (1 - 2j)
    check_transpose_identity(fj, a, a * 1j, ybar, rtol=1e-9, atol=1e-9)
    # the transpose is the direct sum's
    check_close(jax.linear_transpose(f, a)(ybar)[0], jax.linear_transpose(ref, a)(ybar)[0],
                1e-9)
    # second order: the hessian of ‖f‖² (in real coordinates) is the direct sum's
    loss = lambda re, im: jnp.sum(jnp.abs(f(re + 1j * im)) ** 2)          # noqa: E731
    lref = lambda re, im: jnp.sum(jnp.abs(ref(re + 1j * im)) ** 2)        # noqa: E731
    h = jax.jit(jax.hessian(loss, (0, 1)))(a.real, a.imag)
    hr = jax.hessian(lref, (0, 1))(a.real, a.imag)
    for u, v in zip(jax.tree.leaves(h), jax.tree.leaves(hr)):
        check_close(u, v, 1e-8)
    # vmap: the batch is more transforms for ducc0
    batch = jnp.stack([a, 2 * a, a * 1j])
    check_close(jax.vmap(f)(batch), jnp.stack([f(b) for b in batch]), 1e-12)
    check_close(jax.vmap(jax.grad(lambda v: jnp.sum(jnp.abs(f(v)) ** 2)))(batch.real + 0j),
                jax.vmap(jax.grad(lambda v: jnp.sum(jnp.abs(ref(v)) ** 2)))(batch.real + 0j),
                1e-8)


def _cg(apply, b, iters):
    """Conjugate gradients on a Hermitian positive (semi)definite operator."""
    def body(_, state):
        x, r, p, rr = state
        ap = apply(p)
        alpha = rr / jnp.vdot(p, ap).real
        x, r = x + alpha * p, r - alpha * ap
        rr_new = jnp.vdot(r, r).real
        return x, r, r + (rr_new / rr) * p, rr_new
    x0 = jnp.zeros_like(b)
    return jax.lax.fori_loop(0, iters, body, (x0, b, b, jnp.vdot(b, b).real))[0]


@pytest.mark.slow  # ported (jax-finufft's freethreaded tests), or tens of seconds of transforms
def test_cg_on_the_normal_operator_with_and_without_a_plan():
    """AᴴA with A = type 2 (modes ↦ points): one solve with a plan, one with nufft1/2,
    and one with the direct sums, the same to the solver's accuracy."""
    x, y = _points(8, m=400)
    shape = (12, 10)
    plan = finufft.Plan(shape, x, y, eps=1e-12)
    r = np.random.default_rng(9)
    truth = r.normal(size=shape) + 1j * r.normal(size=shape)
    data = nudft2(truth, [x, y], -1)
    normal = {
        "plan": lambda f: plan.nufft1(plan.nufft2(f, iflag=-1), iflag=1),
        "unplanned": lambda f: finufft.nufft1(shape, finufft.nufft2(f, x, y, eps=1e-12), x, y,
                                              eps=1e-12),
        "direct": lambda f: nudft1(nudft2(f, [x, y], -1), [x, y], shape, 1)}
    rhs = nudft1(data, [x, y], shape, 1)
    sols = {k: jax.jit(lambda b, a=a: _cg(a, b, 60))(rhs) for k, a in normal.items()}
    check_close(sols["direct"], truth, 1e-6)
    check_close(sols["plan"], sols["direct"], 1e-8)
    check_close(sols["unplanned"], sols["direct"], 1e-8)


def _compile(fn, *args):
    """fn compiled ahead of time: the program, and nothing of the Python around it."""
    return jax.jit(lambda *a: fn(*a)).lower(*args).compile()


@pytest.mark.slow  # ported (jax-finufft's freethreaded tests), or tens of seconds of transforms
def test_a_plan_lives_as_long_as_its_ops():
    x, y = _points(10)
    plan = finufft.Plan((5, 4), x, y)
    c = np.ones(40, complex)
    compiled = _compile(plan.nufft1, c)
    want = np.asarray(plan.nufft1(c))
    ref, op = weakref.ref(plan), weakref.ref(plan._t1)
    del plan
    gc.collect()
    assert ref() is None                            # the Plan object is gone ...
    np.testing.assert_array_equal(compiled(c), want)   # ... its ops and ducc0 plan are not
    del compiled
    jax.clear_caches()
    gc.collect()
    assert op() is None                 # dropped with the last program that used them


def test_plan_errors_are_clear():
    x, y = _points(11)
    with pytest.raises(TypeError, match="Plan: point array 0 is traced"):
        jax.jit(lambda x: finufft.Plan(4, x).nufft1(jnp.ones(40, complex)))(x)
    with pytest.raises(ValueError, match="Plan: n_modes must give 2 positive sizes"):
        finufft.Plan(4, x, y)
    plan = finufft.Plan((4, 3), x, y)
    with pytest.raises(TypeError, match=r"Plan.nufft1: the source must be complex128 "
                                        r"\(\.\.\., 40\)"):
        plan.nufft1(np.ones(39, complex))
    with pytest.raises(ValueError, match="Plan3: the D source point arrays and then"):
        finufft.Plan3(x, y, x)
