"""Random stacks of transformations on every kind of op, against the same stack on pure JAX.

Hypothesis draws an op (host, traced or compiled, linear or not, pytree in and
out, integer outputs, keyword operands and static keywords, every vmap mode,
``def_fwd``/``def_bwd``, ``out=True``), a dtype (float32/64, complex64/128,
with x64 on or off; those the op supports) and a stack of up to ``DEPTH``
transformations, each with random parameters; the stack applied to the op must
give what it gives applied to the op's pure-JAX reference.

=====================  =========================================================
layer                  what it does to f(*args)
=====================  =========================================================
jit, checkpoint        ``jax.jit(f)``, ``jax.checkpoint(f)``
disable_jit            f run inside ``with jax.disable_jit()``
vmap                   random ``in_axes`` (None, first or last axis) and
                       ``out_axes`` (0 or -1; None when nothing is batched)
scan, cond, while      f as the body of ``lax.scan`` over two copies of the
                       args, as a taken branch of ``lax.cond``, as one trip of
                       ``lax.while_loop`` (after which no reverse mode)
jvp, linearize         (f, ∂f·ṫ) with fixed random tangents
vjp, linear_transpose  ∂fᵀ·ȳ with a fixed random ȳ (the latter by transposing
                       ``linearize``'s tangent map)
grad, hessian          of Σ f (holomorphic for complex) in one argument
jacfwd, jacrev         in one argument (holomorphic for complex)
=====================  =========================================================

Compiled ops (``compiled_ops.py``, float64 only) come in every importable
flavour (ctypes, cffi, Numba): x1·x2² with compiled jvp and vjp, a linear
cumsum with a compiled transpose, exp with a compiled fwd/bwd pair, axpby with
a compiled vjp only (no forward mode), abs_count (float and int64 outputs) and
scale_int (an int64 operand).

Profiles: ``ci`` (default: a fixed set of examples, about a minute) and
``long`` (``ANYBIND_FUZZ=long``, ``ANYBIND_FUZZ_EXAMPLES`` examples, default 10⁴).
``ANYBIND_FUZZ_OPS`` (comma-separated name prefixes, e.g. ``compiled_``) limits
the drawn ops; ``ANYBIND_FUZZ_LOG`` names a file that gets one line per example.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import anybind as ab
import compiled_ops as co
from fuzzing import Fixed, fuzz
from helpers import assert_tree_close
from ops import CASES, LINEAR_CASES, VMAP_MODES, Case, mul_ref

pytestmark = pytest.mark.slow  # fuzz: random stacks of transformations (hypothesis)


DEPTH = 3
MAX_ORDER = 2  # derivative layers (hessian counts 2) on ops whose rules allow every order
DTYPES = {True: (np.float32, np.float64, np.complex64, np.complex128),
          False: (np.float32, np.complex64)}


# ------------------------------------------------------------------ more ops

def _fwdbwd_ref(x):
    return x * jnp.sin(x)


@functools.cache
def fwdbwd(mode: str):
    """x·sin x with a fwd rule keeping (x, sin x, cos x) for the bwd rule, and a jvp rule."""
    op = ab.bind(lambda x: x * np.sin(x), shape=ab.like(0), vmap=mode, name=f"fwdbwd_{mode}")
    op.def_fwd(lambda x: (x * np.sin(x), (x, np.sin(x), np.cos(x))),
               residuals=lambda x: (x, x, x))
    op.def_bwd(lambda res, ct: ((res[1] + res[0] * res[2]) * ct,))
    op.def_jvp(lambda p, t: (np.sin(p[0]) + p[0] * np.cos(p[0])) * t[0])
    return op


def _inplace_ref(x, y):
    return x * y + x


@functools.cache
def inplace(mode: str):
    """x·y + x written into out (out=True), host jvp and vjp."""
    def fn(x, y, *, out):
        np.multiply(x, y, out=out)
        out += x

    op = ab.bind(fn, shape=ab.like(0), out=True, vmap=mode, name=f"inplace_{mode}")
    op.def_jvp(lambda p, t: t[0] * p[1] + p[0] * t[1] + t[0])
    op.def_vjp(lambda p, ct: ((p[1] + 1) * ct, p[0] * ct))
    return op


def _traced_ref(x, y):
    return {"p": x * jnp.sin(y), "q": jnp.cos(x)}


@functools.cache
def traced_fn(mode: str):
    """A traced function without rules (JAX's own derivatives), dict output."""
    return ab.bind(_traced_ref, traced=True, vmap=mode, name=f"traced_fn_{mode}")


def _rn(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


@dataclasses.dataclass(frozen=True)
class Fuzzed:
    """An op for the fuzzer: its case, the vmap modes, dtypes and derivative orders it allows."""
    case: Case
    modes: tuple = VMAP_MODES
    real: bool = True
    complex: bool = True
    order: int = 1  # host (or compiled) rules: first derivatives only
    dtypes: tuple | None = None  # None: every dtype of DTYPES
    forward: bool = True  # False: no jvp rule, reverse mode only


OPS = [
    Fuzzed(CASES["mul"]), Fuzzed(CASES["sin"], order=MAX_ORDER),
    Fuzzed(CASES["cos"], order=MAX_ORDER), Fuzzed(CASES["matvec"], order=MAX_ORDER),
    Fuzzed(CASES["fft"], real=False, order=MAX_ORDER), Fuzzed(CASES["sort"], complex=False),
    Fuzzed(CASES["tree"]), Fuzzed(CASES["scale"]),
    Fuzzed(LINEAR_CASES["axpy_traced"], order=MAX_ORDER),
    Fuzzed(Case("fwdbwd", fwdbwd, _fwdbwd_ref, lambda: (_rn(3, 20),)),
           modes=("sequential", "vectorized")),
    Fuzzed(Case("inplace", inplace, _inplace_ref, lambda: (_rn(3, 21), _rn(3, 22))),
           modes=("sequential", "vectorized")),
    Fuzzed(Case("traced_fn", traced_fn, _traced_ref, lambda: (_rn(2, 23), _rn(2, 24))),
           modes=("sequential",), order=MAX_ORDER),
]


# ------------------------------------------------------------------ compiled ops

def _scale_int_ref(x):
    return co.scale_int_ref(x, _K)


_K = np.array([2, -1, 3], dtype=np.int64)
_C_MODES = ("sequential", "vectorized")
_F64 = dict(dtypes=(np.float64,), complex=False)
_FLAVOURS = [f for f in co.FLAVOURS if f != "cffi" or importlib.util.find_spec("cffi")]
OPS += [Fuzzed(Case(f"compiled_mul_{f}", functools.partial(co.mul, f), mul_ref,
                    lambda: (_rn(3, 30), _rn(3, 31))), modes=_C_MODES, **_F64)
        for f in _FLAVOURS]
OPS += [
    # linear with a compiled transpose: its derivatives are itself and the transpose
    Fuzzed(Case("compiled_cumsum", co.cumsum, co.cumsum_ref, lambda: (_rn((2, 4), 32),)),
           modes=_C_MODES, order=MAX_ORDER, **_F64),
    Fuzzed(Case("compiled_exp", co.exp, co.exp_ref, lambda: (0.5 * _rn(3, 33),)),
           modes=_C_MODES, **_F64),
    Fuzzed(Case("compiled_axpby", co.axpby, co.axpby_ref,
                lambda: ({"x": _rn(3, 34), "y": _rn(3, 35)},), lambda: {"w": _rn(3, 36)}),
           modes=_C_MODES, forward=False, **_F64),
    Fuzzed(Case("compiled_abs_count", lambda m: co.abs_count(), co.abs_count_ref,
                lambda: (_rn(4, 37),)), modes=("sequential",), **_F64),
    # the int64 operand is closed over: the stack's layers see float arguments only
    Fuzzed(Case("compiled_scale_int", lambda m: lambda x: co.scale_int()(x, _K), _scale_int_ref,
                lambda: (_rn(3, 38),)), modes=("sequential",), **_F64),
]
_ONLY = tuple(os.environ.get("ANYBIND_FUZZ_OPS", "").split(",")) if os.environ.get(
    "ANYBIND_FUZZ_OPS") else ("",)
OPS = [o for o in OPS if o.case.name.startswith(_ONLY)]


# ------------------------------------------------------------------ stacks

def _cast(x, dtype, seed):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.inexact):
        return x
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 0.5j * _rn(x.shape, seed)
    return x.astype(dtype)


def _leaves(tree) -> list:
    return [l for l in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(jnp.result_type(l), jnp.inexact)]


def _floats(f):
    """f with only its floating (or complex) output leaves, as a list."""
    return lambda *a: _leaves(f(*a))


def _total(f):
    return lambda *a: sum(jnp.sum(l) for l in _leaves(f(*a)))


@dataclasses.dataclass
class Stack:
    """The function under test and its reference, with what may still be stacked on them."""
    op: Callable
    ref: Callable
    specs: list  # ShapeDtypeStruct of each positional argument
    order: int
    reverse: bool = True
    forward: bool = True
    names: list = dataclasses.field(default_factory=list)

    def both(self, layer: Callable[[Callable], Callable]) -> None:
        self.op, self.ref = layer(self.op), layer(self.ref)

    def out_specs(self) -> list:
        return jax.eval_shape(_floats(self.ref), *self.specs)


def _random_like(specs, rng) -> list:
    out = []
    for s in specs:
        x = rng.normal(size=s.shape)
        if jnp.issubdtype(s.dtype, jnp.complexfloating):
            x = x + 1j * rng.normal(size=s.shape)
        out.append(np.asarray(x, dtype=s.dtype))
    return out


def _nojit(f):
    def run(*a):
        with jax.disable_jit():
            return f(*a)
    return run


def _apply(data, stk: Stack, name: str, rng) -> None:
    """Put layer ``name`` (with parameters drawn from ``data``) on top of ``stk``."""
    cplx = jnp.issubdtype(stk.specs[0].dtype, jnp.complexfloating)
    n = len(stk.specs)
    if name == "jit":
        stk.both(jax.jit)
    elif name == "checkpoint":
        stk.both(jax.checkpoint)
    elif name == "disable_jit":
        stk.both(_nojit)
    elif name == "vmap":
        axes = [data.draw(st.sampled_from([None, 0, s.ndim]), label=f"in_axes[{i}]")
                for i, s in enumerate(stk.specs)]
        batched = any(a is not None for a in axes)
        out_axes = data.draw(st.sampled_from([0, -1] if batched else [None, 0]),
                             label="out_axes")
        size = 2
        stk.both(lambda f: jax.vmap(f, in_axes=tuple(axes), out_axes=out_axes,
                                    axis_size=None if batched else size))
        stk.specs = [s if a is None else jax.ShapeDtypeStruct(
            s.shape[:a] + (size,) + s.shape[a:], s.dtype) for s, a in zip(stk.specs, axes)]
        name = f"vmap(in_axes={tuple(axes)}, out_axes={out_axes})"
    elif name == "scan":
        stk.both(lambda f: lambda *a: jax.lax.scan(
            lambda c, xs: (c, f(*xs)), 0, [jnp.stack([x, 2 * x]) for x in a])[1])
    elif name == "cond":
        def cond(f):
            def run(*a):
                zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                     jax.eval_shape(f, *a))
                pred = jnp.real(jnp.sum(a[0])) > -1e30
                return jax.lax.cond(pred, f, lambda *_: zeros, *a)
            return run
        stk.both(cond)
    elif name == "while_loop":
        def loop(f):
            def run(*a):
                zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                     jax.eval_shape(f, *a))
                return jax.lax.while_loop(lambda s: s[0] < 1, lambda s: (s[0] + 1, f(*a)),
                                          (0, zeros))[1]
            return run
        stk.both(loop)
        stk.reverse = False
    elif name in ("jvp", "linearize"):
        ts = _random_like(stk.specs, rng)
        if name == "jvp":
            stk.both(lambda f: lambda *a: jax.jvp(_floats(f), a, tuple(ts)))
        else:
            stk.both(lambda f: lambda *a: (lambda o, lin: (o, lin(*ts)))(
                *jax.linearize(_floats(f), *a)))
        stk.order -= 1
    elif name in ("vjp", "linear_transpose"):
        ct = _random_like(stk.out_specs(), rng)
        if name == "vjp":
            stk.both(lambda f: lambda *a: jax.vjp(_floats(f), *a)[1](ct))
        else:
            stk.both(lambda f: lambda *a: jax.linear_transpose(
                jax.linearize(_floats(f), *a)[1], *a)(ct))
        stk.order -= 1
    else:  # grad, hessian, jacfwd, jacrev in one argument
        k = data.draw(st.integers(0, n - 1), label="argnum")
        if name == "grad":
            stk.both(lambda f: jax.grad(_total(f), argnums=k, holomorphic=cplx))
        elif name == "hessian":
            stk.both(lambda f: jax.hessian(_total(f), argnums=k, holomorphic=cplx))
        else:
            jac = jax.jacfwd if name == "jacfwd" else jax.jacrev
            stk.both(lambda f: jac(_floats(f), argnums=k, holomorphic=cplx))
        stk.order -= 2 if name == "hessian" else 1
        name = f"{name}(argnums={k})"
    stk.names.append(name)


