#!/usr/bin/env python
"""Bridges between PyTorch and JAX (issue 21): anybind against torch2jax, jax2torch and
torch-jax-interop, in one interleaved run.

    python benchmarks/bridges.py                  # ~2–3 minutes on 2 cores
    python benchmarks/bridges.py --quick          # fewer samples
    python benchmarks/bridges.py --update-readme  # the tables into benchmarks/README.md

The other packages are not anybind's dependencies; install them beside it
(``pip install torch2jax jax2torch torch-jax-interop``). One that does not
install, import or run with today's JAX and torch is recorded with its error.

Both directions run the same function, f(x1, x2) = x1·x2², in float64 on the CPU:

- **torch code in JAX**: ``ab.from_torch``, torch2jax's ``t2j`` (which translates
  torch calls into jax.numpy while tracing), torch-jax-interop's
  ``torch_module_to_jax`` (a module holding x1 as its parameter, ``pure_callback``
  inside ``custom_vjp``); reference: the same f in jax.numpy. Per call: ``jit(f)``
  and ``jit(grad(sum f))`` in both arguments.
- **JAX code in torch**: ``ab.to_torch``, jax2torch, torch-jax-interop's
  ``WrappedJaxFunction`` (x1 as its parameter) and ``jax_to_torch`` of the function
  (no backward); reference: the same f in torch. Per call: forward, and forward
  plus ``torch.autograd.grad`` of both inputs (a contiguous cotangent of ones).

Per-call times are ``run.measure``'s: round-robin over the routes, the minimum over
samples as the headline, the median beside it, with JAX's CPU dispatch synchronous
as in ``run.py`` (``--async-dispatch`` keeps it asynchronous); each route is checked against the
reference first. Then per package: forward mode, Hessian and vmap (each checked
against the reference, differentiating in x2), sharding (2 simulated CPU devices,
x1 and x2 split, in a subprocess: does the result hold, and does the code run per
shard), and the time from the first import (jax, torch, the package) to the
first result, in a fresh process. Results: ``benchmarks/bridges.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (x64 on; one BLAS thread)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import anybind as ab  # noqa: E402

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

SIZES = (1, 1_000, 1_000_000)
PACKAGES = ("anybind", "torch2jax", "jax2torch", "torch-jax-interop")


def _err(e: BaseException) -> str:
    """An error as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def _probe(row: dict, make, probes: dict, native, assert_close) -> None:
    """Each probe on ``make()`` against the same probe on ``native``, into ``row``:
    "ok", "wrong values", or the error it raised."""
    try:
        f = make()
    except Exception as e:  # noqa: BLE001
        row.update({p: _err(e) for p in probes})
        return
    for p, do in probes.items():
        try:
            assert_close(do(f), do(native))
            row[p] = "ok"
        except AssertionError:
            row[p] = "wrong values"
        except Exception as e:  # noqa: BLE001
            row[p] = _err(e)


def tf(a, b):
    return a * b ** 2


def jf(a, b):
    return a * b ** 2


# -------------------------------------------------------- torch code in JAX

def torch_in_jax(n: int) -> dict[str, Callable]:
    """Each package's f(x1, x2) as a JAX function (a constructor per package)."""
    def anybind_():
        return ab.from_torch(tf, name="f", mode="call")  # the call path and its floor

    def torch2jax_():
        from torch2jax import t2j
        return t2j(tf)

    def interop_():
        from torch_jax_interop.to_jax_module import torch_module_to_jax

        class Scale(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(n, dtype=torch.float64))

            def forward(self, x):
                return self.w * x ** 2
        apply, _ = torch_module_to_jax(Scale(), example_output=torch.zeros(n, dtype=torch.float64))
        return lambda a, b: apply((a,), b)

    return {"native jax.numpy": lambda: jf, "anybind": anybind_, "torch2jax": torch2jax_,
            "torch-jax-interop": interop_}


def _grad(f):
    return jax.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1))


FLOOR = "floor (JAX half + torch half)"
HAND = "by hand (the two halves in one call)"


