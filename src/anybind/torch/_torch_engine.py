"""The torch engine of the bridges: torch code on XLA's buffers.

What ``ab.from_torch`` needs from torch (see ``_bridges``):

================  ==================================================================
piece             what it does
================  ==================================================================
``TorchHost``     fn on tensors over private copies of the inputs (no write reaches
                  XLA's buffers), NumPy views of its results out (XLA's runner copies
                  them into its output buffers); a call's carried draws replayed
``TorchDevice``   the same on CuPy views of XLA's device buffers, on XLA's stream
``TorchVmap``     the vmap rule: ``torch.vmap`` of fn, one call for the whole batch
``torch_jvp_of``  (x, ẋ) ↦ ∂f(x)·ẋ by torch's forward mode
``torch_vjp_of``  (x, ȳ) ↦ ∂f(x)ᵀ·ȳ by torch's reverse mode, in JAX's convention
================  ==================================================================

A derived function is again torch code, so the same engine runs it and
differentiates it again. Derived functions keep one form, in both engines:

- ``jvp(primals, tangents, **kw)``: a pytree like the output, ``None`` at integer
  leaves; ``tangents`` is like ``primals`` with ``None`` at integer leaves.
- ``vjp(primals, ct, **kw)``: x̄ = ∂f(x)ᵀ·ȳ (transposed, not conjugated), one
  pytree per positional argument with ``None`` at integer leaves; ``ct`` is like
  the output with ``None`` at integer leaves.

Zero tangents and cotangents arrive as zero arrays, never ``None``, at floating
leaves.
"""
from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable

import jax
import numpy as np
import torch
from jax import tree_util
from torch.autograd import forward_ad

from . import _draws, _effects, _torch, _trees

# ----------------------------------------------------------- arrays across

_BF16 = np.dtype(jax.numpy.bfloat16)


def _view_reader() -> Callable[[np.ndarray], torch.Tensor]:
    """Read-only NumPy array -> tensor over its memory, by a versioned DLPack capsule
    straight to torch (torch.from_dlpack's own checks cost twice as much); torch's
    public function where this torch cannot read such capsules."""
    probe = np.zeros(1)
    probe.flags.writeable = False
    try:
        _torch.from_dlpack_capsule(probe.__dlpack__(max_version=(1, 0)))
    except Exception:  # noqa: BLE001  (an older torch or NumPy)
        return torch.from_dlpack
    read = _torch.from_dlpack_capsule
    return lambda a: read(a.__dlpack__(max_version=(1, 0)))


view_tensor = _view_reader()




def as_tensor(a) -> torch.Tensor:
    """A tensor over the array's memory: no copy (read-only views through DLPack)."""
    if type(a) is np.ndarray:
        if a.dtype == _BF16:
            return as_tensor(a.view(np.uint16)).view(torch.bfloat16)
        if a.flags.writeable:
            return torch.from_numpy(a)
        return view_tensor(a)  # torch.from_numpy would warn about read-only memory
    if isinstance(a, np.generic):
        return torch.from_numpy(np.array(a))
    return torch.from_dlpack(a)  # a device array (CuPy)