_STRUCTURAL = ["jit", "vmap", "checkpoint", "scan", "cond", "while_loop", "disable_jit"]
_FORWARD = ["jvp", "linearize", "jacfwd"]
_REVERSE = ["grad", "vjp", "jacrev", "linear_transpose", "hessian"]


def _allowed(stk: Stack) -> list:
    names = list(_STRUCTURAL)
    if stk.order >= 1 and _leaves(stk.out_specs()):
        if stk.forward:
            names += _FORWARD
        if stk.reverse:
            # linear_transpose transposes linearize, hessian is jacfwd of jacrev: both
            # need forward mode
            names += [r for r in _REVERSE if (r != "hessian" or stk.order >= 2)
                      and (stk.forward or r not in ("hessian", "linear_transpose"))]
    return names


def _tolerance(dtype) -> dict:
    single = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
    return dict(rtol=2e-3, atol=2e-3) if single else dict(rtol=1e-8, atol=1e-8)


def _dtypes(fz: Fuzzed, x64: bool) -> list:
    """The dtypes ``fz`` is drawn in, with x64 on or off."""
    return [d for d in DTYPES[x64]
            if (fz.dtypes is None or d in fz.dtypes)
            and ((fz.real and not np.issubdtype(d, np.complexfloating))
                 or (fz.complex and np.issubdtype(d, np.complexfloating)))]


