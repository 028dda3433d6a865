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
