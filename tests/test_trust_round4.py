"""Trust, round 4: host code that calls ops nests to the documented depth on the first
eager call and never deadlocks across threads; bad input to the finufft drop-in,
tampered exported programs and unclear errors; temporary folders cleaned up.

Anything that could crash or hang runs in a fresh process (``run_fresh_python``),
so that a segfault or a hang fails the test instead of ending the run.
"""
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _host
from helpers import fresh_stdout, run_fresh_python

# ------------------------------------------- host code that calls ops, nested


def _countdown():
    """An op whose host function calls itself on x - 1 until x[0] reaches 0: f(x) = x."""
    @ab.bind(shape=ab.like(0))
    def countdown(x):
        if x[0] <= 0:
            return np.asarray(x)
        return np.asarray(countdown(jnp.asarray(x - 1))) + 1
    return countdown


@pytest.mark.parametrize("depth", [2, 6, _host.MAX_NESTING])
def test_recursion_works_on_the_first_eager_call(depth):
    f = _countdown()  # a fresh op: its eager program's first call is this one
    np.testing.assert_array_equal(f(jnp.array([depth - 1.0])), [depth - 1.0])
    np.testing.assert_array_equal(f(jnp.array([depth - 1.0])), [depth - 1.0])
    np.testing.assert_array_equal(jax.jit(f)(jnp.array([depth - 1.0])), [depth - 1.0])


def test_recursion_past_the_limit_names_it():
    f = _countdown()
    with pytest.raises(ab.HostError, match="MAX_NESTING"):
        f(jnp.array([float(_host.MAX_NESTING)]))


def test_mutual_recursion_works_on_the_first_eager_call():
    @ab.bind(shape=ab.like(0))
    def even(x):
        return np.asarray(x) if x[0] <= 0 else np.asarray(odd(jnp.asarray(x - 1))) + 1

    @ab.bind(shape=ab.like(0))
    def odd(x):
        return np.asarray(x) if x[0] <= 0 else np.asarray(even(jnp.asarray(x - 1))) + 1

    np.testing.assert_array_equal(even(jnp.array([9.0])), [9.0])
    np.testing.assert_array_equal(odd(jnp.array([14.0])), [14.0])


def test_recursion_on_a_first_call_from_many_threads():
    # Each thread's first call of the same eager program, nested: none waits on another.
    f, out, errors = _countdown(), {}, []
    start = threading.Barrier(4)

    def work(i):
        try:
            start.wait(timeout=30)
            out[i] = float(f(jnp.array([4.0]))[0])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and out == {i: 4.0 for i in range(4)}


def test_nested_host_calls_that_would_hold_every_computation_are_refused():
    # Thread A holds 15 running host calls, nested; thread B nests until the process
    # would run more than MAX_RUNNING at once: its call is refused, naming the limit,
    # instead of waiting forever on a computation XLA will not start.
    deep = threading.Event()
    release = threading.Event()

    @ab.bind(shape=ab.like(0))
    def hold(x):
        if x[0] <= 0:
            deep.set()
            assert release.wait(timeout=60)
            return np.asarray(x)
        return np.asarray(hold(jnp.asarray(x - 1))) + 1

    f = _countdown()
    out = {}
    a = threading.Thread(target=lambda: out.setdefault("a", hold(jnp.array([14.0]))))
    a.start()
    try:
        assert deep.wait(timeout=60)
        with pytest.raises(ab.HostError, match=r"host call 25 running at once.*MAX_RUNNING"):
            f(jnp.array([14.0]))
        np.testing.assert_array_equal(f(jnp.array([8.0])), [8.0])  # 15 + 9 = 24: allowed
    finally:
        release.set()
        a.join(timeout=60)
    np.testing.assert_array_equal(out["a"], [14.0])
    assert _host._running == [0]


