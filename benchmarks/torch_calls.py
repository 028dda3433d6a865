#!/usr/bin/env python
"""op.torch against PyTorch's own ways of wrapping NumPy code (issue 13).

    python benchmarks/torch_calls.py            # n = 1 and 10³, forward and backward
    python benchmarks/torch_calls.py --repeats 100

Every route runs the same NumPy expression f(x1, x2) = x1·x2² (and its vjp
x̄1 = x2²·ȳ, x̄2 = 2·x1·x2·ȳ) on float64 CPU tensors:

- ``native torch``: x1 * x2**2 in torch (the floor, no NumPy);
- ``autograd.Function``: forward/setup_context/backward, NumPy in forward and backward;
- ``custom_op``: ``torch.library.custom_op`` with ``register_autograd``, NumPy inside;
- ``anybind op.torch``: ``ab.bind`` with host jvp and vjp rules.

"forward" calls the op on tensors that do not require grad; "forward+backward"
calls it on tensors that do and runs ``torch.autograd.grad`` of the sum. Timing
is ``run.py``'s: round-robin over the routes, min over samples as the headline,
median beside it. Results go to ``benchmarks/torch_results.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (sets single-threaded BLAS before NumPy is imported)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import anybind as ab  # noqa: E402


def _np(t):
    return t.detach().numpy()


class NumpyMul(torch.autograd.Function):
    @staticmethod
    def forward(x1, x2):
        return torch.from_numpy(_np(x1) * _np(x2) ** 2)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, ct):
        x1, x2 = (_np(t) for t in ctx.saved_tensors)
        c = _np(ct)
        return torch.from_numpy(x2**2 * c), torch.from_numpy(2 * x1 * x2 * c)


@torch.library.custom_op("anybind_bench::mul", mutates_args=())
def custom_mul(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(_np(x1) * _np(x2) ** 2)


@custom_mul.register_fake
def _(x1, x2):
    return torch.empty_like(x1)


@torch.library.custom_op("anybind_bench::mul_vjp", mutates_args=())
def custom_mul_vjp(x1: torch.Tensor, x2: torch.Tensor,
                   ct: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, c = _np(x1), _np(x2), _np(ct)
    return torch.from_numpy(b**2 * c), torch.from_numpy(2 * a * b * c)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, ct):
    return custom_mul_vjp(*ctx.saved_tensors, ct)


custom_mul.register_autograd(_backward, setup_context=_setup)

ab_mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="vectorized",
                 name="mul", jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
                 vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct))

ROUTES = {
    "native torch": lambda a, b: a * b**2,
    "autograd.Function": NumpyMul.apply,
    "custom_op": custom_mul,
    "anybind op.torch": ab_mul.torch,
}


def _inputs(n: int, grad: bool):
    r = np.random.default_rng(0)
    return tuple(torch.from_numpy(r.normal(size=n)).requires_grad_(grad) for _ in range(2))


def group(n: int, backward: bool, repeats: int, sample_s: float) -> dict:
    a, b = _inputs(n, backward)
    ref = None
    thunks = {}
    for name, f in ROUTES.items():
        if backward:
            def thunk(f=f):
                return torch.autograd.grad(f(a, b).sum(), (a, b))
        else:
            def thunk(f=f):
                return f(a, b)
        got = [t.detach() for t in (thunk() if backward else (thunk(),))]
        if ref is None:
            ref = got
        for g, w in zip(got, ref, strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12,
                                       err_msg=f"{name} disagrees with native torch")
        thunks[name] = thunk
    return run.measure(thunks, repeats, sample_s)


def table(results: dict) -> str:
    names = list(ROUTES)
    head = "| route | " + " | ".join(f"{k} (µs)" for k in results) + " |"
    lines = [head, "|" + "---|" * (len(results) + 1)]
    for name in names:
        cells = []
        for res in results.values():
            r, base = res[name], res["custom_op"]
            cells.append(f"{r['min_us']:.1f} (median {r['median_us']:.1f}; "
                         f"{r['min_us'] / base['min_us']:.2f}× custom_op)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--sample-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    results = {}
    for n in (1, 1000):
        for backward in (False, True):
            key = f"n={n} {'forward+backward' if backward else 'forward'}"
            results[key] = group(n, backward, args.repeats, args.sample_ms / 1e3)
    print(f"torch {torch.__version__}, {run.machine().get('cpu', '')}")
    print(table(results))
    out = {"torch": torch.__version__, "machine": run.machine(),
           "results": {k: {r: {kk: vv for kk, vv in v.items() if kk != "samples_us"}
                           for r, v in res.items()} for k, res in results.items()}}
    (HERE / "torch_results.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
