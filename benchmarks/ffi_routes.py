"""The ``ffi`` group of ``run.py``: compiled code with no Python in the call.

The same function f(x1, x2) = x1·x2² (float64) by four routes, plus native
``jax.numpy`` as the reference every route is checked against:

- **anybind compiled (C)**: a C function of anybind's calling convention,
  reached through ctypes and bound with ``ab.bind``: one XLA FFI call to
  anybind's shim, which calls it;
- **anybind compiled (Numba)**: the same loop as a Numba ``@cfunc``;
- **hand-written C++ FFI**: an XLA FFI handler written against
  ``xla/ffi/api/ffi.h`` with the same loop, built here with the system C++
  compiler and called with ``jax.ffi.ffi_call``, the best a user can do by hand;
- **anybind Python**: the NumPy function bound with ``ab.bind`` (``routes.ab_mul``);
- **buffer_callback**: raw ``jax.experimental.buffer_callback`` on the same NumPy.

``calls(n)`` times one jitted call; ``scans()`` a ``lax.scan`` of 1000 steps
at n = 1 that calls f at every step, which gives the per-call cost inside a
compiled program with no dispatch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab
import routes

STEPS = 1000

C_SOURCE = r"""
#include <stdint.h>
int32_t mul(void *const *ins, void *const *outs, const int64_t *const *shapes,
            const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out,
            char *err, int64_t err_size) {
  const double *x1 = ins[0], *x2 = ins[1];
  double *y = outs[0];
  int64_t n = 1;
  for (int64_t d = 0; d < ranks[0]; ++d) n *= shapes[0][d];
  for (int64_t i = 0; i < n; ++i) y[i] = x1[i] * x2[i] * x2[i];
  return 0;
}
"""

CPP_SOURCE = r"""
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

static ffi::Error MulImpl(ffi::Buffer<ffi::F64> x1, ffi::Buffer<ffi::F64> x2,
                          ffi::ResultBuffer<ffi::F64> y) {
  const double *a = x1.typed_data(), *b = x2.typed_data();
  double *out = y->typed_data();
  int64_t n = static_cast<int64_t>(x1.element_count());
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i] * b[i];
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchMul, MulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());
"""


def _build(source: str, suffix: str, compiler: str, flags: list[str]) -> Path:
    digest = hashlib.sha256((source + compiler + " ".join(flags)).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"anybind-bench-{digest}.so"
    if not path.exists():
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / f"kernel{suffix}", Path(tmp) / path.name
            src.write_text(source)
            res = subprocess.run([compiler, "-O2", "-shared", "-fPIC", *flags, str(src),
                                  "-o", str(out)], capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"building {src.name} failed:\n{res.stderr}")
            os.replace(out, path)
    return path


def _c_mul():
    lib = ctypes.CDLL(str(_build(C_SOURCE, ".c", os.environ.get("CC", "cc"), [])))
    f = lib.mul
    f.restype, f.argtypes = ab.ctypes_signature()
    return ab.bind(f, shape=ab.like(0), name="bench_compiled_c_mul")


def _numba_mul():
    import numba

    @numba.cfunc(ab.numba_signature())
    def mul(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        n = 1
        for d in range(ranks[0]):
            n *= shapes[0][d]
        x1 = numba.carray(ins[0], n, np.float64)
        x2 = numba.carray(ins[1], n, np.float64)
        y = numba.carray(outs[0], n, np.float64)
        for i in range(n):
            y[i] = x1[i] * x2[i] * x2[i]
        return 0
    return ab.bind(mul, shape=ab.like(0), name="bench_compiled_numba_mul")


def _handwritten_mul():
    path = _build(CPP_SOURCE, ".cc", os.environ.get("CXX", "c++"),
                  ["-std=c++17", f"-I{jax.ffi.include_dir()}"])
    lib = ctypes.CDLL(str(path))
    jax.ffi.register_ffi_target("bench_handwritten_mul", jax.ffi.pycapsule(lib.BenchMul),
                                platform="cpu")
    _handwritten_mul.lib = lib  # XLA keeps the handler's address

    def mul(x1, x2):
        return jax.ffi.ffi_call("bench_handwritten_mul", routes.sds(x1))(x1, x2)
    return mul


_FNS: dict = {}


def functions() -> dict:
    """Route name -> f(x1, x2), built once."""
    if not _FNS:
        _FNS["native jnp"] = routes.native_mul
        _FNS["hand-written C++ FFI"] = _handwritten_mul()
        _FNS["anybind compiled (C)"] = _c_mul()
        try:
            _FNS["anybind compiled (Numba)"] = _numba_mul()
        except ImportError:
            pass
        _FNS["anybind Python"] = routes.ab_mul
        _FNS["buffer_callback"] = routes.bc_mul
    return _FNS


def calls(n: int) -> routes.Cases:
    args = routes.mul_inputs(n)
    return {name: (jax.jit(f), args) for name, f in functions().items()}


def scans(n: int = 1) -> routes.Cases:
    """A lax.scan of STEPS steps, each calling f once; x2 = 1 keeps the carry finite."""
    x1, _ = routes.mul_inputs(n)
    x2 = jnp.ones_like(x1)

    def scanned(f):
        def run(x1, x2):
            return jax.lax.scan(lambda c, _: (f(c, x2), None), x1, None, length=STEPS)[0]
        return jax.jit(run)
    return {name: (scanned(f), (x1, x2)) for name, f in functions().items()}


def table(results: dict[str, dict], scan: dict[str, dict]) -> str:
    """µs per call by size and inside the scan, with the issue's two ratios."""
    sizes = list(results)
    names = list(functions())
    hand, bc = "hand-written C++ FFI", "buffer_callback"

    def cell(r, name, per=1):
        v = r[name]
        return f"{run_fmt(v['min_us'] / per)} ({run_fmt(v['median_us'] / per)})"
    lines = ["### Compiled code through XLA's FFI: f(x1, x2) = x1·x2², float64", "",
             f"µs per call, min (median); the scan column is one jitted `lax.scan` of "
             f"{STEPS} steps at n = 1 divided by {STEPS} (the per-call cost inside a "
             f"program, no dispatch):", "",
             "| route | " + " | ".join(f"n={n:,}" for n in sizes) + " | scan, per step |",
             "|---|" + "---:|" * (len(sizes) + 1)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(results[n], name) for n in sizes)
                     + f" | {cell(scan, name, STEPS)} |")
    lines += ["", f"Ratios of mins: ÷ {hand} (target for anybind compiled ≤ 1.2) and "
              f"{bc} ÷ route (target ≥ 10 inside the scan):", "",
              "| route | " + " | ".join(f"n={n:,}" for n in sizes) + " | scan |",
              "|---|" + "---:|" * (len(sizes) + 1)]
    for name in names:
        cells = [f"{run_fmt(r[name]['min_us'] / r[hand]['min_us'])} / "
                 f"{run_fmt(r[bc]['min_us'] / r[name]['min_us'])}"
                 for r in [results[n] for n in sizes] + [scan]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_fmt(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 \
        else f"{x:,.0f}"