_THREADS_NESTING = """
    import threading
    import jax, jax.numpy as jnp, numpy as np
    import anybind as ab

    @ab.bind(shape=ab.like(0))
    def f(x):
        if x[0] <= 0:
            return np.asarray(x)
        return np.asarray(f(jnp.asarray(x - 1))) + 1

    out, refused = {}, []
    def work(i):
        for _ in range(3):
            try:
                out[i] = float(f(jnp.array([14.0]))[0])
            except ab.HostError as e:
                assert "MAX_RUNNING" in str(e), e
                refused.append(i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(v == 14.0 for v in out.values()), out
    print("done", len(out), len(refused))
"""


@pytest.mark.slow
def test_threads_nesting_host_calls_never_deadlock():
    # Four threads, each nesting eager host calls 15 deep (4 x 15 > the 32 computations
    # XLA's CPU device runs at once): before, 6 of 14 runs hung.
    for _ in range(12):
        res = run_fresh_python(_THREADS_NESTING, timeout=120)
        assert fresh_stdout(res).startswith("done")


# ------------------------------------------- finufft drop-in: type 3 near ducc0's limits

def _nudft3(c, xs, ss, sign):
    phase = sum(np.multiply.outer(t, x) for x, t in zip(xs, ss))  # (N, M)
    return np.exp(sign * 1j * phase) @ c


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("path", ["nufft3", "batched", "plan3", "nu2nu"])
def test_type3_single_precision_below_the_limit_runs_in_double(nd, path):
    ducc0 = pytest.importorskip("ducc0")
    from anybind.contrib.ducc0 import nu2nu
    from anybind.contrib.finufft import Plan3, nufft3
    best = ducc0.nufft.bestEpsilon(ndim=nd, singleprec=True, sigma_min=1.19, sigma_max=2.51)
    r = np.random.default_rng(nd)
    xs = [r.uniform(0, 2 * np.pi, (2, 40)).astype(np.float32) for _ in range(nd)]
    ss = [r.uniform(-3, 3, (2, 30)).astype(np.float32) for _ in range(nd)]
    c = (r.normal(size=(2, 40)) + 1j * r.normal(size=(2, 40))).astype(np.complex64)
    for eps in (1.5 * best, 1e-6, 2.5 * best):  # below type 3's limit (2 x best), and above
        if path == "nufft3":
            got = nufft3(c[0], *(x[0] for x in xs), *(s[0] for s in ss), eps=eps)[None]
        elif path == "batched":
            got = nufft3(c, *xs, *ss, eps=eps)
        elif path == "plan3":
            got = Plan3(*(x[0] for x in xs), *(s[0] for s in ss), eps=eps).nufft3(c[0])[None]
        else:
            got = nu2nu(c[0], np.stack([x[0] for x in xs], -1), np.stack([s[0] for s in ss], -1),
                        epsilon=eps)[None]
        assert got.dtype == np.complex64
        for b in range(got.shape[0]):
            want = _nudft3(c[b].astype(complex), [x[b].astype(float) for x in xs],
                           [s[b].astype(float) for s in ss], -1)
            np.testing.assert_allclose(got[b], want, atol=max(eps, 1e-6) * 50 * abs(want).max())


@pytest.mark.parametrize("nd", [1, 3])
def test_type3_double_precision_at_the_smallest_eps(nd):
    pytest.importorskip("ducc0")
    from anybind.contrib.finufft import Plan3, nufft3
    r = np.random.default_rng(nd)
    xs = [r.uniform(0, 2 * np.pi, 40) for _ in range(nd)]
    ss = [r.uniform(-3, 3, 30) for _ in range(nd)]
    c = r.normal(size=40) + 1j * r.normal(size=40)
    want = _nudft3(c, xs, ss, -1)
    for got in (nufft3(c, *xs, *ss, eps=1e-16), Plan3(*xs, *ss, eps=1e-16).nufft3(c)):
        np.testing.assert_allclose(got, want, atol=1e-11 * abs(want).max())


# ------------------------------------------- finufft drop-in: jax-finufft's import paths

