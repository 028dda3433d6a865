"""Ops under test, as cached factories, with pure-JAX references.

Every factory is cached on its arguments, so tests share one op (and JAX's
compilation caches) per configuration. Each op comes with a reference written
in plain ``jax.numpy`` that the tests compare against, values and derivatives.

=============  =================================================================
op             what it exercises
=============  =================================================================
mul            JAXbind paper's f(x1, x2) = x1·x2², host jvp + vjp
sin / cos      host functions whose traced jvp rules call each other (all orders)
matvec         linear=True, keyword array operand A, host transpose Aᵀ·ȳ
fft            linear=True, complex, numpy.fft; transpose of the DFT is itself
sort           NumPy sort returning (sorted, int64 index) (torch.func NumpySort)
tree           dict in, tuple out
scale          array keyword ``w`` (operand) and static keywords ``power``, ``axis``
=============  =================================================================
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab
from helpers import randn

VMAP_MODES = ("sequential", "vectorized", "rule")


def _mode(mode: str):
    """The ``vmap=`` argument for a mode name; "rule" gets a rule set later."""
    return "sequential" if mode == "rule" else mode


# --------------------------------------------------------------------- mul

def mul_ref(x1, x2):
    return x1 * x2**2


@functools.cache
def mul(mode: str = "vectorized", traced_rules: bool = False):
    """f(x1, x2) = x1·x2² with host (or traced) jvp and vjp rules."""
    xp = jnp if traced_rules else np

    def jvp(primals, tangents):
        (x1, x2), (d1, d2) = primals, tangents
        return x2**2 * d1 + 2 * x1 * x2 * d2

    def vjp(primals, ct):
        x1, x2 = primals
        return x2**2 * ct, 2 * x1 * x2 * ct

    op = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap=_mode(mode),
                 name=f"mul_{mode}{'_traced' if traced_rules else ''}")
    op.def_jvp(jvp, traced=traced_rules)
    op.def_vjp(vjp, traced=traced_rules)
    if mode == "rule":
        @op.def_vmap
        def _(axis_size, in_batched, x1, x2):
            # batched args lead with the batch axis; unbatched ones broadcast
            x1 = x1 if in_batched[0] else x1[None]
            x2 = x2 if in_batched[1] else x2[None]
            return np.broadcast_to(x1 * x2**2, (axis_size,) + np.broadcast_shapes(
                x1.shape[1:], x2.shape[1:])), True
    del xp
    return op


# ----------------------------------------------------------------- sin / cos

@functools.cache
def sincos(mode: str = "vectorized", rules: str = "jvp"):
    """Host sin and cos whose traced rules call each other: derivatives of every order.

    ``rules`` is "jvp" (traced jvp only, vjp by transposition), "vjp" (traced
    vjp only, jvp by transposition) or "both".
    """
    sin = ab.bind(np.sin, shape=ab.like(0), vmap=_mode(mode), name=f"sin_{mode}_{rules}")
    cos = ab.bind(np.cos, shape=ab.like(0), vmap=_mode(mode), name=f"cos_{mode}_{rules}")
    if rules in ("jvp", "both"):
        sin.def_jvp(lambda p, t: cos(p[0]) * t[0], traced=True)
        cos.def_jvp(lambda p, t: -sin(p[0]) * t[0], traced=True)
    if rules in ("vjp", "both"):
        sin.def_vjp(lambda p, ct: (cos(p[0]) * ct,), traced=True)
        cos.def_vjp(lambda p, ct: (-sin(p[0]) * ct,), traced=True)
    if mode == "rule":
        for op, f in ((sin, np.sin), (cos, np.cos)):
            op.def_vmap(functools.partial(_elementwise_vmap, f))
    return sin, cos


def _elementwise_vmap(f, axis_size, in_batched, x):
    return (f(x), True) if in_batched[0] else (f(x), False)


# ------------------------------------------------------------------ matvec

def matvec_ref(x, *, a):
    return a @ x


@functools.cache
def matvec(mode: str = "vectorized", with_transpose: bool = True):
    """y = A·x, linear in x; A is a keyword operand (non-differentiable)."""
    def fn(x, *, a):
        return np.einsum("...ij,...j->...i", a, x)

    def transpose(ct, *, a):
        return (np.einsum("...ij,...i->...j", a, ct),)

    def shape(x, *, a):
        return jax.ShapeDtypeStruct(a.shape[:-1], jnp.result_type(a.dtype, x.dtype))

    op = ab.bind(fn, shape=shape, linear=True, vmap=_mode(mode),
                 name=f"matvec_{mode}")
    if with_transpose:
        op.def_transpose(transpose)
    if mode == "rule":
        @op.def_vmap
        def _(axis_size, in_batched, x, *, a):
            x = x if in_batched[0] else x[None]
            a = a if in_batched.kwargs["a"] else a[None]
            out = np.einsum("...ij,...j->...i", a, x)
            return np.broadcast_to(out, (axis_size,) + out.shape[1:]), True
    return op


# --------------------------------------------------------------------- fft

def fft_ref(x):
    return jnp.fft.fft(x)


@functools.cache
def fft(mode: str = "vectorized"):
    """Unnormalised DFT along the last axis: linear, complex, its own transpose.

    The DFT matrix F is symmetric, and JAX transposes complex-linear maps
    without conjugation, so Fᵀ·ȳ = F·ȳ = fft(ȳ).
    """
    op = ab.bind(lambda x: np.fft.fft(x, axis=-1), shape=ab.like(0), linear=True,
                 vmap=_mode(mode), name=f"fft_{mode}")
    op.def_transpose(lambda ct: (np.fft.fft(ct, axis=-1),))
    if mode == "rule":
        op.def_vmap(lambda axis_size, in_batched, x: (np.fft.fft(x, axis=-1), in_batched[0]))
    return op


# -------------------------------------------------------------------- sort

def sort_ref(x):
    ind = jnp.argsort(x, axis=-1, stable=True)
    return jnp.take_along_axis(x, ind, axis=-1), ind


@functools.cache
def sort(mode: str = "vectorized"):
    """(sorted x, argsort index) along the last axis; the index is int64."""
    def fn(x):
        ind = np.argsort(x, axis=-1, kind="stable")
        return np.take_along_axis(x, ind, axis=-1), ind.astype(np.int64)

    def shape(x):
        return (jax.ShapeDtypeStruct(x.shape, x.dtype),
                jax.ShapeDtypeStruct(x.shape, np.int64))

    def jvp(primals, tangents):
        (x,), (dx,) = primals, tangents
        ind = np.argsort(x, axis=-1, kind="stable")
        return np.take_along_axis(dx, ind, axis=-1), None

    def vjp(primals, ct):
        (x,), (ct_sorted, ct_ind) = primals, ct
        assert ct_ind is None  # integer outputs' cotangents arrive as None
        # vectorized calls: x or ct may carry a size-1 batch axis where the other is batched
        shape = np.broadcast_shapes(x.shape, ct_sorted.shape)
        ind = np.broadcast_to(np.argsort(x, axis=-1, kind="stable"), shape)
        out = np.zeros(shape, ct_sorted.dtype)
        np.put_along_axis(out, ind, np.broadcast_to(ct_sorted, shape), axis=-1)
        return (out,)

    op = ab.bind(fn, shape=shape, jvp=jvp, vjp=vjp, vmap=_mode(mode), name=f"sort_{mode}")
    if mode == "rule":
        op.def_vmap(lambda axis_size, in_batched, x: (fn(x), in_batched[0]))
    return op


# -------------------------------------------------------------------- tree

def tree_ref(d):
    return d["a"] * jnp.sin(d["b"]), (d["a"] + d["b"]).sum(axis=-1)


def tree_fn(d):
    return d["a"] * np.sin(d["b"]), (d["a"] + d["b"]).sum(axis=-1)


def tree_shape(d):
    a = d["a"]
    return (jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-1], a.dtype))


def tree_jvp(primals, tangents):
    (d,), (t,) = primals, tangents
    return (t["a"] * np.sin(d["b"]) + d["a"] * np.cos(d["b"]) * t["b"],
            (t["a"] + t["b"]).sum(axis=-1))


def tree_vjp(primals, ct):
    (d,), (c0, c1) = primals, ct
    c1 = np.expand_dims(c1, -1)
    return ({"a": c0 * np.sin(d["b"]) + c1, "b": c0 * d["a"] * np.cos(d["b"]) + c1},)


@functools.cache
def tree(mode: str = "vectorized"):
    """{"a": x, "b": y} ↦ (x·sin y, Σ(x + y) over the last axis)."""
    op = ab.bind(tree_fn, shape=tree_shape, jvp=tree_jvp, vjp=tree_vjp, vmap=_mode(mode),
                 name=f"tree_{mode}")
    if mode == "rule":
        @op.def_vmap
        def _(axis_size, in_batched, d):
            d = {k: v if in_batched[0][k] else v[None] for k, v in d.items()}
            return jax.tree.map(lambda o: np.broadcast_to(o, (axis_size,) + o.shape[1:]),
                                tree_fn(d)), True
    return op


# ------------------------------------------------------------------- scale

def scale_ref(x, *, w, power, axis):
    return (w * x**power).sum(axis=axis)


@functools.cache
def scale(mode: str = "vectorized"):
    """Σ_axis w·x^power: ``w`` an array keyword shaped like x, ``power``, ``axis`` static.

    Vectorized calls see a leading batch axis, so ``axis`` must be negative.
    """
    def fn(x, *, w, power, axis):
        return (w * x**power).sum(axis=axis)

    def shape(x, *, w, power, axis):
        return jax.ShapeDtypeStruct(tuple(np.delete(np.array(x.shape, int), axis)), x.dtype)

    def jvp(primals, tangents, *, w, power, axis):
        (x,), (dx,) = primals, tangents
        return (w * power * x**(power - 1) * dx).sum(axis=axis)

    def vjp(primals, ct, *, w, power, axis):
        (x,) = primals
        return (w * power * x**(power - 1) * np.expand_dims(ct, axis),)

    op = ab.bind(fn, shape=shape, jvp=jvp, vjp=vjp, vmap=_mode(mode), name=f"scale_{mode}")
    if mode == "rule":
        @op.def_vmap
        def _(axis_size, in_batched, x, *, w, power, axis):
            x = x if in_batched[0] else x[None]
            w = w if in_batched.kwargs["w"] else w[None]
            out = fn(x, w=w, power=power, axis=axis)
            return np.broadcast_to(out, (axis_size,) + out.shape[1:]), True
    return op


# -------------------------------------------------------------------- cases

@dataclasses.dataclass(frozen=True)
class Case:
    """An op under test: how to make it per vmap mode, its reference, example inputs.

    ``args()`` are the positional arguments, ``kwargs()`` the keywords (array
    operands and static values); both are fresh arrays from a fixed seed.
    """
    name: str
    make: Callable[[str], Any]
    ref: Callable[..., Any]
    args: Callable[[], tuple]
    kwargs: Callable[[], dict] = dict

    def op(self, mode: str = "vectorized") -> Callable[..., Any]:
        """The op with this case's keywords bound: a function of the positional args."""
        op = self.make(mode)
        return lambda *args: op(*args, **self.kwargs())

    def reference(self) -> Callable[..., Any]:
        return lambda *args: self.ref(*args, **self.kwargs())

    def batched_args(self, size: int = 2) -> tuple:
        """``args()`` with a leading batch axis on every leaf, rows differing."""
        return jax.tree.map(lambda *rows: np.stack(rows),
                            *[_reseed(self.args(), k) for k in range(size)])

    def __repr__(self) -> str:
        return self.name