def _add_floor(out: dict) -> None:
    """The floor row: the two halves' times, each measured alone in the same run, added."""
    for what in out.values():
        for row in what.values():
            halves = [row.pop(k, None) for k in ("floor: JAX half", "floor: torch half")]
            if all(halves):
                row[FLOOR] = {k: halves[0][k] + halves[1][k] for k in ("min_us", "median_us")}


def _torch_in_jax_floors(x1, x2) -> dict:
    """The halves of a call of torch code in JAX: a jitted anybind host call of the same
    f in NumPy (with a NumPy vjp rule), and f in torch on tensors (forward, backward)."""
    host = ab.bind(lambda a, b: a * b ** 2, shape=ab.like(0), name="f_numpy",
                   vjp=lambda p, ct: (p[1] ** 2 * ct, 2 * p[0] * p[1] * ct))
    fwd, grd = jax.jit(host), jax.jit(_grad(host))
    t1, t2 = torch.from_numpy(x1.copy()), torch.from_numpy(x2.copy())

    def torch_grad():
        a, b = t1.detach().requires_grad_(), t2.detach().requires_grad_()
        y = tf(a, b)
        return torch.autograd.grad(y, [a, b], torch.ones_like(y))
    hand = _by_hand_in_jax()
    return {"floor: JAX half|forward": run._thunk(fwd, (x1, x2)),
            "floor: JAX half|jit(grad)": run._thunk(grd, (x1, x2)),
            "floor: torch half|forward": lambda: tf(t1, t2),
            "floor: torch half|jit(grad)": torch_grad,
            f"{HAND}|forward": run._thunk(jax.jit(hand), (x1, x2)),
            f"{HAND}|jit(grad)": run._thunk(jax.jit(_grad(hand)), (x1, x2))}


def _by_hand_in_jax():
    """The two halves composed by hand, with nothing checked: the JAX half's host op
    running f in torch on DLPack views, its vjp by ``torch.autograd.grad``."""
    def fwd(a, b):
        return tf(torch.from_dlpack(a), torch.from_dlpack(b)).numpy()

    def vjp(p, ct):
        a, b = (torch.from_dlpack(x).requires_grad_() for x in p)
        return tuple(g.numpy() for g in torch.autograd.grad(tf(a, b), [a, b],
                                                               torch.from_dlpack(ct)))
    return ab.bind(fwd, shape=ab.like(0), name="f_by_hand", vjp=vjp)


def time_torch_in_jax(repeats: int, sample_s: float, errors: dict) -> dict:
    out: dict = {"forward": {}, "jit(grad)": {}}
    for n in SIZES:
        x1, x2 = np.random.default_rng(0).random((2, n))
        want = (jf(x1, x2), _grad(jf)(x1, x2))
        thunks = _torch_in_jax_floors(x1, x2)
        for name, make in torch_in_jax(n).items():
            try:
                f = make()
                fwd, grd = jax.jit(f), jax.jit(_grad(f))
                np.testing.assert_allclose(fwd(x1, x2), want[0], rtol=1e-12)
                got = grd(x1, x2)
                for g, w in zip(got, want[1]):
                    np.testing.assert_allclose(g, w, rtol=1e-12)
            except Exception as e:  # noqa: BLE001  (recorded, as the table says)
                errors.setdefault(("torch→jax", name), _err(e))
                continue
            thunks[f"{name}|forward"] = run._thunk(fwd, (x1, x2))
            thunks[f"{name}|jit(grad)"] = run._thunk(grd, (x1, x2))
        res = run.measure(thunks, repeats, sample_s)
        for key, r in res.items():
            name, what = key.split("|")
            out[what].setdefault(n, {})[name] = {k: r[k] for k in ("min_us", "median_us")}
    _add_floor(out)
    return out


def probe_torch_in_jax(errors: dict) -> dict:
    """Forward mode, Hessian, vmap: each package against jax.numpy, in x2."""
    x1, x2, dx = map(jnp.asarray, np.random.default_rng(1).random((3, 4)))
    probes = {
        "forward mode": lambda f: jax.jvp(lambda b: f(x1, b), (x2,), (dx,))[1],
        "hessian": lambda f: jax.hessian(lambda b: f(x1, b).sum())(x2),
        "vmap": lambda f: jax.vmap(lambda b: f(x1, b))(np.stack([x2, dx])),
    }
    table: dict = {}
    for name, make in torch_in_jax(4).items():
        if name.startswith("native"):
            continue
        _probe(table.setdefault(name, {}), make, probes, jf,
               lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14))
    return table