def test_finufft_options_is_a_module_as_in_jax_finufft():
    pytest.importorskip("ducc0")
    import importlib

    from anybind.contrib import finufft
    from anybind.contrib.finufft import options
    from anybind.contrib.finufft.options import NestedOpts, Opts, unpack_opts
    assert importlib.import_module("anybind.contrib.finufft.options") is options
    assert finufft.options is options and finufft.Opts is Opts is options.Opts
    assert finufft.NestedOpts is NestedOpts and finufft.unpack_opts is unpack_opts
    for name in options.__all__:
        assert getattr(finufft, name) is getattr(options, name), name
    for name in finufft.__all__:  # every name the drop-in had still imports
        assert hasattr(finufft, name), name
    # the options reach the transform: modeord=1 is FFT order
    x = np.linspace(-3, 3, 11)
    c = np.exp(1j * x)
    centred = finufft.nufft1(6, c, x, eps=1e-12)
    fft_order = finufft.nufft1(6, c, x, eps=1e-12, opts=Opts(modeord=1))
    np.testing.assert_allclose(fft_order, np.fft.ifftshift(centred), atol=1e-9)


def test_finufft_options_import_in_a_fresh_process():
    res = run_fresh_python("""
        from anybind.contrib.finufft.options import Opts, NestedOpts
        import anybind.contrib.finufft.options as o
        from anybind.contrib.finufft import Opts as O2, options
        assert Opts is O2 and o is options
        print("ok", Opts(modeord=1).modeord)
    """, timeout=300)
    assert fresh_stdout(res).strip() == "ok 1"


# ------------------------------------------- finufft drop-in: NaN, infinite and no points

