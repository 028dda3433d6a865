#!/usr/bin/env python
"""Eager costs that compiled code hides: derivatives of traced code applied eagerly,
and host code that calls JAX.

    python benchmarks/eager.py [--repeats 5] [--out eager.json]

- ``eager grad, first call``: ``jax.grad`` of a traced op (forty operations of
  ``jax.numpy``, no derivative rules) with no ``jit``, on a shape not seen before
  (a fresh op each sample): what the first eager gradient costs, compiling included;
  with the programs JAX lowers for it counted.
- ``eager grad, next call``: the same gradient again (compiled already).
- ``jit(grad), first call``: the same gradient under ``jax.jit``, the reference.
- ``host code calling JAX``: a jitted call of an op whose host code runs a jitted
  ``jnp.cos`` and an eager ``jnp.sin`` on its input (a zero-copy transfer of the
  input's view into JAX), against the same op whose host code uses NumPy.

Times are seconds (first calls) or µs per call (steady state): min over samples.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import monitoring

import anybind as ab

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent
_LOWERED: list = []
monitoring.register_event_duration_secs_listener(
    lambda event, d, **kw: _LOWERED.append(d)
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)


def _chain(x, y):
    for k in range(10):
        x = jnp.sin(x) * y + 0.3 * jnp.cos(x * (k + 1)) - x / (k + 2)
    return x


def _first(make, repeats: int) -> tuple[float, int]:
    """min seconds of a first call over fresh functions and shapes, and the programs
    lowered for the last one."""
    best = float("inf")
    for r in range(repeats):
        f, args = make(17 + r)
        del _LOWERED[:]
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best, len(_LOWERED)


def _steady_us(f, args, n: int = 200) -> float:
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            jax.block_until_ready(f(*args))
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def eager_grad(repeats: int) -> dict:
    def make(n, jitted=False):
        op = ab.bind(_chain, traced=True, name=f"chain{n}")
        g = jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1))
        x = np.linspace(0.1, 1.0, n)
        return (jax.jit(g) if jitted else g), (x, x + 1)
    first, programs = _first(make, repeats)
    jit_first, jit_programs = _first(lambda n: make(n, True), repeats)
    g, args = make(33)
    return {"eager grad, first call (s)": first, "eager grad, programs lowered": programs,
            "eager grad, next call (µs)": _steady_us(g, args),
            "jit(grad), first call (s)": jit_first, "jit(grad), programs lowered": jit_programs}


def host_calls_jax() -> dict:
    cos = jax.jit(jnp.cos)
    calls = ab.bind(lambda x: np.asarray(cos(x)) + np.asarray(jnp.sin(x)), shape=ab.like(0),
                    name="calls_jax")
    numpy = ab.bind(lambda x: np.cos(x) + np.sin(x), shape=ab.like(0), name="numpy_only")
    x = jnp.linspace(0.0, 1.0, 1000)
    return {"host code calling JAX, jit call (µs)": _steady_us(jax.jit(calls), (x,), 50),
            "host code in NumPy, jit call (µs)": _steady_us(jax.jit(numpy), (x,), 50)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "eager.json"))
    a = ap.parse_args()
    res = {**eager_grad(a.repeats), **host_calls_jax()}
    res["machine"] = f"{platform.processor() or platform.machine()}, jax {jax.__version__}"
    for k, v in res.items():
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