def as_numpy(t) -> np.ndarray:
    """A NumPy view of a CPU tensor (a copy only where torch keeps a lazy conj/neg)."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.requires_grad:
        t = t.detach()
    try:  # refuses lazy conj/neg and bfloat16: below
        return t.numpy()
    except (RuntimeError, TypeError):
        pass
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def _is_float(t) -> bool:
    return t.is_floating_point() or t.is_complex()


def _conj(t):
    return t.conj().resolve_conj() if t is not None and t.is_complex() else t


def split_static(kw: dict) -> tuple[dict, dict]:
    """Keyword operands (pytrees of arrays) apart from static keywords."""
    operands, static = {}, {}
    for k, v in kw.items():
        leaves = tree_util.tree_leaves(v)
        if leaves and all(isinstance(l, (np.ndarray, np.generic, jax.Array, torch.Tensor,
                                         jax.ShapeDtypeStruct)) or hasattr(l, "__dlpack__")
                          for l in leaves):
            operands[k] = v
        else:
            static[k] = v
    return operands, static


def over(tree, fn):
    return tree_util.tree_map(fn, tree)


# -------------------------------------------------------------------- torch

class TorchHost:
    """A torch function as host code: tensors in, NumPy arrays out.

    Inputs are XLA's buffers, which no code may change: every input leaf is handed
    to the function as a private copy (torch2jax's out-of-place semantics), so no
    write reaches them, whatever its path (in place, ``.data``, ``out=``, a view,
    ``.numpy()``, ``data_ptr()`` and C code, a tensor kept and written later, a
    write that depends on the data). ``benchmarks/torch_writes.py`` measures what
    the copies cost against the checks that find a write only after it lands.
    A call of a function that draws random numbers carries its seeds (the
    ``_draws.DRAWS`` keyword operand): it runs with its generators seeded from
    them (``draws``: the op's, shared by its derived functions).
    """

    def __init__(self, fn: Callable, name: str, draws=None):
        self.fn, self.__name__, self.draws = fn, name, draws

    def __repr__(self) -> str:
        return f"<torch code of {self.__name__}>"

    def __call__(self, *args, **kw):
        if kw and _draws.DRAWS in kw:
            kw = dict(kw)
            seeds = kw.pop(_draws.DRAWS)
            if self.draws is not None:
                with _draws.replay(self.draws.generators,
                                   _draws.seeds_of(seeds, self.draws.n)):
                    return self._call(args, kw)
        return self._call(args, kw)

    def _call(self, args, kw):
        if not kw and all(type(a) is np.ndarray for a in args):  # the common case
            return _as_numpy_tree(self.fn(*[_private(a) for a in args]))
        a, k = over((args, kw), _copy_leaf)
        return _as_numpy_tree(self.fn(*a, **k))


def _copy_leaf(a):
    return _private(a) if isinstance(a, (np.ndarray, np.generic)) else a


def _private(a) -> torch.Tensor:
    """A tensor over a writable copy of an input leaf: what the function writes stays here."""
    return as_tensor(np.array(a))


def _as_numpy_tree(out):
    if isinstance(out, torch.Tensor):
        return as_numpy(out)
    if type(out) is tuple:  # the results of jvps and vjps: no tree_map over them
        leaves = [as_numpy(o) if isinstance(o, torch.Tensor) else _NOT_LEAF for o in out]
        if not any(l is _NOT_LEAF for l in leaves):
            return tuple(leaves)
    return over(plain_tree(out), as_numpy)


_NOT_LEAF = object()


def plain_tree(out):
    """``out`` as a JAX pytree of tensors (``_trees.jax_tree``), numbers as 0-d tensors."""
    return _trees.jax_tree(out, _number_tensor)


def _number_tensor(v) -> torch.Tensor:
    return as_tensor(np.asarray(v, _trees.number_dtype(v)))


class TorchDevice(TorchHost):
    """The same on CuPy views of XLA's device buffers, on XLA's stream (``stream=``).
    (Inputs are copied; draws from CUDA's generator are not carried.)"""

    def __call__(self, *args, stream: int, **kw):
        kw.pop(_draws.DRAWS, None)  # (CUDA's generator: not carried, see the contracts)
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"anybind op '{self.__name__}' runs torch code in a GPU program, which needs "
                f"a CUDA build of torch; this one ({torch.__version__}) has none")
        import cupy
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            ts = []
            args, kw = over((args, kw), _collect(ts, lambda a: torch.from_dlpack(a.copy()),
                                                 cupy.ndarray))
            out = self.fn(*args, **kw)
            return over(plain_tree(out), lambda t: cupy.from_dlpack(
                (t if t.is_cuda else t.cuda()).detach())  # (a number: a 0-d CPU tensor)
                if isinstance(t, torch.Tensor) else t)


def _collect(ts: list, convert: Callable, kinds) -> Callable:
    """A leaf map that converts arrays of ``kinds`` into tensors, keeping them in ``ts``."""
    def leaf(a):
        if isinstance(a, kinds):
            ts.append(convert(a))
            return ts[-1]
        return a
    return leaf


def _float_outputs(fn, leaves, tree, idx, kw, seen: dict):
    """g(*v): fn with the leaves at ``idx`` replaced by v, its floating output leaves.
    With ``seen["clone"]`` set, fn gets copies of v (for code that writes into its inputs,
    which autograd refuses on the inputs themselves), and runs with the running
    statistics of norms detached (``_effects.Buffers``: torch refuses them requiring
    grad), both set when a first run failed (no per-op cost where nothing fails)."""
    def g(*vs):
        full = list(leaves)
        clone = seen.get("clone", False)
        for i, v in zip(idx, vs):
            full[i] = v.clone() if clone else v
        with _effects.Buffers() if clone else contextlib.nullcontext():
            out = fn(*tree.unflatten(full), **kw)
        outs, seen["tree"] = tree_util.tree_flatten(plain_tree(out))
        seen["float"] = [_is_float(o) for o in outs]
        return tuple(o for o, f in zip(outs, seen["float"]) if f)
    return g


# torch numbers forward-AD levels process-wide, and a level must be left in the order it
# was entered: jvps that XLA runs at once on several threads (per shard, or independent
# calls of one program) take turns. Reentrant: a jvp of a jvp nests in one thread.
_FORWARD_AD = threading.RLock()


_DERIVED = "__anybind_derived__"  # a jvp or vjp made here: it differentiates inside


def _plain(fn, ts) -> bool:
    """Whether torch's plain autograd may compute a jvp or vjp of ``fn`` here, at a
    quarter of torch.func's cost: nothing differentiates this call (host code run by
    XLA), and ``fn`` is first-order user code. Under a transform (the call is itself
    being differentiated), or for a derivative of a derivative, torch.func composes."""
    return not (getattr(fn, _DERIVED, False)
                or _torch.transforms_active()
                or _torch.dual_level() >= 0
                or any(t.requires_grad for t in ts))


def _tangents(fn, g, xs, ts, seen: dict) -> tuple:
    """The tangents of g's outputs at xs along ts (g: fn on some of its leaves)."""
    if _plain(fn, [*xs, *ts]):
        try:
            return _by_forward_ad(g, xs, ts)
        except RuntimeError:  # code that takes torch.func transforms itself (or that
            _draws.rewind()   # torch refuses, tried again below); each run draws alike
    try:
        return torch.func.jvp(g, tuple(xs), tuple(ts))[1]
    except RuntimeError:
        # what torch.func refuses: a write into an input (done on copies, then), a norm's
        # running statistic that carries a tangent (detached, then), an
        # autograd.Function without setup_context (plain forward AD, where no level is open)
        seen["clone"] = True
        _draws.rewind()
        if _torch.dual_level() >= 0 or _torch.transforms_active():
            return torch.func.jvp(g, tuple(xs), tuple(ts))[1]
        return _by_forward_ad(g, xs, ts)


def _by_forward_ad(g, xs, ts) -> tuple:
    with forward_ad.dual_level():
        outs = g(*[forward_ad.make_dual(x, t) for x, t in zip(xs, ts)])
        dual = [forward_ad.unpack_dual(o) for o in outs]
    return tuple(torch.zeros_like(d.primal) if d.tangent is None else d.tangent
                 for d in dual)


def _cotangents(fn, g, xs, cts_of: Callable, seen: dict) -> tuple:
    """The cotangents of xs (torch's convention) for g's outputs' ``cts_of()``."""
    if _plain(fn, xs):
        try:
            return _by_autograd(g, xs, cts_of)
        except RuntimeError:  # code that takes torch.func transforms itself (or that
            _draws.rewind()   # torch refuses, tried again below); each run draws alike
    try:
        _, pullback = torch.func.vjp(g, *xs)
        return pullback(cts_of())
    except RuntimeError:
        # what torch.func refuses: a write into an input (done on copies, then), a norm's
        # running statistic that requires grad (detached, then), an
        # autograd.Function without setup_context (plain autograd, as torch's double
        # backward, keeping the graph where an outer plain autograd differentiates this)
        seen["clone"] = True
        _draws.rewind()
        if _torch.transforms_active():
            _, pullback = torch.func.vjp(g, *xs)
            return pullback(cts_of())
        return _by_autograd(g, xs, cts_of)


def _by_autograd(g, xs, cts_of: Callable) -> tuple:
    with torch.enable_grad():
        vs = [x if x.requires_grad else x.detach().requires_grad_() for x in xs]
        outs = g(*vs)
        cts = cts_of()
        used = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
        keep = any(x.requires_grad for x in xs) or any(
            c is not None and c.requires_grad for c in cts)
        got = _torch.autograd_grad([o for o, _ in used], vs, [c for _, c in used], keep) \
            if used else [None] * len(vs)
    return tuple(torch.zeros_like(x) if c is None else c for x, c in zip(xs, got))


def torch_jvp_of(fn: Callable) -> Callable:
    """(x, ẋ) ↦ ∂f(x)·ẋ by torch's forward-mode AD (which matches JAX's jvp)."""
    def jvp(primals, tangents, **kw):
        leaves, tree = tree_util.tree_flatten(tuple(primals))
        tans = tree.flatten_up_to(tuple(tangents))
        idx = [i for i, (p, t) in enumerate(zip(leaves, tans)) if t is not None and _is_float(p)]
        seen: dict = {}
        g = _float_outputs(fn, leaves, tree, idx, kw, seen)
        if idx:
            with _FORWARD_AD:
                touts = _tangents(fn, g, [leaves[i] for i in idx], [tans[i] for i in idx], seen)
        else:
            touts = tuple(torch.zeros_like(o) for o in g())
        it = iter(touts)
        return seen["tree"].unflatten([next(it) if f else None for f in seen["float"]])
    jvp.__name__ = f"jvp_of_{getattr(fn, '__name__', 'fn')}"
    setattr(jvp, _DERIVED, True)
    return jvp


def torch_vjp_of(fn: Callable) -> Callable:
    """(x, ȳ) ↦ ∂f(x)ᵀ·ȳ by torch's reverse mode: x̄ = conj(vjp_torch(conj(ȳ)))."""
    def vjp(primals, ct, **kw):
        leaves, tree = tree_util.tree_flatten(tuple(primals))
        idx = [i for i, p in enumerate(leaves) if _is_float(p)]
        seen: dict = {}
        g = _float_outputs(fn, leaves, tree, idx, kw, seen)
        full = [None] * len(leaves)
        if idx:
            def cts_of():
                cts = seen["tree"].flatten_up_to(ct)
                return tuple(_conj(c) for c, f in zip(cts, seen["float"]) if f)
            got = _cotangents(fn, g, [leaves[i] for i in idx], cts_of, seen)
            for i, c in zip(idx, got):
                full[i] = _conj(c)
        return tuple(tree.unflatten(full))
    vjp.__name__ = f"vjp_of_{getattr(fn, '__name__', 'fn')}"
    setattr(vjp, _DERIVED, True)
    return vjp


class TorchVmap:
    """The vmap rule of torch code: ``torch.vmap`` of it, one call for the whole batch
    (or ``rule``, the user's vmap rule on tensors). A call that carries draws runs the
    whole batch from its first row's seeds, ``torch.vmap`` drawing differently per row
    (``randomness="different"``), as its derived rules do from the same seeds."""

    def __init__(self, fn: Callable, name: str, rule: Callable | None = None, draws=None):
        self.fn, self.__name__, self.rule, self.draws = fn, name, rule, draws

    def batched(self, axis_size, in_batched, *args, **kw):
        """The rule on torch tensors: ``(out, out_batched)``."""
        drawn = _draws.DRAWS in in_batched.kwargs
        if drawn:
            in_batched = copy.copy(in_batched)
            in_batched.kwargs = {k: v for k, v in in_batched.kwargs.items()
                                 if k != _draws.DRAWS}
        if self.rule is not None:
            return self.rule(axis_size, in_batched, *args, **kw)
        operands = {k: kw[k] for k in in_batched.kwargs}
        static = {k: v for k, v in kw.items() if k not in in_batched.kwargs}
        leaves, tree = tree_util.tree_flatten((args, operands))
        flags = tree.flatten_up_to((tuple(in_batched), dict(in_batched.kwargs)))
        fn, seen = self.fn, {}

        def g(*ls):
            a, k = tree.unflatten(ls)
            outs, seen["tree"] = tree_util.tree_flatten(plain_tree(fn(*a, **k, **static)))
            return tuple(outs)
        outs = torch.vmap(g, in_dims=tuple(0 if f else None for f in flags),
                          randomness="different" if drawn else "error")(*leaves)
        return seen["tree"].unflatten(list(outs)), True

    def __call__(self, axis_size, in_batched, *args, **kw):
        flag = []

        def run(*a, **k):
            out, b = self.batched(axis_size, in_batched, *a, **k)
            flag.append(b)
            return out
        return TorchHost(run, self.__name__, self.draws)(*args, **kw), flag[0]


class TorchVmapDevice(TorchVmap):
    """The same on CuPy views of XLA's device buffers, on XLA's stream."""

    def __call__(self, axis_size, in_batched, *args, stream: int, **kw):
        flag = []

        def run(*a, **k):
            out, b = self.batched(axis_size, in_batched, *a, **k)
            flag.append(b)
            return out
        return TorchDevice(run, self.__name__)(*args, stream=stream, **kw), flag[0]