def _reseed(tree, k: int):
    """Perturb the example inputs so that batch rows differ (row 0 is the original)."""
    return jax.tree.map(lambda x: x + 0.25 * k * np.ones_like(x)
                        if np.issubdtype(x.dtype, np.inexact) else x, tree)


def _rn(shape, dtype=np.float64, seed=0):
    return randn(shape, dtype, seed=seed)


CASES = {c.name: c for c in [
    Case("mul", mul, mul_ref, lambda: (_rn(3), _rn(3, seed=1))),
    Case("sin", lambda m: sincos(m)[0], jnp.sin, lambda: (_rn(3, seed=2),)),
    Case("cos", lambda m: sincos(m)[1], jnp.cos, lambda: (_rn(3, seed=3),)),
    Case("matvec", matvec, matvec_ref, lambda: (_rn(3, seed=4),),
         lambda: {"a": _rn((4, 3), seed=5)}),
    Case("fft", fft, fft_ref, lambda: (_rn(4, np.complex128, seed=6),)),
    Case("sort", sort, sort_ref, lambda: (_rn(5, seed=7),)),
    Case("tree", tree, tree_ref, lambda: ({"a": _rn((2, 3), seed=8), "b": _rn((2, 3), seed=9)},)),
    Case("scale", scale, scale_ref, lambda: (_rn((2, 3), seed=10),),
         lambda: {"w": _rn((2, 3), seed=11), "power": 3, "axis": -1}),
]}


