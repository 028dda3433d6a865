#!/usr/bin/env python
"""GPU: a device op (a CuPy elementwise kernel on XLA's buffers and stream) against
native ``jax.numpy`` and ``jax.pure_callback``, and SciPy host code in a GPU program.

    python benchmarks/gpu.py [--repeats N] [--json PATH]

Needs a CUDA GPU seen by JAX and CuPy (``pip install "jax[cuda12]" cupy-cuda12x``).
For n = 1 and n = 10⁶ float32 it times, round-robin in one run (``run.measure``),
µs per call with the result ready (``block_until_ready``):

- ``x³`` by native jnp, by an anybind device op (``device=True``), by
  ``jax.pure_callback`` on the host (a transfer each way), and by an anybind host
  op in the same GPU program (the same transfers, through XLA's GPU callback);
- ``jit(grad)`` of Σ x³ for each route (custom rules for the callbacks).
"""
from __future__ import annotations

import argparse
import json
import sys

import run  # noqa: F401  (imports jax, x64 on)

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab


def routes(cp) -> dict:
    kernel = cp.ElementwiseKernel("T x", "T y", "y = x * x * x", "ab_bench_cube")
    device = ab.bind(lambda x: kernel(x), shape=ab.like(0), device=True,
                     host=lambda x: x ** 3, vmap="vectorized", name="bench_cube_device")
    device.def_vjp(lambda p, ct: (3 * p[0] ** 2 * ct,), traced=True)
    host = ab.bind(lambda x: x ** 3, shape=ab.like(0), vmap="vectorized",
                   name="bench_cube_host")
    host.def_vjp(lambda p, ct: (3 * p[0] ** 2 * ct,), traced=True)

    @jax.custom_vjp
    def pure(x):
        return jax.pure_callback(lambda x: np.asarray(x) ** 3,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    pure.defvjp(lambda x: (pure(x), x), lambda x, ct: (3 * x ** 2 * ct,))
    return {"native jnp": lambda x: x ** 3, "anybind device": device,
            "pure_callback": pure, "anybind host": host}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        import cupy as cp
        gpu = jax.devices("gpu")[0]
    except Exception as e:  # noqa: BLE001  (no CuPy, or no GPU backend)
        sys.exit(f"benchmarks/gpu.py needs a CUDA GPU seen by JAX and CuPy: {e}")
    results = {"device": str(gpu.device_kind), "jax": jax.__version__, "rows": []}
    fs = routes(cp)
    for n in (1, 10**6):
        x = jax.device_put(jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32), gpu)
        want = x ** 3
        thunks = {}
        for what, wrap in (("forward", lambda f: f),
                           ("jit(grad)", lambda f: jax.grad(lambda x: f(x).sum()))):
            for name, f in fs.items():
                g = jax.jit(wrap(f))
                got = g(x)
                if what == "forward":
                    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                                               atol=1e-6)
                thunks[f"{what} {name}"] = lambda g=g: g(x).block_until_ready()
        timed = run.measure(thunks, args.repeats, 0.02)
        for key, t in timed.items():
            what, name = key.split(" ", 1)
            native = timed[f"{what} native jnp"]["min_us"]
            results["rows"].append({"n": n, "what": what, "route": name,
                                    "min_us": t["min_us"], "median_us": t["median_us"],
                                    "vs_native": t["min_us"] / native})
    print(f"{results['device']}, jax {results['jax']} (µs per call, min of "
          f"{args.repeats} round-robin samples)")
    print("| n | what | route | min µs | median µs | × native |\n|---|---|---|---:|---:|---:|")
    for r in results["rows"]:
        print(f"| {r['n']} | {r['what']} | {r['route']} | {r['min_us']:.1f} | "
              f"{r['median_us']:.1f} | {r['vs_native']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
