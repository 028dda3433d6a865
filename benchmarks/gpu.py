#!/usr/bin/env python
"""GPU: a device op (a CuPy elementwise kernel on XLA's buffers and stream) against
native ``jax.numpy`` and ``jax.pure_callback``, SciPy-style host code in a GPU
program, and the bridges on CUDA.

    python benchmarks/gpu.py [--repeats N] [--json PATH]

Needs a CUDA GPU seen by JAX and CuPy (``pip install "anybind[gpu]"``); the
bridges' rows also need a CUDA build of torch. For n = 1 and n = 10⁶ float32 it
times, round-robin in one run (``run.measure``), µs per call with the result
ready (``block_until_ready``, ``torch.cuda.synchronize``):

- ``x³`` by native jnp, by an anybind device op (``device=True``), by
  ``jax.pure_callback`` on the host (a transfer each way), by an anybind host
  op in the same GPU program (the same transfers, through XLA's GPU callback)
  and by ``ab.from_torch`` of the same torch code (torch on XLA's buffers);
  written ``x * x * x`` everywhere (NumPy's float32 ``x ** 3`` calls ``powf``
  per element: tens of ms at n = 10⁶, which would swamp the transfers);
- ``jit(grad)`` of Σ x³ for each route: each callback's vjp is a callback of the
  same route (``torch.func.vjp`` for the bridge);
- in torch, on CUDA tensors: native torch against ``ab.to_torch`` of the
  same JAX function, forward, and forward with ``backward``.
"""
from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import run  # noqa: F401  (imports jax, x64 on)

import anybind as ab


def _torch_cuda():
    """torch, if it is a CUDA build that sees the GPU; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def routes(cp, torch) -> dict:
    """x³ by each route; the callbacks' vjps are callbacks too (3x²·ȳ), so jit(grad)
    runs each route's own rule (the forward call is dead code there)."""
    cube = cp.ElementwiseKernel("T x", "T y", "y = x * x * x", "ab_bench_cube")
    dcube = cp.ElementwiseKernel("T x, T ct", "T y", "y = 3 * x * x * ct", "ab_bench_dcube")
    device = ab.bind(lambda x: cube(x), shape=ab.like(0), device=True,
                     host=lambda x: x * x * x, vmap="vectorized", name="bench_cube_device")
    device.def_vjp(lambda p, ct: (dcube(p[0], ct),), device=True,
                   host=lambda p, ct: (3 * p[0] * p[0] * ct,))
    host = ab.bind(lambda x: x * x * x, shape=ab.like(0), vmap="vectorized",
                   name="bench_cube_host")
    host.def_vjp(lambda p, ct: (3 * p[0] * p[0] * ct,))

    def callback(f, *args):
        return jax.pure_callback(lambda *a: f(*map(np.asarray, a)),
                                 jax.ShapeDtypeStruct(args[0].shape, args[0].dtype), *args)

    @jax.custom_vjp
    def pure(x):
        return callback(lambda x: x * x * x, x)
    pure.defvjp(lambda x: (pure(x), x),
                lambda x, ct: (callback(lambda x, ct: 3 * x * x * ct, x, ct),))
    fs = {"native jnp": lambda x: x * x * x, "anybind device": device,
          "pure_callback": pure, "anybind host": host}
    if torch is not None:
        fs["ab.from_torch"] = ab.from_torch(lambda x: x * x * x, name="bench_cube_torch",
                                           mode="call")
    return fs


def jax_rows(fs: dict, n: int, gpu, repeats: int) -> list[dict]:
    x = jax.device_put(jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32), gpu)
    want = np.asarray(x) ** 3
    thunks = {}
    for what, wrap in (("forward", lambda f: f),
                       ("jit(grad)", lambda f: jax.grad(lambda x: f(x).sum()))):
        for name, f in fs.items():
            g = jax.jit(wrap(f))
            got = g(x)
            if what == "forward":
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_allclose(np.asarray(got), 3 * np.asarray(x) ** 2,
                                           rtol=1e-5, atol=1e-6)
            thunks[f"{what} {name}"] = lambda g=g: g(x).block_until_ready()
    return _rows(run.measure(thunks, repeats, 0.02), n, "native jnp")


def torch_rows(torch, n: int, repeats: int) -> list[dict]:
    """In torch, on CUDA tensors: native against ab.to_torch of the JAX function."""
    to_torch = ab.to_torch(lambda x: x * x * x, name="bench_cube_to_torch")
    fs = {"native torch": lambda x: x * x * x, "ab.to_torch": to_torch}
    x = torch.linspace(-1.0, 1.0, n, dtype=torch.float32, device="cuda")
    xg = x.clone().requires_grad_(True)
    thunks = {}
    for name, f in fs.items():
        torch.testing.assert_close(f(x), x ** 3)
        xg.grad = None
        f(xg).sum().backward()
        torch.testing.assert_close(xg.grad, 3 * x ** 2)

        def forward(f=f):
            f(x)
            torch.cuda.synchronize()

        def backward(f=f):
            xg.grad = None
            f(xg).sum().backward()
            torch.cuda.synchronize()
        thunks[f"torch {name}"] = forward
        thunks[f"torch+backward {name}"] = backward
    return _rows(run.measure(thunks, repeats, 0.02), n, "native torch")


def _rows(timed: dict, n: int, base: str) -> list[dict]:
    rows = []
    for key, t in timed.items():
        what, name = key.split(" ", 1)
        native = timed[f"{what} {base}"]["min_us"]
        rows.append({"n": n, "what": what, "route": name, "min_us": t["min_us"],
                     "median_us": t["median_us"], "vs_native": t["min_us"] / native})
    return rows


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
    torch = _torch_cuda()
    results = {"device": str(gpu.device_kind), "jax": jax.__version__,
               "cupy": cp.__version__, "torch": torch and torch.__version__, "rows": []}
    fs = routes(cp, torch)
    for n in (1, 10**6):
        results["rows"] += jax_rows(fs, n, gpu, args.repeats)
        if torch is not None:
            results["rows"] += torch_rows(torch, n, args.repeats)
    print(f"{results['device']}, jax {results['jax']}, CuPy {results['cupy']}, torch "
          f"{results['torch']} (µs per call, min of {args.repeats} round-robin samples)")
    print("| n | what | route | min µs | median µs | × native |\n|---|---|---|---:|---:|---:|")
    for r in results["rows"]:
        print(f"| {r['n']:,} | {r['what']} | {r['route']} | {r['min_us']:.1f} | "
              f"{r['median_us']:.1f} | {r['vs_native']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
