#!/usr/bin/env python
"""GPU: compiled device code against a hand-written XLA FFI handler, and where the
microseconds of a Python device op and of the bridges on CUDA go.

    python benchmarks/gpu_compiled.py [--repeats N] [--json PATH] [--build DIR]

Needs a CUDA GPU seen by JAX, nvcc, and CuPy (the bridges' rows also torch).
It builds ``tests/cuda/cube.cu`` (launchers of ``ab.GPU_SIGNATURE``) and
``tests/cuda/native_ffi.cu`` (x³ as an XLA FFI handler written against XLA's
C++ FFI API, the floor of a custom call) with nvcc for the device it runs on,
checks the compiled op on fresh random inputs (float32 and float64, jit, grad,
jvp, vmap by rows and whole), then times, µs per call:

- ``dispatch``: x³ at n = 1, 10³, 10⁶ float32, jitted, with the result ready
  (``block_until_ready``), round-robin (``run.measure``): native jnp, the
  hand-written FFI handler, the anybind compiled op (``device=True``), the same
  op under ``jit(grad)`` against jnp's, and a CuPy device op (Python);
- ``in-program``: 1000 calls in one ``lax.fori_loop`` at n = 1, per call: what a
  custom call costs inside a compiled program, without JAX's dispatch;
- ``python device op``: where a CuPy device op's microseconds go, timed inside
  its callback on the host: the stream, the views, the runner and checks, the
  user's function; the rest of the call is XLA's Python callback machinery;
- ``bridges``: ``ab.to_torch`` and ``ab.from_torch`` on CUDA, whole and in pieces
  (DLPack each way, the jitted call, torch's own call).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import run  # noqa: F401  (imports jax, x64 on)

import anybind as ab

HERE = Path(__file__).resolve().parent
CUDA = HERE.parent / "tests" / "cuda"


def build(out: Path) -> tuple[ctypes.CDLL, ctypes.CDLL, str]:
    """nvcc builds of the launchers and of the hand-written FFI handler."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    arch = "sm_{}{}".format(*jax.devices("gpu")[0].compute_capability.split("."))
    include = jax.ffi.include_dir()
    common = [nvcc, "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC"]
    subprocess.run(common + [str(CUDA / "cube.cu"), "-o", str(out / "libcube.so")],
                   check=True)
    subprocess.run(common + ["-std=c++17", f"-I{include}", str(CUDA / "native_ffi.cu"),
                             "-o", str(out / "libnative_ffi.so")], check=True)
    version = subprocess.run([nvcc, "--version"], capture_output=True,
                             text=True).stdout.strip().splitlines()[-1]
    return ctypes.CDLL(str(out / "libcube.so")), ctypes.CDLL(str(out / "libnative_ffi.so")), \
        version


def compiled_ops(lib):
    restype, argtypes = ab.ctypes_signature(device=True)
    for f in (lib.cube, lib.cube_jvp, lib.refuses):
        f.restype, f.argtypes = restype, argtypes
    cube = ab.bind(lib.cube, shape=ab.like(0), device=True, host=lambda x: x * x * x,
                   name="bench_compiled_cube")
    cube.def_jvp(lib.cube_jvp, device=True, host=lambda p, t: 3 * p[0] * p[0] * t[0])
    cube.def_vjp(lib.cube_jvp, device=True, host=lambda p, ct: (3 * p[0] * p[0] * ct,))
    whole = ab.bind(lib.cube, shape=ab.like(0), device=True, host=lambda x: x * x * x,
                    vmap="expand_dims", name="bench_compiled_cube_whole")
    refuses = ab.bind(lib.refuses, shape=ab.like(0), device=True, name="bench_refuses")
    return cube, whole, refuses


