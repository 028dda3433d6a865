"""Trust, round 4: host code that calls ops nests to the documented depth on the first
eager call and never deadlocks across threads; bad input to the finufft drop-in,
tampered exported programs and unclear errors; temporary folders cleaned up.

Anything that could crash or hang runs in a fresh process (``run_fresh_python``),
so that a segfault or a hang fails the test instead of ending the run.
"""
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
