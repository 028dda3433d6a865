#!/usr/bin/env python
"""GPU: what a CuPy view of XLA's buffer costs, by event timing on a busy device.

    python benchmarks/gpu_checks.py [--json PATH]

A program runs a chain of large matrix products, then a callback on a slice of
their result, so the GPU is still busy when XLA reaches the callback. Inside
the callback (XLA's buffer callback, as anybind's device route uses it) it
times, on the host, each way of making a CuPy array of XLA's buffer (min and
median of 200), and records an event on XLA's stream after them: an event not yet reached means the
view was made without waiting for the device. It prints the buffer's
``__cuda_array_interface__``, then per way: host µs, whether the device was
still busy after it, whether it is a view (same pointer). Then the same for an
anybind device op (``device=True``): host µs from the callback's start to the
function's first line, and whether the device was still busy there. The
``gpu``-marked tests assert what must hold; this prints the numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

import anybind as ab
from anybind.routes._gpu_device import external_stream

N_PRODUCTS, SIZE, REPEATS = 12, 8192, 200


def busy(f):
    """jit of (w, x) ↦ f(x[:64] + products of w): the GPU is busy when f runs."""
    def prog(w, x):
        for _ in range(N_PRODUCTS):
            w = jnp.tanh(w @ w) * 0.5
        return f(x + w[0, :x.shape[0]])
    return jax.jit(prog)


def ways(cp) -> dict:
    def unowned(b):  # a CuPy array over the pointer, no protocol involved
        cai = b.__cuda_array_interface__
        dtype, shape = np.dtype(cai["typestr"]), tuple(cai["shape"])
        size = int(np.prod(shape)) * dtype.itemsize
        mem = cp.cuda.UnownedMemory(cai["data"][0], size, b)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))
    return {"cupy.asarray": cp.asarray, "cupy.from_dlpack": cp.from_dlpack,
            "UnownedMemory": unowned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        import cupy as cp
        gpu = jax.devices("gpu")[0]
    except Exception as e:  # noqa: BLE001  (no CuPy, or no GPU backend)
        sys.exit(f"benchmarks/gpu_checks.py needs a CUDA GPU seen by JAX and CuPy: {e}")
    w = jax.device_put(jax.random.normal(jax.random.key(0), (SIZE, SIZE), jnp.float32) / 90,
                       gpu)
    x = jax.device_put(np.arange(64, dtype=np.float32), gpu)
    out = {"device": gpu.device_kind, "jax": jax.__version__, "cupy": cp.__version__}

    seen: dict = {}

    def callback(ctx, o, b):
        seen["cai"] = {k: v for k, v in b.__cuda_array_interface__.items()}
        seen["xla_stream"] = ctx.stream
        with external_stream(cp, ctx.stream):
            for name, make in ways(cp).items():
                times = []
                try:
                    for _ in range(REPEATS):
                        t0 = time.perf_counter()
                        v = make(b)
                        times.append((time.perf_counter() - t0) * 1e6)
                except Exception as e:  # noqa: BLE001  (recorded, not fatal)
                    seen[name] = {"error": repr(e)}
                    continue
                mark = cp.cuda.Event(disable_timing=True)
                mark.record()
                seen[name] = {"host_us_min": min(times), "host_us_median": statistics.median(times),
                              "busy_after": not mark.done,
                              "view": v.data.ptr == b.__cuda_array_interface__["data"][0]}
            cp.asarray(o)[...] = cp.asarray(b)
        return None

    raw = busy(lambda s: buffer_callback(callback, jax.ShapeDtypeStruct(s.shape, s.dtype))(s))
    for _ in range(3):  # compiled and warm; the last call is the one reported
        raw(w, x).block_until_ready()
    out["buffer_callback"] = {k: v for k, v in seen.items()}

    timing: dict = {}

    def fn(s, *, stream):
        timing["enter"] = time.perf_counter()
        mark = cp.cuda.Event(disable_timing=True)
        mark.record()
        timing["busy"] = not mark.done
        timing["stream"] = stream
        return s * 2

    def cb_start(s):  # the time the program reaches the op: a raw callback just before it
        def note(ctx, o, b):  # its output is its input (aliased): it touches no buffer
            timing["start"] = time.perf_counter()
        return buffer_callback(note, jax.ShapeDtypeStruct(s.shape, s.dtype),
                               input_output_aliases={0: 0})(s)

    op = ab.bind(fn, shape=ab.like(0), device=True, name="check_view")
    prog = busy(lambda s: op(cb_start(s)))
    for _ in range(3):
        got = prog(w, x).block_until_ready()
    want = busy(lambda s: s * 2)(w, x)
    out["anybind"] = {"host_us_to_function": (timing["enter"] - timing["start"]) * 1e6,
                      "busy_in_function": timing["busy"],
                      "stream_is_xlas": timing["stream"] == seen["xla_stream"],
                      "values_match": bool(np.allclose(np.asarray(got), np.asarray(want),
                                                       rtol=1e-6, atol=1e-6))}
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
