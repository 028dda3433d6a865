"""The benchmark suite imports, and one route computes the right numbers (no timing asserted)."""
import importlib.util
from pathlib import Path

import numpy as np

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def _load_run():
    spec = importlib.util.spec_from_file_location("anybind_benchmarks_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_anybind_route_at_n1_is_right_and_measurable():
    run = _load_run()
    fn, args = run.routes.calls(1)["anybind"]
    x1, x2 = (np.asarray(a) for a in args)
    np.testing.assert_allclose(np.asarray(fn(*args)), x1 * x2**2, rtol=1e-15)
    res = run.measure({"anybind": run._thunk(fn, args)}, repeats=1, sample_s=0.0,
                      warmup_s=0.0)
    assert res["anybind"]["calls_per_sample"] == 1
    assert np.isfinite(res["anybind"]["min_us"])


def test_ffi_routes_agree_per_call_and_inside_the_scan():
    """The compiled routes and the hand-written C++ handler compute f (no timing)."""
    run = _load_run()
    run.check(run.ffi_routes.calls(3))
    run.check(run.ffi_routes.scans(3))
    text = run.ffi_routes.table(
        {1: {name: {"min_us": 1.0, "median_us": 2.0} for name in run.ffi_routes.functions()}},
        {name: {"min_us": 1.0, "median_us": 2.0} for name in run.ffi_routes.functions()})
    assert "hand-written C++ FFI" in text and "anybind compiled (C)" in text


def test_host_scan_routes_agree_and_take_their_routes():
    """benchmarks/host_scan.py: every route computes f inside the scan (no timing)."""
    run = _load_run()  # first: it puts benchmarks/ on the path and sets x64
    spec = importlib.util.spec_from_file_location("anybind_benchmarks_host_scan",
                                                  RUN.parent / "host_scan.py")
    host_scan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_scan)
    cases = host_scan.cases()
    run.check(cases)
    assert {"buffer_callback", "anybind, buffer callback"} <= set(cases)
    res = host_scan.main(["--rounds", "1", "--repeats", "1", "--sample-ms", "0"])
    assert all(np.isfinite(r["min_us"]) for r in res.values())


def test_recipes_benchmark_residual_choices_give_the_gradient():
    """benchmarks/recipes.py's two def_fwd/def_bwd forms of sin(x)·cos(x)·y² (the
    residual-choice example of docs/guides/recipes.md): both give the analytic gradient."""
    import jax
    import jax.numpy as jnp
    spec = importlib.util.spec_from_file_location(
        "anybind_benchmarks_recipes", RUN.parent / "recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x, y = np.linspace(-2.0, 2.0, 9), np.linspace(0.5, 1.5, 9)
    ref = lambda x, y: jnp.sum(jnp.sin(x) * jnp.cos(x) * y**2)
    want = jax.grad(ref, argnums=(0, 1))(x, y)
    for name, op in module.sincos_ops().items():
        got = jax.jit(jax.grad(lambda x, y: jnp.sum(op(x, y)), argnums=(0, 1)))(x, y)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-13, atol=1e-14,
                                       err_msg=name)


def test_contrib_group_routes_agree_and_are_measurable():
    """The contrib group's smallest cases: each library's route agrees with anybind's."""
    run = _load_run()
    for grad in (False, True):
        cases = run.contrib_routes.c2c(1_000, grad)
        run.check(cases)
        res = run.measure({k: run._thunk(f, a) for k, (f, a) in cases.items()}, repeats=1,
                          sample_s=0.0, warmup_s=0.0)
        assert all(np.isfinite(r["min_us"]) for r in res.values())