_SHARD_PROBE = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np, torch
jax.config.update("jax_enable_x64", True)
from jax.sharding import NamedSharding, PartitionSpec as P
from torch._subclasses.fake_tensor import FakeTensor
seen = []
def tf(a, b):
    if isinstance(b, torch.Tensor) and not isinstance(b, FakeTensor):  # not while tracing
        seen.append(tuple(b.shape))
    return a * b ** 2
n = 8
mesh = jax.make_mesh((2,), ("x",))
x1, x2 = np.random.default_rng(2).random((2, n))
put = lambda v: jax.device_put(v, NamedSharding(mesh, P("x")))
name, result = sys.argv[1], {}
try:
    if name == "anybind":
        import anybind as ab
        f = ab.from_torch(tf, shard="elementwise")
    elif name == "torch2jax":
        from torch2jax import t2j
        f = t2j(tf)
    else:
        from torch_jax_interop.to_jax_module import torch_module_to_jax
        class Scale(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(n, dtype=torch.float64))
            def forward(self, x):
                return tf(self.w, x)
        apply, _ = torch_module_to_jax(Scale(), example_output=torch.zeros(n, dtype=torch.float64))
        f = lambda a, b: apply((a,), b)
    got = jax.jit(f)(put(x1), put(x2))
    ok = np.allclose(np.asarray(got), x1 * x2 ** 2, rtol=1e-12)
    if not ok:
        result["sharding"] = "wrong values"
    elif not seen:
        result["sharding"] = "ok, per shard (translated to XLA ops)"
    elif set(seen) == {(n // 2,)}:
        result["sharding"] = "ok, per shard"
    else:
        result["sharding"] = "ok, gathered: runs on the whole array"
except Exception as e:
    lines = str(e).strip().splitlines()
    result["sharding"] = f"{type(e).__name__}: {lines[0][:160] if lines else ''}"
print(json.dumps(result))
"""


def _fresh(script: str, *args: str, timeout: int = 180) -> str:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(tail[:200])
    return proc.stdout.strip().splitlines()[-1]


def probe_sharding(table: dict) -> None:
    for name in ("anybind", "torch2jax", "torch-jax-interop"):
        try:
            table.setdefault(name, {}).update(json.loads(_fresh(_SHARD_PROBE, name)))
        except Exception as e:  # noqa: BLE001
            table.setdefault(name, {})["sharding"] = _err(e)


# -------------------------------------------------------- JAX code in torch

def jax_in_torch(t1: torch.Tensor) -> dict[str, Callable]:
    """Each package's f(x1, x2) as a torch function (a constructor per package).

    torch-jax-interop's module holds x1 as its parameter: its f ignores the
    first argument and differentiates in the parameter instead.
    """
    def anybind_():
        return ab.to_torch(jf, name="f")

    def jax2torch_():
        from jax2torch import jax2torch
        return jax2torch(jax.jit(jf))

    def wrapped_():
        from torch_jax_interop import WrappedJaxFunction
        m = WrappedJaxFunction(lambda p, x: p * x ** 2, jnp.asarray(t1.detach().numpy()))
        f = lambda a, b: m(b)
        f.params = list(m.parameters())
        return f

    def interop_fn_():
        from torch_jax_interop import jax_to_torch
        f = jax_to_torch(jax.jit(jf))
        f.forward_only = True
        return f

    return {"native torch": lambda: tf, "anybind": anybind_, "jax2torch": jax2torch_,
            "torch-jax-interop": wrapped_, "torch-jax-interop jax_to_torch": interop_fn_}


def _backward(f, t1, t2):
    leaves = [t2] + getattr(f, "params", [t1])

    def run_():
        y = f(t1, t2)
        return torch.autograd.grad(y, leaves, torch.ones_like(y))
    return run_


class _ByHand(torch.autograd.Function):
    """The two halves composed by hand, with nothing checked: jit(f) and its jitted vjp
    on NumPy views, inside an ``autograd.Function`` (JAX's results are read-only arrays,
    taken over without a copy: torch's warning about that is silenced)."""

    @staticmethod
    def forward(a, b):
        return torch.from_numpy(np.asarray(_JF(a.numpy(), b.numpy())))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return tuple(torch.from_numpy(np.asarray(v))
                     for v in _JF_VJP(a.numpy(), b.numpy(), g.numpy()))


_JF, _JF_VJP = jax.jit(jf), jax.jit(lambda a, b, c: jax.vjp(jf, a, b)[1](c))


class _Identity(torch.autograd.Function):
    """The torch half of a torch operation: an autograd.Function that does nothing."""

    @staticmethod
    def forward(a, b):
        return a.view_as(a)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g, None


def _jax_in_torch_floors(t1, t2, g1, g2) -> dict:
    """The halves of a call of JAX code in torch: jit(f) (and its jitted vjp) on NumPy
    views of the tensors, and a torch operation that computes nothing (forward, backward)."""
    a, b = t1.numpy(), t2.numpy()
    f = jax.jit(jf)
    vjp = jax.jit(lambda a, b, c: jax.vjp(jf, a, b)[1](c))
    ones = np.ones_like(a)

    def jax_both():
        np.asarray(f(a, b))
        return [np.asarray(v) for v in vjp(a, b, ones)]

    def torch_both():
        y = _Identity.apply(g1, g2)
        return torch.autograd.grad(y, [g1], torch.ones_like(y))
    return {"floor: JAX half|forward": lambda: np.asarray(f(a, b)),
            "floor: JAX half|forward+backward": jax_both,
            "floor: torch half|forward": lambda: _Identity.apply(t1, t2),
            "floor: torch half|forward+backward": torch_both,
            f"{HAND}|forward": lambda: _ByHand.apply(t1, t2),
            f"{HAND}|forward+backward": _backward(_ByHand.apply, g1, g2)}


def time_jax_in_torch(repeats: int, sample_s: float, errors: dict) -> dict:
    out: dict = {"forward": {}, "forward+backward": {}}
    for n in SIZES:
        t1, t2 = (torch.from_numpy(np.random.default_rng(3).random(n)).clone()
                  for _ in range(2))  # torch's own (aligned) memory
        g1, g2 = t1.clone().requires_grad_(), t2.clone().requires_grad_()
        want = tf(t1, t2)
        thunks = _jax_in_torch_floors(t1, t2, g1, g2)
        for name, make in jax_in_torch(t1).items():
            try:
                f = make()
                torch.testing.assert_close(f(t1, t2), want, rtol=1e-12, atol=0)
                thunks[f"{name}|forward"] = lambda f=f: f(t1, t2)
                if not getattr(f, "forward_only", False):
                    bwd = _backward(f, g1, g2)
                    got = bwd()
                    torch.testing.assert_close(got[0], 2 * t1 * t2, rtol=1e-12, atol=0)
                    thunks[f"{name}|forward+backward"] = bwd
            except Exception as e:  # noqa: BLE001
                errors.setdefault(("jax→torch", name), _err(e))
                thunks.pop(f"{name}|forward", None)
        res = run.measure(thunks, repeats, sample_s)
        for key, r in res.items():
            name, what = key.split("|")
            out[what].setdefault(n, {})[name] = {k: r[k] for k in ("min_us", "median_us")}
    _add_floor(out)
    return out


def probe_jax_in_torch() -> dict:
    t1, t2, dt = (torch.from_numpy(np.random.default_rng(4).random(4)).clone() for _ in range(3))
    probes = {
        "forward mode": lambda f: torch.func.jvp(lambda b: f(t1, b), (t2,), (dt,))[1],
        "hessian": lambda f: torch.func.hessian(lambda b: f(t1, b).sum())(t2),
        "vmap": lambda f: torch.vmap(lambda b: f(t1, b))(torch.stack([t2, dt])),
    }
    table: dict = {}
    for name, make in jax_in_torch(t1).items():
        if name.startswith("native") or name.endswith("jax_to_torch"):
            continue
        _probe(table.setdefault(name, {"sharding": "–"}), make, probes, tf,
               lambda x, y: torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14))
    return table


# ------------------------------------------------------- import to first call

_FIRST_CALL = """
import sys, time
t0 = time.perf_counter()
import jax, numpy as np, torch
jax.config.update("jax_enable_x64", True)
which, x = sys.argv[1], np.arange(1.0, 5.0)
f = lambda a, b: a * b ** 2
if which == "torch→jax native":
    y = jax.jit(f)(x, x)
elif which == "torch→jax anybind":
    import anybind as ab
    y = jax.jit(ab.from_torch(f, mode="call"))(x, x)
elif which == "torch→jax torch2jax":
    from torch2jax import t2j
    y = jax.jit(t2j(f))(x, x)
elif which == "torch→jax torch-jax-interop":
    from torch_jax_interop.to_jax_module import torch_module_to_jax
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        def forward(self, v):
            return self.w * v ** 2
    apply, p = torch_module_to_jax(Scale(), example_output=torch.zeros(4, dtype=torch.float64))
    y = jax.jit(apply)(p, x)
else:
    t = torch.arange(1.0, 5.0, dtype=torch.float64)
    if which == "jax→torch native":
        y = f(t, t)
    elif which == "jax→torch anybind":
        import anybind as ab
        y = ab.to_torch(f)(t, t)
    elif which == "jax→torch jax2torch":
        from jax2torch import jax2torch
        y = jax2torch(f)(t, t)
    else:
        from torch_jax_interop import WrappedJaxFunction
        y = WrappedJaxFunction(lambda p, v: p * v ** 2, jax.numpy.ones(4))(t)
np.asarray(y.detach() if isinstance(y, torch.Tensor) else y)
print(time.perf_counter() - t0)
"""


def first_calls() -> dict:
    out = {}
    for d, names in (("torch→jax", ("native", "anybind", "torch2jax", "torch-jax-interop")),
                     ("jax→torch", ("native", "anybind", "jax2torch", "torch-jax-interop"))):
        for name in names:
            try:
                out[f"{d} {name}"] = float(_fresh(_FIRST_CALL, f"{d} {name}"))
            except Exception as e:  # noqa: BLE001
                out[f"{d} {name}"] = _err(e)
    return out


# ------------------------------------- models: translated, by hand, call mode, torch

def _models():
    """(name, torch module, input of batch n, the same model by hand in jax.numpy),
    float32, eval mode; the models of tests/test_bridges_translate.py."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from test_bridges_translate import CNN, LSTM, MLP, Block, ResBlock
    hi = jax.lax.Precision.HIGHEST

    def lin(p, k, x):
        return jnp.matmul(x, p[f"{k}.weight"].T, precision=hi) + p[f"{k}.bias"]

    def ln(p, k, h):
        m, v = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return (h - m) * jax.lax.rsqrt(v + 1e-5) * p[f"{k}.weight"] + p[f"{k}.bias"]

    def mlp(p, x):
        return lin(p, "l2", ln(p, "ln", jax.nn.gelu(lin(p, "l1", x), approximate=False)))

    def block(p, x, heads=4):
        y = ln(p, "ln1", x)
        qkv = jnp.matmul(y, p["attn.in_proj_weight"].T, precision=hi) + p["attn.in_proj_bias"]
        q, k, v = (t.reshape(*t.shape[:-1], heads, -1) for t in jnp.split(qkv, 3, -1))
        a = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=hi) / q.shape[-1] ** 0.5
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(a, -1), v, precision=hi)
        x = x + lin(p, "attn.out_proj", o.reshape(x.shape))
        h = jax.nn.gelu(lin(p, "ff.0", ln(p, "ln2", x)), approximate=False)
        return x + lin(p, "ff.2", h)

    def lstm(p, x):
        def step(hc, xt):
            h, c = hc
            g = (jnp.matmul(xt, p["lstm.weight_ih_l0"].T, precision=hi) + p["lstm.bias_ih_l0"]
                 + jnp.matmul(h, p["lstm.weight_hh_l0"].T, precision=hi) + p["lstm.bias_hh_l0"])
            i, f, gg, o = jnp.split(g, 4, -1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
            return (jax.nn.sigmoid(o) * jnp.tanh(c), c), None
        h0 = jnp.zeros((x.shape[0], p["lstm.weight_hh_l0"].shape[1]), x.dtype)
        (h, _), _ = jax.lax.scan(step, (h0, h0), jnp.swapaxes(x, 0, 1))
        return lin(p, "head", h)

    def conv(p, k, x, stride=1, pad=0, bias=True):
        y = jax.lax.conv_general_dilated(x, p[f"{k}.weight"], (stride, stride),
                                         [(pad, pad)] * 2, precision=hi)
        return y + p[f"{k}.bias"][:, None, None] if bias else y

    def bn(p, k, x):
        s = p[f"{k}.weight"] * jax.lax.rsqrt(p[f"{k}.running_var"] + 1e-5)
        return (x - p[f"{k}.running_mean"][:, None, None]) * s[:, None, None] + \
            p[f"{k}.bias"][:, None, None]

    def cnn(p, x):
        x = jax.nn.relu(bn(p, "bn", conv(p, "c1", x, pad=1)))
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        x = jax.nn.relu(conv(p, "c2", x, stride=2))
        return lin(p, "fc", x.mean((2, 3)))

    def res(p, x):
        out = jax.nn.relu(bn(p, "bn1", conv(p, "conv1", x, pad=1, bias=False)))
        return jax.nn.relu(bn(p, "bn2", conv(p, "conv2", out, pad=1, bias=False)) + x)

    return [("MLP", MLP, lambda n: (n, 8), mlp, (1, 1_000, 1_000_000)),
            ("CNN", CNN, lambda n: (n, 3, 12, 12), cnn, (1, 100, 1_000)),
            ("ResBlock", ResBlock, lambda n: (n, 8, 6, 6), res, (1, 100, 1_000)),
            ("Block", Block, lambda n: (n, 5, 16), block, (1, 100, 1_000)),
            ("LSTM", LSTM, lambda n: (n, 7, 6), lstm, (1, 100, 1_000))]


HAND_MODEL, BESIDE = "jax.numpy by hand", ", beside call and torch"
CALL_AND_TORCH = ("from_torch call", "real torch")  # timed together, beside HAND_MODEL


def time_models(repeats: int, sample_s: float) -> dict:
    """µs per call of each model, batch n, float32: jit(f) and jit(grad) in the params."""
    out: dict = {}
    for name, cls, shape, by_hand, sizes in _models():
        torch.manual_seed(0)
        m = cls().eval()
        p = {k: jnp.array(v.numpy()) for k, v in m.state_dict().items()}
        tp = {k: v.detach().clone() for k, v in m.state_dict().items()}
        for n in sizes:
            x = np.random.default_rng(0).standard_normal(shape(n)).astype(np.float32)
            tx = torch.from_numpy(x)
            routes = {HAND_MODEL: by_hand,
                      "from_torch translate": ab.from_torch(m, mode="translate"),
                      "from_torch call": ab.from_torch(m, mode="call")}
            want = m(tx).detach().numpy()
            thunks = {}
            fp = {k: v for k, v in p.items() if jnp.issubdtype(v.dtype, jnp.floating)}
            rest = {k: v for k, v in p.items() if k not in fp}
            for r, f in routes.items():
                fwd = jax.jit(f)
                grd = jax.jit(lambda fp, rest, x, f=f: jax.grad(
                    lambda q: f({**rest, **q}, x).sum())(fp))
                np.testing.assert_allclose(fwd(p, x), want, rtol=2e-3, atol=2e-4)
                thunks[f"{r}|jit(f)"] = run._thunk(fwd, (p, x))
                thunks[f"{r}|jit(grad)"] = run._thunk(grd, (fp, rest, x))
            params = [v.requires_grad_() for k, v in tp.items() if v.is_floating_point()
                      and k in dict(m.named_parameters())]

            def torch_fwd():
                with torch.no_grad():
                    torch.func.functional_call(m, tp, (tx,))

            def torch_grad():
                y = torch.func.functional_call(m, tp, (tx,)).sum()
                torch.autograd.grad(y, params)
            thunks["real torch|jit(f)"] = torch_fwd
            thunks["real torch|jit(grad)"] = torch_grad
            # Two interleaved groups, each with the hand-written model: the translation
            # alone beside it (the ≤ 1.1× comparison: at n = 10⁶ a torch call between two
            # samples moved their times by up to half), then call mode and torch.
            for group, tag in ((("from_torch translate",), ""), (CALL_AND_TORCH, BESIDE)):
                got = run.measure({k: t for k, t in thunks.items()
                                   if k.split("|")[0] in (HAND_MODEL, *group)},
                                  repeats, sample_s)
                for key, r in got.items():
                    route, what = key.split("|")
                    route += tag if route == HAND_MODEL else ""
                    out.setdefault(name, {}).setdefault(what, {}).setdefault(n, {})[route] = {
                        k: r[k] for k in ("min_us", "median_us")}
    return out


def _models_md(res: dict) -> str:
    parts = ["µs per call, min (median); ×: the min over jax.numpy by hand's, timed "
             "interleaved with it (the translation alone beside it, call mode and torch "
             "together beside it). Float32, eval mode, batch n; grad in the parameters."]
    for name, by_what in res.items():
        for what, by_n in by_what.items():
            sizes = sorted(by_n, key=int)
            routes = list(dict.fromkeys(r for v in by_n.values() for r in v))
            rows = []
            for r in routes:
                row = [r]
                for n in sizes:
                    b = by_n[n].get(HAND_MODEL + (BESIDE if r in CALL_AND_TORCH else ""))
                    v = by_n[n].get(r)
                    row.append("–" if v is None else f"{run._fmt(v['min_us'])} "
                               f"({run._fmt(v['median_us'])}) ×{v['min_us'] / b['min_us']:.2f}")
                rows.append(row)
            parts += ["", f"**{name}, {what}**", "",
                      run._md(["route"] + [f"n = {int(n):,}" for n in sizes], rows)]
    return "\n".join(parts)


# ------------------------------------------------------------------ reporting

def versions() -> dict:
    from importlib import metadata
    got = {"jax": jax.__version__, "torch": torch.__version__, "numpy": np.__version__}
    for p in ("anybind", "torch2jax", "jax2torch", "torch-jax-interop", "chex"):
        try:
            got[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            got[p] = None
    return got


def _times(title: str, res: dict, base: str) -> str:
    res = {int(n): r for n, r in res.items()}  # sizes as JSON keeps them: strings
    names = list(dict.fromkeys(k for r in res.values() for k in r))
    names.sort(key=lambda k: k in (HAND, FLOOR))  # the two references last
    rows = []
    for name in names:
        row = [name]
        for n in SIZES:
            r, b = res.get(n, {}).get(name), res.get(n, {}).get(base)
            row.append("–" if r is None else f"{run._fmt(r['min_us'])} ({run._fmt(r['median_us'])})"
                       + ("" if b is None or name == base else f" ×{r['min_us'] / b['min_us']:.2g}"))
        rows.append(row)
    for below, label in ((FLOOR, "floor"), (HAND, "by hand")):
        row = [f"anybind ÷ {label}"]
        for n in SIZES:
            r, f = res.get(n, {}).get("anybind"), res.get(n, {}).get(below)
            row.append("–" if r is None or f is None else f"{r['min_us'] / f['min_us']:.2f}")
        rows.append(row)
    return "\n".join([f"**{title}** — µs per call, min (median), ×: min over {base}'s", "",
                      run._md(["route"] + [f"n = {n:,}" for n in SIZES], rows)])


def _capabilities(title: str, table: dict, first: dict, direction: str) -> str:
    cols = ("forward mode", "hessian", "vmap", "sharding")
    rows = []
    for name, row in table.items():
        t = first.get(f"{direction} {name}")
        t = "–" if t is None else (f"{t:.1f} s" if isinstance(t, float) else t)
        rows.append([name] + [row.get(c, "–") for c in cols] + [t])
    native = first.get(f"{direction} native")
    note = f"(native: {native:.1f} s)" if isinstance(native, float) else ""
    return "\n".join([f"**{title}** {note}", "", run._md(
        ["package", *cols, "import → first call"], rows)])


def markdown(res: dict) -> str:
    info, errs = res["machine"], res["errors"]
    head = (f"Machine: {info['cpu']}, {info['cores']} cores (shared); jax {res['versions']['jax']}, "
            f"torch {res['versions']['torch']}, torch2jax {res['versions']['torch2jax']}, "
            f"jax2torch {res['versions']['jax2torch']}, torch-jax-interop "
            f"{res['versions']['torch-jax-interop']}; load average at start "
            f"{tuple(round(x, 1) for x in info.get('load_avg', ()))}; {res['repeats']} samples "
            f"per route.")
    parts = [head, "", "#### torch code in JAX", "",
             _times("jit(f)", res["torch→jax"]["forward"], "native jax.numpy"), "",
             _times("jit(grad(sum f))", res["torch→jax"]["jit(grad)"], "native jax.numpy"), "",
             _capabilities("Transformations", res["torch→jax capabilities"], res["first call"],
                           "torch→jax"), "",
             "#### JAX code in torch", "",
             _times("f", res["jax→torch"]["forward"], "native torch"), "",
             _times("f, then torch.autograd.grad", res["jax→torch"]["forward+backward"],
                    "native torch"), "",
             _capabilities("Transformations", res["jax→torch capabilities"], res["first call"],
                           "jax→torch")]
    if errs:
        parts += ["", "Errors (the route is left out of the timings):", ""]
        parts += [f"- {d}, {name}: `{e}`" for (d, name), e in
                  ((tuple(k.split(" / ")), v) for k, v in errs.items())]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--sample-ms", type=float, default=2.0)
    ap.add_argument("--update-readme", action="store_true")
    ap.add_argument("--out", default=str(HERE / "bridges.json"))
    ap.add_argument("--async-dispatch", action="store_true",
                    help="keep JAX's asynchronous CPU dispatch (off by default, as in run.py)")
    ap.add_argument("--models", action="store_true",
                    help="only the models: from_torch translate vs jax.numpy, call mode, torch")
    args = ap.parse_args(argv)
    # As in run.py: every call waits for its result, so asynchronous dispatch only adds a
    # hand-off to XLA's worker thread, whose cost on a loaded 2-core machine swamps the
    # microseconds measured here (to_torch at n = 1000: 26 µs synchronous, 35–80 µs not).
    jax.config.update("jax_cpu_enable_async_dispatch", args.async_dispatch)
    repeats = args.repeats or (5 if args.quick else 15)
    sample_s = args.sample_ms / 1e3
    t0 = time.perf_counter()
    if args.models:
        res_m = {"machine": run.machine(), "versions": versions(), "repeats": repeats,
                 "models": time_models(repeats, sample_s)}
        res_m["machine"].setdefault("load_avg", os.getloadavg())
        res_m["seconds"] = round(time.perf_counter() - t0, 1)
        Path(HERE / "bridges_models.json").write_text(
            json.dumps(res_m, indent=1, ensure_ascii=False) + "\n")
        print(_models_md(res_m["models"]))
        print(f"\n({res_m['seconds']} s)")
        return res_m
    errors: dict = {}
    res: dict[str, Any] = {"machine": run.machine(), "versions": versions(), "repeats": repeats}
    res["machine"].setdefault("load_avg", os.getloadavg())
    res["torch→jax"] = time_torch_in_jax(repeats, sample_s, errors)
    res["jax→torch"] = time_jax_in_torch(repeats, sample_s, errors)
    caps = probe_torch_in_jax(errors)
    probe_sharding(caps)
    res["torch→jax capabilities"] = caps
    res["jax→torch capabilities"] = probe_jax_in_torch()
    res["first call"] = first_calls()
    res["errors"] = {f"{d} / {n}": e for (d, n), e in errors.items()}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    text = markdown(res)
    print(text)
    print(f"\n({res['seconds']} s)")
    if args.update_readme:
        run.update_readme(text, "bridges")
    return res


if __name__ == "__main__":
    main()