def _direct(kind, c, xs, ss=None, n_modes=None, sign=-1):
    """The direct sums, in NumPy with NaN propagating as IEEE says (no fast path)."""
    with np.errstate(invalid="ignore"):
        if kind == 1:
            ks = [np.arange(-(n // 2), (n + 1) // 2) for n in n_modes]
            grids = np.meshgrid(*ks, indexing="ij")
            phase = sum(np.multiply.outer(k, x) for k, x in zip(grids, xs))  # (*modes, M)
            return (np.exp(sign * 1j * phase) * c).sum(-1)
        if kind == 2:
            ks = [np.arange(-(n // 2), (n + 1) // 2) for n in c.shape]
            grids = np.meshgrid(*ks, indexing="ij")
            phase = sum(np.multiply.outer(x, k) for k, x in zip(grids, xs))  # (M, *modes)
            return (np.exp(sign * 1j * phase) * c).reshape(len(xs[0]), -1).sum(-1)
        phase = sum(np.multiply.outer(t, x) for x, t in zip(xs, ss))
        return (np.exp(sign * 1j * phase) * c).sum(-1)


def _same_nans(got, want, atol=1e-8):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], atol=atol * max(1, abs(want[ok]).max(initial=0)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("transform", [jax.jit, lambda f: f])
def test_finufft_non_finite_points_give_the_direct_sums_nan(bad, transform):
    pytest.importorskip("ducc0")
    from anybind.contrib.finufft import nufft1, nufft2, nufft3
    r = np.random.default_rng(0)
    x, y = r.uniform(-3, 3, 12), r.uniform(-3, 3, 12)
    s = r.uniform(-2, 2, 7)
    c = r.normal(size=12) + 1j * r.normal(size=12)
    f = r.normal(size=(6, 5)) + 1j * r.normal(size=(6, 5))
    xb = x.copy()
    xb[4] = bad
    sb = s.copy()
    sb[2] = bad
    t1 = transform(lambda c, x, y: nufft1((6, 5), c, x, y, eps=1e-12, iflag=-1))
    t2 = transform(lambda f, x, y: nufft2(f, x, y, eps=1e-12))
    t3 = transform(lambda c, x, s: nufft3(c, x, s, eps=1e-12))
    _same_nans(t1(c, xb, y), _direct(1, c, [xb, y], n_modes=(6, 5)))
    assert np.isnan(t1(c, xb, y)).all()
    _same_nans(t2(f, xb, y), _direct(2, f, [xb, y]))
    _same_nans(t3(c, xb, s), _direct(3, c, [xb], [s]))
    _same_nans(t3(c, x, sb), _direct(3, c, [x], [sb]))
    assert np.isnan(t3(c, x, sb)).sum() == 1
    # a zero value at the bad point: 0·NaN is NaN in the direct sum too
    c0 = c.copy()
    c0[4] = 0
    assert np.isnan(t1(c0, xb, y)).all()


def test_finufft_non_finite_points_only_spoil_their_own_batch_row():
    pytest.importorskip("ducc0")
    from anybind.contrib.finufft import nufft1, nufft2
    r = np.random.default_rng(1)
    x = r.uniform(-3, 3, (3, 12))
    x[1, 5] = np.nan
    c = r.normal(size=(3, 12)) + 1j * r.normal(size=(3, 12))
    out = np.asarray(jax.vmap(lambda c, x: nufft1(8, c, x, eps=1e-12, iflag=-1))(c, x))
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2]]).any()
    _same_nans(out[0], _direct(1, c[0], [x[0]], n_modes=(8,)))
    f = r.normal(size=(3, 8)) + 1j * r.normal(size=(3, 8))
    out2 = np.asarray(nufft2(f, x, eps=1e-12))
    assert np.isnan(out2).sum() == 1 and np.isnan(out2[1, 5])


def test_finufft_plan_with_a_non_finite_point_is_an_error_naming_it():
    pytest.importorskip("ducc0")
    from anybind.contrib.finufft import Plan, Plan3
    x = np.linspace(-1, 1, 6)
    x[2] = np.inf
    with pytest.raises(ValueError, match=r"finufft.Plan: point array 0 has a NaN or infinite"):
        Plan(8, x)
    with pytest.raises(ValueError, match=r"finufft.Plan3: point array 0 has a NaN"):
        Plan3(np.linspace(-1, 1, 4), np.array([0.0, np.nan]))


def test_finufft_no_points_give_the_empty_sum():
    pytest.importorskip("ducc0")
    from anybind.contrib.ducc0 import nu2nu, nu2u, u2nu
    from anybind.contrib.finufft import Plan, Plan3, nufft1, nufft2, nufft3
    none, cnone = np.zeros(0), np.zeros(0, complex)
    g = np.ones((4, 3), complex)
    np.testing.assert_array_equal(nufft1((4, 3), cnone, none, none), np.zeros((4, 3)))
    np.testing.assert_array_equal(nufft1(5, np.zeros((2, 0), complex), none), np.zeros((2, 5)))
    assert nufft2(g, none, none).shape == (0,)
    np.testing.assert_array_equal(nufft3(cnone, none, np.ones(3)), np.zeros(3))
    assert nufft3(np.ones(3, complex), np.ones(3), none).shape == (0,)
    np.testing.assert_array_equal(Plan(5, none).nufft1(cnone), np.zeros(5))
    assert Plan(5, none).nufft2(np.ones(5, complex)).shape == (0,)
    np.testing.assert_array_equal(Plan3(none, np.ones(3)).nufft3(cnone), np.zeros(3))
    assert Plan3(np.ones(2), none).nufft3(np.ones(2, complex)).shape == (0,)
    np.testing.assert_array_equal(nu2u(cnone, np.zeros((0, 1)), n_modes=(4,)), np.zeros(4))
    assert u2nu(np.ones(4, complex), np.zeros((0, 1))).shape == (0,)
    np.testing.assert_array_equal(nu2nu(cnone, np.zeros((0, 1)), np.ones((2, 1))), np.zeros(2))
    # gradients of an empty sum: zero, and empty
    gx = jax.grad(lambda s: jnp.sum(jnp.abs(nufft3(cnone, none, s)) ** 2))(np.ones(3))
    np.testing.assert_array_equal(gx, np.zeros(3))
    gp = jax.grad(lambda x: jnp.sum(jnp.abs(nufft2(g, x, x)) ** 2))(none)
    assert gp.shape == (0,)


def test_finufft_no_modes_is_an_error_naming_nufft2():
    pytest.importorskip("ducc0")
    from anybind.contrib.ducc0 import u2nu
    from anybind.contrib.finufft import nufft1, nufft2
    x = np.zeros(3)
    with pytest.raises(ValueError, match="finufft.nufft2: the source's 2 trailing axes are "
                                         "the modes"):
        nufft2(np.ones((4, 0), complex), x, x)
    with pytest.raises(ValueError, match="finufft.nufft2"):
        jax.jit(nufft2)(np.ones(0, complex), x)
    with pytest.raises(ValueError, match="finufft.nufft1: output_shape"):
        nufft1(0, np.ones(3, complex), x)
    with pytest.raises(TypeError, match="'u2nu'.*the modes"):
        u2nu(np.ones((2, 0), complex), np.zeros((3, 1)))


# ------------------------------------------- the shim's temporary build folders

_SHIM_IN_A_TEMPORARY_FOLDER = """
    import os
    from anybind.routes import _shimlib
    _shimlib._installed = lambda: None  # as an install that built no shim
    lib = _shimlib.load.__wrapped__()  # built into a temporary folder, loaded, removed
    left = sorted(os.listdir(os.environ["TMPDIR"]))
    # the library stays usable once its file is gone
    assert lib.anybind_shim_version() == _shimlib.SHIM_VERSION
    assert lib.anybind_api_version() > 0
    print("LOADED", left)
"""


@pytest.mark.slow  # starts processes
def test_a_shim_built_in_a_temporary_folder_leaves_nothing_behind(tmp_path):
    import os
    import shutil
    if shutil.which("cc") is None and not os.environ.get("CC"):
        pytest.skip("no C compiler to build the shim")
    shared = tmp_path / "cache"
    (shared / "anybind").mkdir(parents=True)
    os.chmod(shared / "anybind", 0o777)  # open to others: the shim is built elsewhere
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"XDG_CACHE_HOME": str(shared), "TMPDIR": str(tmp)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for _ in range(3):
            out = fresh_stdout(run_fresh_python(_SHIM_IN_A_TEMPORARY_FOLDER, timeout=300))
            assert "LOADED []" in out, out
            assert not [p for p in tmp.iterdir() if p.name.startswith("anybind-shim-")]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert not list((shared / "anybind").iterdir())  # nothing went into the open folder


# ------------------------------------------- traced rules that need concrete values

def _numpy_rule_ops():
    vjp = ab.bind(lambda x: jnp.sin(x), traced=True, name="traced_numpy_vjp",
                  vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    jvp = ab.bind(lambda x: jnp.sin(x), traced=True, name="traced_numpy_jvp",
                  jvp=lambda p, t: np.cos(p[0]) * t[0])
    branch = ab.bind(lambda x: jnp.sin(x), traced=True, name="traced_branch_vjp",
                     vjp=lambda p, ct: (ct if float(p[0][0]) > 0 else -ct,))
    return {"vjp rule": vjp, "jvp rule": jvp, "vjp rule ": branch}


@pytest.mark.parametrize("how", ["grad", "jit", "export"])
def test_a_traced_rule_that_needs_concrete_values_names_the_op_and_rule(how):
    x = jnp.arange(1.0, 4.0)
    for rule, op in _numpy_rule_ops().items():
        g = jax.grad(lambda x, op=op: op(x).sum())
        run = {"grad": g, "jit": jax.jit(g),
               "export": lambda x, g=g: jax.export.export(jax.jit(g))(x)}[how]
        match = rf"anybind op '{op.name}': its {rule.strip()} is traced .* needs a concrete value"
        if how == "grad":  # eager: the rule may see concrete values, and then it is right
            try:
                np.testing.assert_allclose(run(x), np.cos(x) if "numpy" in op.name else 1.0)
            except TypeError as e:
                assert re.search(match, str(e)), e
            continue
        with pytest.raises(TypeError, match=match):
            run(x)


def test_a_traced_function_that_needs_concrete_values_names_the_op():
    op = ab.bind(lambda x: np.sin(x), traced=True, name="traced_numpy_fn", shape=ab.like(0))
    with pytest.raises(TypeError, match="anybind op 'traced_numpy_fn': its function is traced"):
        jax.jit(op)(jnp.arange(3.0))
    # the same rule as a host rule works, under jit and export's refusal names it
    good = ab.bind(lambda x: jnp.sin(x), traced=True, name="host_vjp_ok")
    good.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
    x = jnp.arange(1.0, 4.0)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: good(x).sum()))(x), np.cos(x))
    with pytest.raises(ValueError, match="anybind op 'host_vjp_ok': its vjp rule is Python "
                                         "host code, which jax.export cannot serialise"):
        jax.export.export(jax.jit(jax.grad(lambda x: good(x).sum())))(x)


# ------------------------------------------- to_torch: an error in JAX's backward

def _failing_backward():
    @jax.custom_vjp
    def bad_bwd(x):
        return jnp.sin(x)
    bad_bwd.defvjp(lambda x: (jnp.sin(x), x),
                   lambda r, ct: (_ for _ in ()).throw(ValueError("no backward here")))
    return bad_bwd


@pytest.mark.parametrize("how", ["backward", "autograd.grad", "create_graph", "func.grad"])
def test_to_torch_backward_error_names_the_op(how):
    torch = pytest.importorskip("torch")
    op = ab.to_torch(_failing_backward())
    x = torch.arange(3.0, dtype=torch.float64, requires_grad=True)
    # the op's vjp rule, or under create_graph its derived vjp op's function
    with pytest.raises(ab.HostError, match=r"anybind op 'bad_bwd(': the vjp rule|_vjp': the "
                                           r"function).*raised ValueError: no backward here"):
        if how == "backward":
            op(x).sum().backward()
        elif how == "autograd.grad":
            torch.autograd.grad(op(x).sum(), x)
        elif how == "create_graph":
            torch.autograd.grad(op(x).sum(), x, create_graph=True)
        else:
            torch.func.grad(lambda x: op(x).sum())(x.detach())
    # the forward alone still runs, and a good backward still gives the right gradient
    np.testing.assert_allclose(op(x).detach().numpy(), np.sin(np.arange(3.0)))
    good = ab.to_torch(jnp.sin)
    g, = torch.autograd.grad(good(x).sum(), x)
    np.testing.assert_allclose(g.numpy(), np.cos(np.arange(3.0)))


# ------------------------------------------- tampered exported programs

_TAMPERED = """
    import os, pathlib, select, signal, sys, time
    import jax, numpy as np
    import anybind as ab
    import compiled_ops

    def build():
        jax.config.update("jax_enable_x64", True)
        k = compiled_ops.clib("ctypes")
        op = ab.bind(k["mul"], shape=ab.like(0), name="tampered_mul", export_version="1",
                     vmap="sequential")
        x, y = np.arange(6.0).reshape(2, 3), np.full((2, 3), 2.0)
        return jax.jit(jax.vmap(op)), x, y  # by rows: the shim's row count is in the program

    def load(data, bit, said):
        _, x, y = build()
        if bit >= 0:
            data[bit // 8] ^= 1 << (bit % 8)
        try:
            exported = jax.export.deserialize(bytes(data))
            exported.mlir_module()  # JAX's reader has parsed the whole program
            said("READ ")
            out = exported.call(x, y)
            return "RAN " + str(np.asarray(out).ravel().tolist())
        except Exception as e:  # an error is fine; a hang or a crash is not
            return "ERROR " + type(e).__name__

    if sys.argv[1] == "export":
        f, x, y = build()
        pathlib.Path(sys.argv[2]).write_bytes(jax.export.export(f)(x, y).serialize())
        print("EXPORTED")
        sys.exit()
    # Each flip runs in a process of its own, forked from this one before JAX has started
    # a backend (the imports are shared, not the runtime); a child that has not answered
    # in TIMEOUT seconds is killed and reported as hung, one that dies of a signal as such.
    # "READ" comes first once JAX's reader has parsed the program: what happens before
    # it happens in JAX's reader, before any of anybind's code sees the program.
    TIMEOUT = float(sys.argv[3])
    data = bytearray(pathlib.Path(sys.argv[2]).read_bytes())
    for bit in map(int, sys.argv[4:]):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            said = lambda text: os.write(w, text.encode())
            try:
                answer = load(data, bit, said)
            except BaseException as e:
                answer = "FAILED " + repr(e)
            said(answer)
            os._exit(0)
        os.close(w)
        answer, deadline = b"", time.monotonic() + TIMEOUT
        while select.select([r], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            answer += chunk
        hung = time.monotonic() >= deadline
        if hung:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
        os.close(r)
        answer = answer.decode()
        if hung or os.WIFSIGNALED(status):
            where = "after JAX read it" if answer.startswith("READ") else "in JAX's reader"
            end = "HUNG" if hung else "DIED of " + signal.Signals(os.WTERMSIG(status)).name
            answer = f"{end} {where}"
        print(bit, answer.removeprefix("READ "), flush=True)
"""
TAMPERED_SAMPLE = 96  # single-bit flips tried, each in its own process (of ~13,500 bits)


@pytest.mark.slow  # starts a process per flipped bit
def test_every_sampled_bit_flip_of_an_exported_program_errors_or_runs(tmp_path):
    """A flipped bit of a program JAX reads gives an error or a result, never a hang or a
    crash. JAX's own reader (jax 0.12) hangs or aborts on some flips of the StableHLO
    bytes (found by flipping every bit of this program, each in its own process): those
    happen before anybind sees the program, and ab.serialize's digest turns them into
    errors (the next test); here they are told apart and left to JAX."""
    pytest.importorskip("flatbuffers")
    script = tmp_path / "tampered.py"
    script.write_text(__import__("textwrap").dedent(_TAMPERED))
    program = tmp_path / "program.bin"

    def run(*args):
        return fresh_stdout(run_fresh_python(
            f"import sys; sys.argv = ['', *{list(map(str, args))!r}]; "
            f"exec(open({str(script)!r}).read())", timeout=900))
    assert "EXPORTED" in run("export", program)
    assert run("run", program, 90, -1) == "-1 RAN [0.0, 4.0, 8.0, 12.0, 16.0, 20.0]\n"
    n_bits = 8 * program.stat().st_size
    bits = sorted(int(b) for b in np.random.default_rng(0).choice(n_bits, TAMPERED_SAMPLE,
                                                                  replace=False))
    answers = dict(line.split(" ", 1) for line in run("run", program, 60, *bits).splitlines())
    assert sorted(map(int, answers)) == bits, answers
    for bit, answer in answers.items():
        where = f"flipping bit {int(bit) % 8} of byte {int(bit) // 8}"
        assert answer.startswith(("RAN", "ERROR")) or answer.endswith("in JAX's reader"), \
            f"{where}: {answer}"


def test_every_single_bit_flip_of_a_sealed_program_is_an_error_before_jax_reads_it():
    """JAX's reader aborts the process on some single-bit flips of a program's StableHLO
    bytes (jax 0.12; found by flipping every bit of the program above, each in its own
    process). ab.serialize seals a program with its digest, and ab.deserialize checks
    it first: every flip, of the header, the digest or the program, is an error."""
    import compiled_ops
    op = ab.bind(compiled_ops.clib("ctypes")["mul"], shape=ab.like(0), name="sealed_mul")
    x, y = jnp.arange(6.0), jnp.full(6, 2.0)
    data = ab.serialize(jax.export.export(jax.jit(op))(x, y))
    np.testing.assert_array_equal(ab.deserialize(data).call(x, y), x * y**2)
    np.testing.assert_array_equal(ab.deserialize(bytearray(data)).call(x, y), x * y**2)
    for bit in range(8 * len(data)):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ValueError, match="anybind: this exported program is damaged"):
            ab.deserialize(flipped)
    for cut in (len(data) - 1, 40, 20):
        with pytest.raises(ValueError, match="damaged"):
            ab.deserialize(data[:cut])
    # JAX's own bytes still load as they are
    plain = jax.export.export(jax.jit(op))(x, y).serialize()
    np.testing.assert_array_equal(ab.deserialize(plain).call(x, y), x * y**2)