# ---------------------------------------------------------- two-argument linear

def axpy_ref(x, y):
    return 2 * x + jnp.roll(y, 1, axis=-1)


@functools.cache
def axpy(mode: str = "vectorized", traced: bool = False, with_transpose: bool = True):
    """(x, y) ↦ 2x + roll(y, 1): linear in both arguments jointly.

    Host with a host transpose ȳ ↦ (2ȳ, roll(ȳ, -1)); or traced, with a traced
    transpose or (with_transpose=False) none, so that JAX transposes the function.
    """
    xp = jnp if traced else np
    op = ab.bind(lambda x, y: 2 * x + xp.roll(y, 1, axis=-1), shape=ab.like(0), linear=True,
                 traced=traced, vmap=_mode(mode),
                 name=f"axpy_{mode}_{'traced' if traced else 'host'}_{with_transpose}")
    if with_transpose:
        op.def_transpose(lambda ct: (2 * ct, xp.roll(ct, -1, axis=-1)), traced=traced)
    if mode == "rule":
        def rule(axis_size, in_batched, x, y):
            x = x if in_batched[0] else x[None]
            y = y if in_batched[1] else y[None]
            out = 2 * x + xp.roll(y, 1, axis=-1)
            return xp.broadcast_to(out, (axis_size,) + out.shape[1:]), True
        op.def_vmap(rule, traced=traced)
    return op


