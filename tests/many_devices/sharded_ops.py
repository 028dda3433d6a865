"""Ops with ``shard=`` rules for the many-device tests, with pure-JAX references.

Each host function and host rule records the shapes it is called with in
``REC``, so a test can count host calls per device and see the shard's shape.

========  ==================================================================
op        what it exercises
========  ==================================================================
scale     "b n, n -> b n", n replicated: a weight that arrives whole; host
          or traced rules; every vmap mode
cube      "elementwise", host rules; cube_traced: a traced jvp only (its
          vjp by transposition)
rowfft    linear=True, "b n -> b n", n replicated (the FFT axis stays whole)
stats     keyword operand and two outputs: "b n, n -> b n, b"
saved     fwd/bwd with a residual shaped like the input
========  ==================================================================
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from devices import Recorder

import anybind as ab

REC = Recorder()
MODES = ("sequential", "vectorized", "rule")


def scale_ref(x, w):
    return x * jnp.sin(w)[..., None, :]


@functools.cache
def scale(mode: str = "sequential", traced_rules: bool = False):
    def f(x, w):
        REC("f", x, w)
        return x * np.sin(w)[..., None, :]

    op = ab.bind(f, shape=ab.like(0), shard="b n, n -> b n", replicated=("n",),
                 vmap="sequential" if mode == "rule" else mode,
                 name=f"scale_{mode}{'_traced' if traced_rules else ''}")
    if mode == "rule":
        op.def_vmap(lambda size, inb, x, w: (f(x, w), True))
    if traced_rules:
        op.def_jvp(lambda p, t: t[0] * jnp.sin(p[1])[..., None, :]
                   + p[0] * (jnp.cos(p[1]) * t[1])[..., None, :], traced=True)
        return op

    @op.def_jvp
    def _(p, t):
        (x, w), (dx, dw) = p, t
        REC("jvp", x, w, dx, dw)
        return dx * np.sin(w)[..., None, :] + x * (np.cos(w) * dw)[..., None, :]

    @op.def_vjp
    def _(p, ct):
        x, w = p
        REC("vjp", x, w, ct)
        return ct * np.sin(w)[..., None, :], (ct * x * np.cos(w)[..., None, :]).sum(-2)
    return op


def cube_ref(x):
    return x**3


@functools.cache
def cube():
    def f(x):
        REC("f", x)
        return x**3
    op = ab.bind(f, shape=ab.like(0), shard="elementwise", vmap="vectorized", name="cube")

    @op.def_jvp
    def _(p, t):
        REC("jvp", p[0], t[0])
        return 3 * p[0]**2 * t[0]

    @op.def_vjp
    def _(p, ct):
        REC("vjp", p[0], ct)
        return (3 * p[0]**2 * ct,)
    return op


@functools.cache
def cube_traced():
    def f(x):
        REC("f", x)
        return x**3
    op = ab.bind(f, shape=ab.like(0), shard="elementwise", vmap="vectorized",
                 name="cube_traced_jvp")
    op.def_jvp(lambda p, t: 3 * p[0]**2 * t[0], traced=True)
    return op


def rowfft_ref(x):
    return jnp.fft.fft(x, axis=-1)


@functools.cache
def rowfft():
    def f(x):
        REC("f", x)
        return np.fft.fft(x, axis=-1)

    def t(ct):
        REC("transpose", ct)
        return (np.fft.fft(ct, axis=-1),)  # the DFT matrix is symmetric
    return ab.bind(f, shape=ab.like(0), linear=True, transpose=t, vmap="vectorized",
                   shard="b n -> b n", replicated=("n",), name="rowfft")


def stats_ref(x, w):
    y = x * w[None, :]
    return y, y.sum(-1)


@functools.cache
def stats():
    def f(x, *, w):
        REC("f", x, w)
        y = x * w
        return y, y.sum(-1)
    return ab.bind(f, shape=lambda x, w: (x, jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
                   shard="b n, n -> b n, b",
                   replicated=("n",), name="stats", vmap="vectorized",
                   jvp=lambda p, t, w: (t[0] * w, (t[0] * w).sum(-1)),
                   vjp=lambda p, ct, w: ((ct[0] + ct[1][..., None]) * w,))


def saved_ref(x):
    return jnp.exp(x) * x


@functools.cache
def saved():
    op = ab.bind(lambda x: np.exp(x) * x, shape=ab.like(0), shard="b n -> b n", name="saved")

    @op.def_fwd(residuals=lambda x: x)
    def _(x):
        REC("fwd", x)
        e = np.exp(x)
        return e * x, e

    @op.def_bwd
    def _(e, ct):
        REC("bwd", e, ct)
        return (ct * e * (1 + np.log(e)),)

    @op.def_jvp
    def _(p, t):
        (x,), (dx,) = p, t
        return np.exp(x) * (1 + x) * dx
    return op
