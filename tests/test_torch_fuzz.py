"""Random stacks of torch transformations on ``op.torch``, against the same stack on pure torch.

Hypothesis draws an op (host or traced, linear or not, pytree in and out, an
integer output, keyword operands and static keywords, every vmap mode,
``def_fwd``/``def_bwd``, ``out=True``), a dtype (float32/64, complex64/128
for the complex DFT) and a stack of up to ``DEPTH`` layers, each with random
parameters; the stack applied to ``op.torch`` must give what it gives applied
to the op's reference written in plain torch.

===========  ====================================================================
layer        what it does to f(*args)
===========  ====================================================================
call         nothing: f itself
vmap         ``torch.func.vmap`` with random ``in_dims`` (None, first or last axis,
             at least one not None), ``out_dims`` 0
jvp          ``torch.func.jvp``: (f, ∂f·ṫ) with fixed random tangents
vjp          ``torch.func.vjp``: ∂fᴴ·ȳ with a fixed random ȳ
grad         ``torch.func.grad`` of Σ f (Σ Re + Im for complex) in one argument
jacfwd       ``torch.func.jacfwd`` in one argument (real ops only)
jacrev       ``torch.func.jacrev`` in one argument (real ops only)
hessian      ``torch.func.hessian`` of Σ f in one argument (real ops only)
backward     ``(Σ f).backward()`` on fresh leaves, f ↦ their ``.grad``; the
             outermost layer only (autograd's backward runs outside torch.func)
===========  ====================================================================

What is drawn is what each op supports: host rules give first derivatives only
(``MissingRuleError`` beyond, test_torch.py), traced rules and linear ops every
order. Compiled ops are not drawn: op.torch runs Python callables only and
raises ``NotImplementedError`` for a compiled function (``torch/_front.py``).
Profiles and the log are ``fuzzing.py``'s (``ANYBIND_FUZZ``,
``ANYBIND_FUZZ_EXAMPLES``, ``ANYBIND_FUZZ_LOG``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from fuzzing import Fixed, fuzz
from ops import VMAP_MODES, axpy, fft, matvec, mul, scale, sincos, sort, tree
from test_fuzz import fwdbwd, inplace, traced_fn

pytestmark = pytest.mark.slow  # fuzz: random stacks of torch.func transformations (hypothesis)

F = torch.func
DEPTH = 3
MAX_ORDER = 2  # derivative layers (hessian counts 2) on ops whose rules allow every order


def _rn(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


# ------------------------------------------------------------------ ops

def _sort_ref(x):
    ind = torch.sort(x, dim=-1, stable=True).indices
    return torch.take_along_dim(x, ind, dim=-1), ind


@dataclasses.dataclass(frozen=True)
class TorchCase:
    """An op for the fuzzer: factory per vmap mode, pure-torch reference, example
    inputs (NumPy), and the modes, dtypes and derivative orders it allows."""
    name: str
    make: Callable[[str], Any]
    ref: Callable[..., Any]
    args: Callable[[], tuple]
    kwargs: Callable[[], dict] = dict
    modes: tuple = VMAP_MODES
    complex: bool = False  # True: complex dtypes only
    order: int = 1  # host rules: first derivatives only


_TWO = ("sequential", "vectorized")
OPS = [
    TorchCase("mul", mul, lambda x1, x2: x1 * x2**2, lambda: (_rn(3, 1), _rn(3, 2))),
    TorchCase("sin", lambda m: sincos(m)[0], torch.sin, lambda: (_rn(3, 3),), order=MAX_ORDER),
    TorchCase("cos", lambda m: sincos(m, "vjp")[1], torch.cos, lambda: (_rn(3, 4),),
              order=MAX_ORDER),
    TorchCase("matvec", matvec, lambda x, *, a: a @ x, lambda: (_rn(3, 5),),
              lambda: {"a": _rn((4, 3), 6)}, order=MAX_ORDER),
    TorchCase("fft", fft, lambda x: torch.fft.fft(x, dim=-1), lambda: (_rn(4, 7),),
              complex=True, order=MAX_ORDER),
    TorchCase("sort", sort, _sort_ref, lambda: (_rn(5, 8),)),
    TorchCase("tree", tree, lambda d: (d["a"] * torch.sin(d["b"]), (d["a"] + d["b"]).sum(-1)),
              lambda: ({"a": _rn((2, 3), 9), "b": _rn((2, 3), 10)},)),
    TorchCase("scale", scale, lambda x, *, w, power, axis: (w * x**power).sum(axis),
              lambda: (_rn((2, 3), 11),), lambda: {"w": _rn((2, 3), 12), "power": 3, "axis": -1}),
    TorchCase("axpy_host", axpy, lambda x, y: 2 * x + torch.roll(y, 1, -1),
              lambda: (_rn(4, 13), _rn(4, 14)), order=MAX_ORDER),
    TorchCase("fwdbwd", fwdbwd, lambda x: x * torch.sin(x), lambda: (_rn(3, 15),), modes=_TWO),
    TorchCase("inplace", inplace, lambda x, y: x * y + x, lambda: (_rn(3, 16), _rn(3, 17)),
              modes=_TWO),
    TorchCase("traced_fn", traced_fn, lambda x, y: {"p": x * torch.sin(y), "q": torch.cos(x)},
              lambda: (_rn(2, 18), _rn(2, 19)), modes=("sequential",), order=MAX_ORDER),
]
DTYPES = {False: (torch.float32, torch.float64), True: (torch.complex64, torch.complex128)}


# ------------------------------------------------------------------ stacks

def _leaves(tree) -> list:
    return [l for l in jax.tree.leaves(tree) if l.is_floating_point() or l.is_complex()]


def _floats(f):
    """f with only its floating (or complex) output leaves, as a tuple."""
    return lambda *a: tuple(_leaves(f(*a)))


def _total(f):
    return lambda *a: sum((l.real + l.imag).sum() if l.is_complex() else l.sum()
                          for l in _leaves(f(*a)))


@dataclasses.dataclass
class Stack:
    """The function under test and its reference, with what may still be stacked on them."""
    op: Callable
    ref: Callable
    specs: list  # (shape, dtype) of each positional argument
    order: int
    complex: bool
    closed: bool = False  # after backward nothing more is stacked
    names: list = dataclasses.field(default_factory=list)

    def both(self, layer: Callable[[Callable], Callable]) -> None:
        self.op, self.ref = layer(self.op), layer(self.ref)

    def out_specs(self) -> list:
        return [(tuple(o.shape), o.dtype) for o in _floats(self.ref)(*_random_like(self.specs,
                                                                                  None))]


def _random_like(specs, rng) -> list:
    rng = rng or np.random.default_rng(0)
    out = []
    for shape, dtype in specs:
        x = rng.normal(size=shape)
        if dtype.is_complex:
            x = x + 1j * rng.normal(size=shape)
        out.append(torch.from_numpy(np.asarray(x)).to(dtype))
    return out


def _backward(f):
    def run(*a):
        leaves = [x.detach().clone().requires_grad_() for x in a]
        # + 0·Σ leaves: a constant Σ f (the gradient of a linear op) still has a graph
        (_total(f)(*leaves) + sum(0 * x.real.sum() for x in leaves)).backward()
        return [x.grad for x in leaves]
    return run


def _apply(data, stk: Stack, name: str, rng) -> None:
    """Put layer ``name`` (with parameters drawn from ``data``) on top of ``stk``."""
    n = len(stk.specs)
    if name == "call":
        pass
    elif name == "vmap":
        dims = [data.draw(st.sampled_from([None, 0, len(s)]), label=f"in_dims[{i}]")
                for i, (s, _) in enumerate(stk.specs)]
        if all(d is None for d in dims):
            dims[0] = 0  # torch.func.vmap maps over at least one argument
        # out_dims 0 only: torch's own vmap (torch 2.13) raises "The expanded size of the
        # tensor ..." for another out_dims on an output not batched at that level (a
        # jvp's tangent or vjp's cotangent of a linear function), pure torch alike
        stk.both(lambda f: F.vmap(f, in_dims=tuple(dims)))
        stk.specs = [(s if d is None else s[:d] + (2,) + s[d:], t)
                     for (s, t), d in zip(stk.specs, dims)]
        name = f"vmap(in_dims={tuple(dims)})"
    elif name == "jvp":
        ts = _random_like(stk.specs, rng)
        stk.both(lambda f: lambda *a: F.jvp(_floats(f), a, tuple(ts)))
        stk.order -= 1
    elif name == "vjp":
        ct = tuple(_random_like(stk.out_specs(), rng))
        stk.both(lambda f: lambda *a: F.vjp(_floats(f), *a)[1](ct))
        stk.order -= 1
    elif name == "backward":
        stk.both(_backward)
        stk.order -= 1
        stk.closed = True
    else:  # grad, hessian, jacfwd, jacrev in one argument
        k = data.draw(st.integers(0, n - 1), label="argnum")
        if name in ("grad", "hessian"):
            t = F.grad if name == "grad" else F.hessian
            stk.both(lambda f: t(_total(f), argnums=k))
        else:
            jac = F.jacfwd if name == "jacfwd" else F.jacrev
            stk.both(lambda f: jac(_floats(f), argnums=k))
        stk.order -= 2 if name == "hessian" else 1
        name = f"{name}(argnums={k})"
    stk.names.append(name)


def _allowed(stk: Stack) -> list:
    names = ["call", "vmap"]
    if stk.order >= 1 and stk.out_specs():
        names += ["jvp", "vjp", "grad", "backward"]
        if not stk.complex:
            names += ["jacfwd", "jacrev"] + (["hessian"] if stk.order >= 2 else [])
    return names


def _tolerance(dtype) -> dict:
    single = dtype in (torch.float32, torch.complex64)
    return dict(rtol=2e-3, atol=2e-3) if single else dict(rtol=1e-8, atol=1e-8)


def _to_torch(tree, dtype):
    return jax.tree.map(lambda x: torch.from_numpy(np.asarray(x)).to(dtype)
                        if isinstance(x, np.ndarray) else x, tree)


def _run_example(data) -> str:
    case = data.draw(st.sampled_from(OPS), label="op")
    dtype = data.draw(st.sampled_from(DTYPES[case.complex]), label="dtype")
    mode = data.draw(st.sampled_from(case.modes), label="vmap mode")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    kw = _to_torch(case.kwargs(), dtype)
    op = case.make(mode)
    flat, tree = jax.tree.flatten(tuple(case.args()))
    # The stack sees flat positional tensors; the op and the reference see the pytree.
    stk = Stack(op=lambda *a: op.torch(*jax.tree.unflatten(tree, a), **kw),
                ref=lambda *a: case.ref(*jax.tree.unflatten(tree, a), **kw),
                specs=[(np.shape(x), dtype) for x in flat], order=case.order,
                complex=case.complex)
    depth = data.draw(st.integers(1, DEPTH), label="depth")
    for _ in range(depth):
        if stk.closed:
            break
        _apply(data, stk, data.draw(st.sampled_from(_allowed(stk)), label="layer"), rng)
    inputs = _random_like(stk.specs, rng)
    note = f"{case.name}[{mode}] {dtype} seed={seed}: {' ∘ '.join(stk.names)}"
    try:
        want = stk.ref(*inputs)
    except Exception as e:
        raise AssertionError(f"{note}: the pure-torch reference raised {e}") from e
    try:
        got = stk.op(*inputs)
    except Exception as e:
        raise AssertionError(f"{note} raised {type(e).__name__}: {e}") from e
    try:
        got_l, want_l = jax.tree.leaves(got), jax.tree.leaves(want)
        assert jax.tree.structure(got) == jax.tree.structure(want), \
            f"structure {jax.tree.structure(got)} != {jax.tree.structure(want)}"
        for g, w in zip(got_l, want_l, strict=True):
            torch.testing.assert_close(g, w, **_tolerance(dtype))
    except AssertionError as e:
        raise AssertionError(f"{note}: {e}") from None
    return note


def test_stacks_of_torch_transformations_agree_with_pure_torch():
    """Every drawn stack gives on ``op.torch`` what it gives on the pure-torch reference
    (values to 1e-8, 2e-3 in single precision), and raises nothing."""
    fuzz(_run_example, max_examples=100)


_STACKS = [["vmap", "hessian"], ["jvp", "jacrev"], ["vjp", "jacfwd"], ["call", "grad", "backward"],
           ["jacfwd", "vjp"], ["grad", "jvp"]]
_ALL_ORDERS = [c for c in OPS if c.order >= 2 and not c.complex]


@pytest.mark.parametrize("stack, case", [(s, _ALL_ORDERS[i % len(_ALL_ORDERS)])
                                         for i, s in enumerate(_STACKS)],
                         ids=lambda v: "-".join(v) if isinstance(v, list) else v.name)
def test_every_layer_under_a_second_derivative(stack, case):
    """Each layer at least once in a second-order stack, whatever the draws above cover."""
    _run_example(Fixed({"op": case, "depth": len(stack), "seed": 0, "dtype": torch.float64,
                        "vmap mode": case.modes[-1]}, stack))


def test_vmap_of_a_second_derivative_of_a_complex_op():
    """vmap ∘ grad ∘ grad of the complex DFT: op.torch conjugates without a lazy conj view,
    which torch.func.vmap cannot batch in the second derivative ('aten::_neg_view')."""
    case = next(c for c in OPS if c.complex)
    _run_example(Fixed({"op": case, "depth": 3, "seed": 0, "dtype": torch.complex128,
                        "vmap mode": case.modes[-1]}, ["grad", "grad", "vmap"]))