def native_op():
    def cube(x):
        return jax.ffi.ffi_call("bench_native_cube",
                                jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return cube


def checks(cube, whole, refuses, native, gpu) -> dict:
    """The compiled op against NumPy on fresh random inputs; its error reaches the caller."""
    rng = np.random.default_rng(0)
    out = {}
    for dtype, tol in ((np.float32, 1e-6), (np.float64, 1e-14)):
        x = rng.standard_normal(1000).astype(dtype)
        t = rng.standard_normal(1000).astype(dtype)
        xd = jax.device_put(x, gpu)
        np.testing.assert_allclose(np.asarray(jax.jit(cube)(xd)), x ** 3, rtol=tol)
        g = jax.jit(jax.grad(lambda x, t: (cube(x) * t).sum()))(xd, jnp.asarray(t))
        np.testing.assert_allclose(np.asarray(g), 3 * x ** 2 * t, rtol=tol)
        _, jt = jax.jit(lambda x, t: jax.jvp(cube, (x,), (t,)))(xd, jnp.asarray(t))
        np.testing.assert_allclose(np.asarray(jt), 3 * x ** 2 * t, rtol=tol)
        xb = x.reshape(10, 100)
        for op in (cube, whole):
            np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(op))(xb)), xb ** 3,
                                       rtol=tol)
        out[np.dtype(dtype).name] = "ok"
    x = rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(native)(jax.device_put(x, gpu))), x ** 3,
                               rtol=1e-6)
    try:
        jax.jit(refuses)(jnp.ones(3)).block_until_ready()
        out["error"] = "no error raised"
    except Exception as e:  # noqa: BLE001  (what the user sees)
        out["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    try:
        jax.jit(cube)(jnp.ones(3, jnp.int32)).block_until_ready()
        out["int32"] = "no error raised"
    except Exception as e:  # noqa: BLE001
        out["int32"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return out


def dispatch(fs: dict, gpu, repeats: int) -> list[dict]:
    rows = []
    for n in (1, 1000, 10**6):
        x = jax.device_put(jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32), gpu)
        thunks = {}
        for name, f in fs.items():
            g = jax.jit(f)
            thunks[name] = lambda g=g, x=x: g(x).block_until_ready()
        timed = run.measure(thunks, repeats, 0.02)
        for name, t in timed.items():
            rows.append({"n": n, "route": name, "min_us": t["min_us"],
                         "median_us": t["median_us"]})
    return rows


def in_program(fs: dict, gpu, calls: int = 1000) -> dict:
    """µs per call of each op inside one program: ``calls`` calls in a fori_loop."""
    x = jax.device_put(jnp.full((1,), 0.5, jnp.float32), gpu)
    res = {}
    for name, f in fs.items():
        g = jax.jit(lambda x, f=f: jax.lax.fori_loop(0, calls, lambda i, y: f(y) + 0.5, x))
        g(x).block_until_ready()
        samples = []
        for _ in range(7):
            t0 = time.perf_counter()
            g(x).block_until_ready()
            samples.append((time.perf_counter() - t0) / calls * 1e6)
        res[name] = {"min_us": min(samples), "median_us": statistics.median(samples)}
    return res


def python_device_op(cp, gpu, repeats: int) -> dict:
    """Where a CuPy device op's µs go: timers inside its callback, on the host."""
    from anybind.core import _lifetime
    from anybind.routes import _gpu_device
    marks: dict[str, list[float]] = {"callback": [], "stream": [], "user": []}
    orig_held, orig_stream = _lifetime.held, _gpu_device.external_stream

    def held(ctx, cb):
        def timed(*a):
            t0 = time.perf_counter_ns()
            r = cb(*a)
            marks["callback"].append((time.perf_counter_ns() - t0) / 1e3)
            return r
        return orig_held(ctx, timed)

    class TimedStream:
        def __init__(self, xp, ptr):
            t0 = time.perf_counter_ns()
            self.s = orig_stream(xp, ptr)
            self.t = time.perf_counter_ns() - t0

        def __enter__(self):
            t0 = time.perf_counter_ns()
            self.s.__enter__()
            self.t += time.perf_counter_ns() - t0

        def __exit__(self, *exc):
            t0 = time.perf_counter_ns()
            self.s.__exit__(*exc)
            marks["stream"].append((self.t + time.perf_counter_ns() - t0) / 1e3)

    kernel = cp.ElementwiseKernel("T x", "T y", "y = x * x * x", "bench_breakdown_cube")

    def user(x, *, out):
        t0 = time.perf_counter_ns()
        kernel(x, out)
        marks["user"].append((time.perf_counter_ns() - t0) / 1e3)

    _lifetime.held, _gpu_device.external_stream = held, TimedStream
    x = jax.device_put(jnp.ones(1, jnp.float32), gpu)
    try:
        op = ab.bind(user, shape=ab.like(0), out=True, device=True, host=lambda x: x ** 3,
                     name="bench_breakdown")
        f = jax.jit(op)
        total = run.measure({"device op": lambda: f(x).block_until_ready()}, repeats, 0.02)
    finally:
        _lifetime.held, _gpu_device.external_stream = orig_held, orig_stream
    med = {k: statistics.median(v) for k, v in marks.items() if v}
    med["call"] = total["device op"]["median_us"]
    med["call_min"] = total["device op"]["min_us"]
    # pieces outside any timer: views, runner and checks; XLA's machinery
    med["views+runner+checks"] = med["callback"] - med["stream"] - med["user"]
    med["variants"] = _variants(cp, kernel, x, repeats)
    # the pieces alone, in a loop here
    a = cp.ones(1, cp.float32)
    s = cp.cuda.get_current_stream().ptr
    med["alone: external_stream enter+exit"] = _loop(
        lambda: _enter_exit(orig_stream(cp, s)))
    med["alone: cupy.asarray(cupy array)"] = _loop(lambda: cp.asarray(a))
    med["alone: kernel launch"] = _loop(lambda: kernel(a, a))
    o = cp.empty(1, cp.float32)
    med["alone: kernel launch, new result"] = _loop(lambda: kernel(a))
    med["alone: out[...] = r"] = _loop(lambda: o.__setitem__(Ellipsis, a))
    med["alone: cupy.copyto(out, r)"] = _loop(lambda: cp.copyto(o, a))
    med["alone: memcpy async"] = _loop(lambda: o.data.copy_from_device_async(a.data, a.nbytes))
    return med


def _variants(cp, kernel, x, repeats: int) -> dict:
    """The whole call, µs (min, median), as it is and with candidate cuts patched in."""
    from anybind.routes import _gpu_device
    orig_stream, orig_views = _gpu_device.external_stream, _gpu_device.views_of
    streams: dict = {}

    def cached_stream(xp, ptr):
        s = streams.get(ptr)
        if s is None:
            s = streams[ptr] = orig_stream(xp, ptr)
        return s

    def pointer_views(xp, buffers, avals):
        dev = xp.cuda.runtime.getDevice()
        res = []
        for b, a in zip(buffers, avals):
            dtype = np.dtype(a.dtype)
            size = int(np.prod(a.shape, dtype=np.int64)) * dtype.itemsize
            mem = xp.cuda.UnownedMemory(b.__cuda_array_interface__["data"][0], size, b, dev)
            res.append(xp.ndarray(a.shape, dtype, xp.cuda.MemoryPointer(mem, 0)))
        return res

    variants = {"returns a new array (copied into XLA's)": (False, None, None),
                "out=True": (True, None, None),
                "out=True, stream object cached": (True, cached_stream, None),
                "out=True, views over the pointer": (True, None, pointer_views),
                "out=True, both": (True, cached_stream, pointer_views)}
    thunks = {}
    try:
        for i, (name, (inplace, stream, views)) in enumerate(variants.items()):
            if inplace:
                def into(x, *, out):
                    kernel(x, out)
                op = ab.bind(into, shape=ab.like(0), out=True, device=True,
                             host=lambda x: x ** 3, name=f"bench_variant{i}")
            else:
                op = ab.bind(lambda x: kernel(x), shape=ab.like(0), device=True,
                             host=lambda x: x ** 3, name=f"bench_variant{i}")
            f = jax.jit(op)

            def thunk(f=f, stream=stream, views=views):
                _gpu_device.external_stream = stream or orig_stream
                _gpu_device.views_of = views or orig_views
                f(x).block_until_ready()
            thunk()
            np.testing.assert_allclose(np.asarray(f(x)), np.asarray(x) ** 3)
            thunks[name] = thunk
        timed = run.measure(thunks, repeats, 0.02)
    finally:
        _gpu_device.external_stream, _gpu_device.views_of = orig_stream, orig_views
    return {k: [v["min_us"], v["median_us"]] for k, v in timed.items()}


def _enter_exit(s):
    with s:
        pass


def _loop(f, n: int = 2000) -> float:
    for _ in range(100):
        f()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f()
        samples.append((time.perf_counter_ns() - t0) / n / 1e3)
    return min(samples)


def bridges(torch, gpu, repeats: int) -> dict:
    """ab.to_torch and ab.from_torch on CUDA: whole, and their pieces."""
    from anybind.torch._jax_engine import _jax_view
    res = {}
    x = torch.linspace(-1.0, 1.0, 1, dtype=torch.float32, device="cuda")
    xg = x.clone().requires_grad_(True)
    to_torch = ab.to_torch(lambda x: x * x * x, name="bench_bridge_to_torch")
    from_torch = ab.from_torch(lambda x: x * x * x, name="bench_bridge_from_torch",
                               mode="call")
    jcube = jax.jit(lambda x: x * x * x)
    xj = jax.device_put(jnp.ones(1, jnp.float32), gpu)
    jf = jax.jit(from_torch)
    jg = jax.jit(jax.grad(lambda x: from_torch(x).sum()))

    def sync(f):
        def g():
            f()
            torch.cuda.synchronize()
        return g

    def backward(f):
        def g():
            xg.grad = None
            f(xg).sum().backward()
            torch.cuda.synchronize()
        return g
    thunks = {
        "torch x*x*x": sync(lambda: x * x * x),
        "ab.to_torch": sync(lambda: to_torch(x)),
        "torch x*x*x +backward": backward(lambda x: x * x * x),
        "ab.to_torch +backward": backward(to_torch),
        "jax jit x*x*x (ready)": lambda: jcube(xj).block_until_ready(),
        "ab.from_torch (jit)": lambda: jf(xj).block_until_ready(),
        "ab.from_torch jit(grad)": lambda: jg(xj).block_until_ready(),
    }
    timed = run.measure(thunks, repeats, 0.02)
    res.update({k: {"min_us": v["min_us"], "median_us": v["median_us"]}
                for k, v in timed.items()})
    # pieces, host µs without synchronising (what each adds to the call)
    ja = jcube(xj)
    res["piece: jax.dlpack.from_dlpack(torch cuda)"] = _loop(lambda: _jax_view(x), 500)
    res["piece: torch.from_dlpack(jax.Array)"] = _loop(lambda: torch.from_dlpack(ja), 500)
    res["piece: jax jit dispatch (no wait)"] = _loop(lambda: jcube(xj), 500)
    res["piece: torch x*x*x (no wait)"] = _loop(lambda: x * x * x, 500)
    # jax.dlpack.from_dlpack's own pieces
    from jax._src import xla_bridge
    from jax._src.lib import _jax
    pieces = {
        "stream for external ready events": lambda: gpu.get_stream_for_external_ready_events(),
        "get_backend + device_from_local_hardware_id": lambda: xla_bridge.get_backend(
            "cuda").device_from_local_hardware_id(0),
        "torch __dlpack__(stream=XLA's)": lambda: x.__dlpack__(
            stream=gpu.get_stream_for_external_ready_events(), max_version=(1, 0)),
        "torch __dlpack__(stream=XLA's) + dlpack_managed_tensor_to_buffer":
            lambda: _jax.dlpack_managed_tensor_to_buffer(x.__dlpack__(
                stream=gpu.get_stream_for_external_ready_events(), max_version=(1, 0)),
                gpu, gpu.get_stream_for_external_ready_events(), None, 2),
        "torch __dlpack__() + dlpack_managed_tensor_to_buffer (no stream)":
            lambda: _jax.dlpack_managed_tensor_to_buffer(x.__dlpack__(max_version=(1, 0)),
                                                         gpu, None, None, 2),
        "torch.utils.dlpack.to_dlpack": lambda: torch.utils.dlpack.to_dlpack(x),
        "torch.cuda.ExternalStream(XLA's) enter+exit": lambda: _enter_exit(
            torch.cuda.stream(torch.cuda.ExternalStream(
                gpu.get_stream_for_external_ready_events()))),
    }
    for name, f in pieces.items():
        try:
            res[f"piece: {name}"] = _loop(f, 500)
        except Exception as e:  # noqa: BLE001  (a private entry point of another version)
            res[f"piece: {name}"] = f"failed: {type(e).__name__}: {e}"[:200]
    return res


def profile_bridges(torch, gpu, calls: int = 2000) -> dict:
    """Where ``ab.to_torch``'s host time goes on CUDA tensors: cProfile of ``calls``
    forward calls (and of ``ab.from_torch`` jitted), the top functions by own time."""
    import cProfile
    import io
    import pstats
    x = torch.linspace(-1.0, 1.0, 1, dtype=torch.float32, device="cuda")
    to_torch = ab.to_torch(lambda x: x * x * x, name="bench_profile_to_torch")
    from_torch = jax.jit(ab.from_torch(lambda x: x * x * x, name="bench_profile_from_torch",
                                           mode="call"))
    xj = jax.device_put(jnp.ones(1, jnp.float32), gpu)
    res = {}
    for name, f in (("ab.to_torch", lambda: to_torch(x)),
                    ("ab.from_torch (jit)", lambda: from_torch(xj))):
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            f()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        res[name] = out.getvalue()
        print(f"profile of {name}, {calls} calls:\n{res[name]}", flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--build", default=None)
    parser.add_argument("--only", default="checks,dispatch,in-program,python,bridges")
    args = parser.parse_args()
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        sys.exit(f"benchmarks/gpu_compiled.py needs a CUDA GPU seen by JAX: {e}")
    out = Path(args.build or tempfile.mkdtemp(prefix="ab-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    lib, native_lib, nvcc = build(out)
    jax.ffi.register_ffi_target("bench_native_cube", jax.ffi.pycapsule(native_lib.NativeCube),
                                platform="CUDA")
    cube, whole, refuses = compiled_ops(lib)
    native = native_op()
    results = {"device": gpu.device_kind, "jax": jax.__version__, "jaxlib":
               jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
               "nvcc": nvcc, "python": platform.python_version(),
               "driver": _driver(), "sections": {}}
    only = set(args.only.split(","))
    sections = results["sections"]
    try:
        import cupy as cp
        results["cupy"] = cp.__version__
    except ImportError:
        cp = None
    try:
        import torch
        results["torch"] = torch.__version__
    except ImportError:
        torch = None
    def section(name, f, *a):
        """One section; a failure is printed and recorded, and the others still run."""
        try:
            sections[name] = f(*a)
        except Exception:  # noqa: BLE001  (report it, go on)
            import traceback
            sections[name] = {"failed": traceback.format_exc()}
            print(f"{name} failed:\n{sections[name]['failed']}", flush=True)
            return False
        return True
    if "checks" in only and section("checks", checks, cube, whole, refuses, native, gpu):
        print("checks:", sections["checks"], flush=True)
    fs = {"native jnp": lambda x: x * x * x, "hand-written FFI handler": native,
          "anybind compiled": cube,
          "jit(grad) native jnp": jax.grad(lambda x: (x * x * x).sum()),
          "jit(grad) anybind compiled": jax.grad(lambda x: cube(x).sum())}
    if cp is not None:
        k = cp.ElementwiseKernel("T x", "T y", "y = x * x * x", "bench_cupy_cube")
        fs["anybind CuPy device op"] = ab.bind(lambda x: k(x), shape=ab.like(0),
                                               device=True, host=lambda x: x ** 3,
                                               vmap="vectorized", name="bench_cupy_cube")
    if "dispatch" in only and section("dispatch", dispatch, fs, gpu, args.repeats):
        _table(sections["dispatch"])
    if "in-program" in only and section(
            "in_program", in_program,
            {k: v for k, v in fs.items() if not k.startswith("jit(grad)")}, gpu):
        print("in-program, µs per call:", json.dumps(sections["in_program"], indent=1),
              flush=True)
    if "python" in only and cp is not None and section(
            "python_device_op", python_device_op, cp, gpu, args.repeats):
        print("python device op, median µs:",
              json.dumps(sections["python_device_op"], indent=1), flush=True)
    if "bridges" in only and torch is not None and torch.cuda.is_available() and section(
            "bridges", bridges, torch, gpu, args.repeats):
        print("bridges:", json.dumps(sections["bridges"], indent=1), flush=True)
    if "profile" in only and torch is not None and torch.cuda.is_available():
        section("profile", profile_bridges, torch, gpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _driver() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("NVIDIA_DRIVER_VERSION")


def _table(rows: list[dict]) -> None:
    print("| n | route | min µs | median µs |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['n']:,} | {r['route']} | {r['min_us']:.1f} | {r['median_us']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