LINEAR_CASES = {c.name: c for c in [
    CASES["matvec"],
    CASES["fft"],
    Case("axpy_host", axpy, axpy_ref, lambda: (_rn(4, seed=12), _rn(4, seed=13))),
    Case("axpy_traced", lambda m: axpy(m, traced=True), axpy_ref,
         lambda: (_rn(4, seed=12), _rn(4, seed=13))),
    Case("axpy_traced_no_transpose", lambda m: axpy(m, traced=True, with_transpose=False),
         axpy_ref, lambda: (_rn(4, seed=12), _rn(4, seed=13))),
]}


# ------------------------------------------------------- two-output linear map

def split_ref(x, y):
    return x + y, 2 * jnp.roll(x, 1, axis=-1)


@functools.cache
def split(mode: str = "vectorized"):
    """(x, y) ↦ (x + y, 2·roll(x, 1)): linear, two inputs and two outputs."""
    op = ab.bind(lambda x, y: (x + y, 2 * np.roll(x, 1, axis=-1)), shape=lambda x, y: (x, x),
                 linear=True, vmap=_mode(mode), name=f"split_{mode}",
                 transpose=lambda ct: (ct[0] + 2 * np.roll(ct[1], -1, axis=-1), ct[0]))
    if mode == "rule":
        def rule(axis_size, in_batched, x, y):
            x = x if in_batched[0] else x[None]
            y = y if in_batched[1] else y[None]
            return tuple(np.broadcast_to(o, (axis_size,) + o.shape[1:])
                         for o in (x + y, 2 * np.roll(x, 1, axis=-1))), True
        op.def_vmap(rule)
    return op


