"""Tests run strict: x64 on, rank promotion raises, warnings are errors (pyproject).

The tests compile the same small programs again and again, in both xdist workers and
in every run: JAX's persistent compilation cache, kept per checkout in
``.pytest_cache/jax`` (``ANYBIND_TEST_JAX_CACHE`` names another folder; empty turns it
off), makes the fast loop about a tenth faster the first time and a third after. It
grows with each change that alters programs (about 8 MB per full run) and may be
deleted at any time. (JAX's size bound is not set: it locks the folder and scans it
on every read and write; in the one CI run with it set, the main test step took 12
minutes instead of 7.)

The PyTorch front end's tests (test_torch*.py), the bridges' (test_bridges*.py) and
test_trust_round4_torch.py need the ``torch`` extra; without it they are not collected
(CI's test step installs it).
"""
import importlib.util
import os
from pathlib import Path

# XLA's CPU code generation at LLVM's optimisation level 0, in this process and in every
# process the tests start (they inherit the environment): the same programs, lowered and
# optimised by XLA's own passes as before, with the same IEEE arithmetic (XLA enables no
# fast-math at any level); only LLVM's machine-code optimisations are left out, which
# tiny test arrays never repay. Measured on the quiet 2-core machine: the compositions,
# linear, multilinear and control-flow tests in 108 s instead of 136; in CI's clean-clone
# run, the whole suite's per-test times add up to 1,841 s instead of 1,987. An
# optimisation level already in XLA_FLAGS is kept (to test at XLA's default, run with
# XLA_FLAGS=--xla_backend_optimization_level=3); the benchmarks, which are not tests,
# keep JAX's defaults.
_O0 = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_O0}".strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
_CACHE = os.environ.get("ANYBIND_TEST_JAX_CACHE",
                        str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
if _CACHE:
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

collect_ignore_glob = [] if importlib.util.find_spec("torch") else [
    "test_torch*.py", "test_bridges*.py", "test_trust_round4_torch.py"]


def pytest_collection_modifyitems(items):
    """The docs pages first: the slowest tests (a process each, up to a minute), so
    that under ``-n 2 --dist worksteal`` no worker is left running one at the end while
    the other idles (about 18 s of CI's test step, by its per-test times)."""
    items.sort(key=lambda item: item.path.name != "test_docs.py")