def _run_example(data) -> str:
    fz = data.draw(st.sampled_from(OPS), label="op")
    x64 = data.draw(st.sampled_from([b for b in (False, True) if _dtypes(fz, b)]), label="x64")
    dtypes = _dtypes(fz, x64)
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    mode = data.draw(st.sampled_from(fz.modes), label="vmap mode")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    with jax.enable_x64(x64):
        case = fz.case
        kw = {k: _cast(v, dtype, seed + 1) if isinstance(v, np.ndarray) else v
              for k, v in case.kwargs().items()}
        op = case.make(mode)
        flat, tree = jax.tree_util.tree_flatten(tuple(case.args()))
        flat = [_cast(x, dtype, seed + 2 + i) for i, x in enumerate(flat)]
        # The stack sees flat positional arrays; the op and the reference see the pytree.
        stk = Stack(op=lambda *a: op(*tree.unflatten(a), **kw),
                    ref=lambda *a: case.ref(*tree.unflatten(a), **kw),
                    specs=[jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in flat],
                    order=fz.order, forward=fz.forward)
        depth = data.draw(st.integers(1, DEPTH), label="depth")
        for _ in range(depth):
            _apply(data, stk, data.draw(st.sampled_from(_allowed(stk)), label="layer"), rng)
        inputs = _random_like(stk.specs, rng)
        note = f"{case.name}[{mode}] {np.dtype(dtype).name} x64={x64}: {' ∘ '.join(stk.names)}"
        want = stk.ref(*inputs)
        try:
            got = stk.op(*inputs)
        except Exception as e:
            raise AssertionError(f"{note} raised {type(e).__name__}: {e}") from e
        try:
            assert_tree_close(got, want, **_tolerance(dtype))
        except AssertionError as e:
            raise AssertionError(f"{note}: {e}") from None
    return note


def test_stacks_of_transformations_agree_with_pure_jax():
    """Every drawn stack gives on the op what it gives on the pure-JAX reference (values
    to 1e-8, 2e-3 in single precision), and raises nothing (``fuzzing.fuzz``)."""
    fuzz(_run_example)


_STACKS = [["vmap", "grad"], ["jvp", "vjp"], ["scan", "jacrev"], ["while_loop", "jacfwd"],
           ["cond", "hessian"], ["checkpoint", "linear_transpose"], ["disable_jit", "linearize"]]
_ALL_ORDERS = [o for o in OPS if o.order >= 2]


@pytest.mark.parametrize("stack, fz", [(s, _ALL_ORDERS[i % len(_ALL_ORDERS)])
                                       for i, s in enumerate(_STACKS)],
                         ids=lambda v: "-".join(v) if isinstance(v, list) else v.case.name)
def test_every_layer_under_a_second_derivative(stack, fz):
    """Each layer at least once in a second-order stack, whatever the draws above cover."""
    _run_example(Fixed({"op": fz, "x64": True, "depth": len(stack), "seed": 0,
                         "dtype": np.float64 if fz.real else np.complex128,
                         "vmap mode": fz.modes[-1]}, stack))
