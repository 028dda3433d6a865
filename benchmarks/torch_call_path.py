#!/usr/bin/env python
"""Where the microseconds of a torch call in JAX go, over its floor.

    python benchmarks/torch_call_path.py [--repeats 15] [--sample-s 0.05]

f(x1, x2) = x1·x2² in torch (float64, CPU), run by ``jax.jit`` (JAX's default
asynchronous dispatch), forward and ``jit(grad(sum f))``, at n = 1 and 10³. Each
row adds one layer to the one above it, so the differences are what each layer
costs; all rows are timed round-robin in one run (``run.measure``):

- **JAX half**: a jitted anybind host op of the same f in NumPy (and a NumPy vjp):
  XLA's dispatch, the custom call, anybind's FFI handler and its checks.
- **torch half**: f on tensors, on this thread (forward; and forward plus
  ``torch.autograd.grad``, the backward).
- **floor**: the two halves added, as ``bridges.py`` defines it.
- **bare**: one host op whose function runs f in torch on DLPack views of XLA's
  buffers (no copy, nothing checked), its vjp by ``torch.autograd.grad``: the two
  halves in one call, what a bridge through a host call costs at least.
- **+ private inputs**: the same, with each input copied first (``from_torch``
  hands torch private copies, so that no write reaches XLA's buffers).
- **from_torch**: ``ab.from_torch(f, mode="call")``: the above, plus the
  engine's pytree handling, and for the gradient its derived vjp op (the vjp
  runs f again under autograd; JAX keeps no torch graph between the calls).

It then times the pieces alone (medians): torch's f in a loop on this thread, and
inside a live host call (which XLA runs on the calling thread), first and again;
an input copied, an input viewed through DLPack, a result viewed as NumPy.
Writes ``benchmarks/torch_call_path.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (first: it sets the BLAS thread count and x64)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import anybind as ab  # noqa: E402

from bridges import HAND, _by_hand_in_jax, _grad, _torch_in_jax_floors, jf, tf  # noqa: E402

SIZES = (1, 1000)


def _copied():
    """The bridge by hand (``bridges._by_hand_in_jax``), each input copied first."""
    def take(a):
        return torch.from_numpy(np.array(a))

    def fwd(a, b):
        return tf(take(a), take(b)).numpy()

    def vjp(p, ct):
        a, b = (take(x).requires_grad_() for x in p)
        return tuple(g.numpy() for g in torch.autograd.grad(tf(a, b), [a, b],
                                                               torch.from_dlpack(ct)))
    return ab.bind(fwd, shape=ab.like(0), name="f_copied", vjp=vjp)


def rows(x1, x2) -> dict:
    """The floor's halves and the bridge by hand (as ``bridges.py`` times them), then
    the copied bridge and from_torch, each checked against JAX first."""
    names = {"floor: JAX half": "JAX half", "floor: torch half": "torch half", HAND: "bare"}
    out = {}
    for key, thunk in _torch_in_jax_floors(x1, x2).items():
        name, what = key.split("|")
        out[f"{names[name]}|{what}"] = thunk
    want = (jf(x1, x2), _grad(jf)(x1, x2))
    ops = {"bare": _by_hand_in_jax(), "+ private inputs": _copied(),
           "from_torch": ab.from_torch(tf, name="f", mode="call")}
    for name, op in ops.items():
        fwd, grd = jax.jit(op), jax.jit(_grad(op))
        np.testing.assert_allclose(fwd(x1, x2), want[0], rtol=1e-12)
        for g, w in zip(grd(x1, x2), want[1]):
            np.testing.assert_allclose(g, w, rtol=1e-12)
        if name != "bare":
            out[f"{name}|forward"] = run._thunk(fwd, (x1, x2))
            out[f"{name}|jit(grad)"] = run._thunk(grd, (x1, x2))
    return out


def pieces(x1, x2, calls: int = 20000) -> dict:
    """Medians in µs of the pieces alone, each over ``calls`` runs."""
    def median_us(fn) -> float:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times) / 1e3
    t1, t2 = torch.from_numpy(x1.copy()), torch.from_numpy(x2.copy())
    first: list[int] = []
    second: list[int] = []

    def timed(a, b):
        ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
        t0 = time.perf_counter_ns()
        y = tf(ta, tb)
        t1_ = time.perf_counter_ns()
        tf(ta, tb)
        first.append(t1_ - t0)
        second.append(time.perf_counter_ns() - t1_)
        return y.numpy()
    op = jax.jit(ab.bind(timed, shape=ab.like(0), name="timed"))
    for _ in range(calls):
        op(x1, x2).block_until_ready()
    ro = x1.copy()
    ro.flags.writeable = False
    return {"torch f, this thread": median_us(lambda: tf(t1, t2)),
            "torch f, inside a host call": statistics.median(first) / 1e3,
            "torch f again, in the same host call": statistics.median(second) / 1e3,
            "an input copied (np.array + torch.from_numpy)":
                median_us(lambda: torch.from_numpy(np.array(ro))),
            "an input viewed (torch.from_dlpack)": median_us(lambda: torch.from_dlpack(ro)),
            "a result viewed (Tensor.numpy)": median_us(lambda: t1.numpy())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--sample-s", type=float, default=0.05)
    args = p.parse_args()
    res: dict = {"machine": f"{platform.processor() or platform.machine()}, "
                            f"{run.os.cpu_count()} cores",
                 "versions": {"jax": jax.__version__, "torch": torch.__version__,
                              "numpy": np.__version__}, "sizes": {}}
    for n in SIZES:
        x1, x2 = np.random.default_rng(0).random((2, n))
        timed = run.measure(rows(x1, x2), args.repeats, args.sample_s)
        table: dict = {}
        for key, r in timed.items():
            name, what = key.split("|")
            table.setdefault(what, {})[name] = r["min_us"]
        for t in table.values():
            t["floor"] = t["JAX half"] + t["torch half"]
        res["sizes"][n] = {"min_us": table, "pieces_median_us": pieces(x1, x2)}
    out = HERE / "torch_call_path.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    for n, r in res["sizes"].items():
        print(f"n = {n}")
        for what, t in r["min_us"].items():
            print(f"  {what}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items())
                  + f"; from_torch ÷ floor {t['from_torch'] / t['floor']:.2f}")
        print("  pieces (median µs): " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["pieces_median_us"].items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