LINEAR_CASES["split"] = Case("split", split, split_ref, lambda: (_rn(4, seed=14), _rn(4, seed=15)))


# ------------------------------------------------------------- multilinear maps

def bimul_ref(x, y):
    return x * y, x * y


def matvec2_ref(a, x):
    return a @ x


def trimul_ref(d, y, z):
    return (d["a"] + 2 * d["b"]) * y * z


@functools.cache
def multilinear_op(name: str, mode: str = "vectorized", kind: str = "host"):
    """Multilinear ops with a transpose per argument.

    - ``bimul``: JAXbind's demo (x, y) ↦ (x·y, x·y), elementwise, two outputs.
    - ``matvec2``: (A, x) ↦ A·x, linear in the matrix and in the vector.
    - ``trimul``: ({"a", "b"}, y, z) ↦ (a + 2b)·y·z, complex, a pytree argument.

    ``kind``: "host" (host function and transposes), "traced" (traced function and
    transposes) or "jax" (traced function, JAX transposes it).
    """
    xp = np if kind == "host" else jnp
    if name == "bimul":
        fn = lambda x, y: (x * y, x * y)
        shape = lambda x, y: (x, x)
        ts = (lambda p, ct: p[1] * ct[0] + p[1] * ct[1],
              lambda p, ct: p[0] * ct[0] + p[0] * ct[1])
    elif name == "matvec2":
        fn = lambda a, x: xp.einsum("...ij,...j->...i", a, x)
        shape = lambda a, x: jax.ShapeDtypeStruct(a.shape[:-1], a.dtype)
        ts = (lambda p, ct: ct[..., :, None] * p[1][..., None, :],
              lambda p, ct: xp.einsum("...ij,...i->...j", p[0], ct))
    else:
        fn = lambda d, y, z: (d["a"] + 2 * d["b"]) * y * z
        shape = ab.like(1)
        ts = (lambda p, ct: {"a": ct * p[1] * p[2], "b": 2 * ct * p[1] * p[2]},
              lambda p, ct: ct * (p[0]["a"] + 2 * p[0]["b"]) * p[2],
              lambda p, ct: ct * (p[0]["a"] + 2 * p[0]["b"]) * p[1])
    op = ab.bind(fn, shape=None if kind != "host" else shape, multilinear=True,
                 traced=kind != "host", vmap=_mode(mode),
                 transpose=None if kind == "jax" else ts, name=f"{name}_{mode}_{kind}")
    if mode == "rule":
        def rule(axis_size, in_batched, *args):
            args = [a if b else jax.tree.map(lambda l: l[None], a)
                    for a, b in zip(args, [any(jax.tree.leaves(b)) for b in in_batched])]
            out = fn(*args)
            return jax.tree.map(lambda o: xp.broadcast_to(o, (axis_size,) + o.shape[1:]),
                                out), True
        op.def_vmap(rule, traced=kind != "host")
    return op


MULTILINEAR_CASES = {c.name: c for c in [
    Case("bimul", functools.partial(multilinear_op, "bimul"), bimul_ref,
         lambda: (_rn(4, seed=20), _rn(4, seed=21))),
    Case("matvec2", functools.partial(multilinear_op, "matvec2"), matvec2_ref,
         lambda: (_rn((3, 4), seed=22), _rn(4, seed=23))),
    Case("trimul", functools.partial(multilinear_op, "trimul"), trimul_ref,
         lambda: ({"a": _rn(3, np.complex128, seed=24), "b": _rn(3, np.complex128, seed=25)},
                  _rn(3, np.complex128, seed=26), _rn(3, np.complex128, seed=27))),
]}
