"""benchmarks/nufft.py builds its cases and every route agrees (no timing asserted)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import pytest

pytest.importorskip("ducc0")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "nufft.py"


@pytest.mark.slow  # compiles every case of the benchmark, in both libraries where they import
def test_nufft_benchmark_routes_agree():
    spec = importlib.util.spec_from_file_location("anybind_benchmarks_nufft", BENCH)
    nufft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nufft)
    p = nufft.problem(16, 300, 40)
    groups = nufft.cases(p, nthreads=1, cg_iters=3)
    assert {"type 1", "type 2", "type 3", "type 3, grad in points",
            "CG, 3 iterations"} <= set(groups)
    assert set(groups["CG, 3 iterations"]) >= {"anybind", "anybind, Plan"}
    with jax.numpy_rank_promotion("allow"):   # jax-finufft's rules rely on it
        for case, group in groups.items():
            nufft.check(group, case)
