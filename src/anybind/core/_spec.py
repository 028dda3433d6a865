"""What the user declared, and what one call of an op looks like.

``Call`` is the static description of one call site: the pytree structure of
the positional arguments, the keyword operands and the static keywords, the
flat input avals and the declared outputs. It is hashable, so it travels as a
primitive parameter and keys JAX's compilation caches.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import tree_util

from ._jax import ShapedArray, Tracer, canonicalize_dtype, is_symbolic_dim, issubdtype


@dataclasses.dataclass(frozen=True)
class Rule:
    """A user rule and whether it is JAX code (traced) or host code.

    ``vmap`` says how a host rule batches: ``"sequential"``, ``"expand_dims"``,
    ``"broadcast_all"``,
    a host function with the rule's signature written for batched arrays, or
    None for the op's mode (see ``_batching.host_mode``).

    ``out``: host code that writes its results into XLA's buffers (``out=``)
    and returns None, instead of returning them.

    ``device``: GPU code (``device=True``) that runs on XLA's device buffers as
    CuPy arrays, and ``host`` its fallback in programs compiled for the CPU (see
    ``routes._gpu_device``).
    """
    fn: Callable[..., Any]
    traced: bool
    symbolic_zeros: bool = False
    input_shapes: bool = False
    vmap: Any = None
    out: bool = False
    device: bool = False
    host: Callable[..., Any] | None = None

    @property
    def kind(self) -> str:
        return "traced" if self.traced else "device" if self.device else "host"


class like:
    """Output spec equal to the shape and dtype of positional argument ``index``.

    >>> import anybind as ab, numpy as np
    >>> double = ab.bind(lambda x: 2 * x, shape=ab.like(0))
    >>> double(np.ones(3, np.float32)).dtype
    dtype('float32')
    """

    def __init__(self, index: int):
        if not isinstance(index, int) or index < 0:
            raise TypeError(f"ab.like takes a non-negative argument index, got {index!r}")
        self.index = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.index >= len(args):
            raise TypeError(
                f"shape=ab.like({self.index}) refers to positional argument {self.index}, "
                f"but the op was called with {len(args)} positional argument(s)")
        return args[self.index]

    def __repr__(self) -> str:
        return f"ab.like({self.index})"


def is_float(aval) -> bool:
    """Whether values of this aval have a non-trivial tangent space."""
    return issubdtype(aval.dtype, np.inexact)


def fmt_aval(a) -> str:
    d = a.dtype  # a typed PRNG key's dtype (key<fry>) is no NumPy dtype
    return f"{np.dtype(d).name if isinstance(d, np.dtype) else d}{list(a.shape)}"


@dataclasses.dataclass(frozen=True, repr=False)
class Call:
    """One call signature of an op: structure, avals and static keywords.

    It holds its op (``op_ref``) strongly, so a jaxpr that uses the op keeps it
    alive, except in the twin that an op's own eager programs carry
    (``weak()``), which holds it weakly; both compare and hash alike, by the
    op's token, never reused.

    Equal calls share one ``_Identity``, so that comparing two of them runs no
    code that allocates: JAX's weakref caches, which hold a ``Call`` as a weak
    key (see ``_lifetime``), compare keys in the middle of a table lookup, and a
    garbage collection there can free another op's key and erase its entry
    from the table being searched (jaxlib 0.8 crashed so).
    """
    op_ref: Any = dataclasses.field(compare=False)  # the Op, or a weakref.ref to it
    args_tree: Any  # treedef of the tuple of positional arguments
    kw_tree: Any  # treedef of the dict of keyword operands
    static: tuple  # sorted (name, value) pairs of static keywords
    in_avals: tuple  # flat positional leaves
    kw_avals: tuple  # flat keyword operand leaves
    out_tree: Any
    out_avals: tuple
    out_paths: tuple = dataclasses.field(compare=False, hash=False)
    kw_paths: tuple = dataclasses.field(compare=False, hash=False)
    res_tree: Any = None  # residuals saved by a fwd rule for its bwd rule
    res_avals: tuple = ()
    static_types: tuple = ()  # so that 1, 1.0 and True are different static values
    # Tracers of enclosing traces that the op's traced code closes over: the last
    # ``n_closure`` leaves of ``kw_avals``, bound as operands (see _closures.py).
    n_closure: int = 0
    closed: tuple = dataclasses.field(default=(), compare=False, hash=False)
    converted: Any = dataclasses.field(default=None, compare=False, hash=False)
    debug: bool = False  # made in debug mode (see _debug): its programs check more
    # for a ``without_residuals`` Call, the Call it came from (whose fwd rule keeps them)
    with_residuals: Any = dataclasses.field(default=None, compare=False, hash=False)
    op_token: int = -1  # the op's identity, for comparison and hashing; set from op_ref
    # per output and residual leaf: declared 64-bit where x64 off made it 32-bit, so that
    # host code's 64-bit result narrows as JAX narrowed the declaration (nowhere else)
    out_wide: tuple = dataclasses.field(default=(), compare=False, hash=False)
    res_wide: tuple = dataclasses.field(default=(), compare=False, hash=False)
    _identity: _Identity = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.op_token == -1:
            object.__setattr__(self, "op_token", self.op._family.eager.token)
        # the op's token first, so that other ops' fields are never compared; a field that
        # may be None after a flag, so that a treedef never meets None
        key = (self.op_token, *(x for f in _COMPARED for v in [getattr(self, f)]
                                for x in (v is None, v)))
        with _identities_lock:
            same = _identities.get(key)
            if same is None:
                same = _identities[key] = _Identity(hash(key))
        object.__setattr__(self, "_identity", same)

    @property
    def op(self):
        op = self.op_ref
        if type(op) is weakref.ref:
            op = op()
            if op is None:
                raise ReferenceError(
                    "an anybind op was garbage collected while a program of its own eager "
                    "cache was being traced; keep a reference to the op")
        return op

    @functools.cached_property
    def without_residuals(self) -> Call:
        """This call as if the op had no fwd/bwd rules: forward mode's, which keeps none."""
        return dataclasses.replace(self, res_tree=None, res_avals=(), with_residuals=self)

    @functools.cached_property
    def debugging(self) -> Call:
        """This call in debug mode: a different primitive parameter, so a different program."""
        return dataclasses.replace(self, debug=True)

    def weak(self) -> Call:
        """This call, holding its op weakly (see ``_lifetime``)."""
        return dataclasses.replace(self, op_ref=weakref.ref(self.op))

    @property
    def n_in(self) -> int:
        return len(self.in_avals)

    @functools.cached_property
    def arg_trees(self) -> tuple:
        """The treedef of each positional argument."""
        return tuple(self.args_tree.children())

    @property
    def n_args(self) -> int:
        return len(self.arg_trees)

    def leaves_of(self, argnums) -> set:
        """The flat leaf indices of the given positional arguments."""
        starts = np.cumsum([0] + [t.num_leaves for t in self.arg_trees])
        return {i for a in argnums if a < self.n_args for i in range(starts[a], starts[a + 1])}

    @functools.cached_property
    def float_in(self) -> tuple:
        return tuple(is_float(a) for a in self.in_avals)

    @functools.cached_property
    def float_out(self) -> tuple:
        return tuple(is_float(a) for a in self.out_avals)

    def __hash__(self) -> int:  # hashed on every dispatch as a primitive parameter
        return self._identity.hash

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is Call and self._identity is other._identity)

    @functools.cached_property
    def _flat_args(self) -> bool:
        """Whether every positional argument is a single array."""
        return self.args_tree == tree_util.tree_structure((0,) * self.n_in)

    @functools.cached_property
    def _static(self) -> dict:
        return dict(self.static)

    @functools.cached_property
    def leaf_out(self) -> bool:
        """Whether the output is a single array (no pytree around it)."""
        return tree_util.treedef_is_leaf(self.out_tree)

    def args(self, xs) -> tuple:
        return tuple(xs) if self._flat_args else self.args_tree.unflatten(list(xs))

    def kwargs(self, ks) -> dict:
        """Keyword operands and static keywords; only to be unpacked with ``**``."""
        if self.n_closure:
            ks = ks[:len(ks) - self.n_closure]
        if not ks:
            return self._static
        kw = self.kw_tree.unflatten(list(ks))
        kw.update(self.static)
        return kw

    def __repr__(self) -> str:
        ins = ", ".join(fmt_aval(a) for a in self.in_avals)
        kws = "".join(f", {p[2:-2] if p.startswith('[') else p}={fmt_aval(a)}"
                      for p, a in zip(self.kw_paths, self.kw_avals))
        static = "".join(f", {k}={v!r}" for k, v in self.static)
        outs = ", ".join(fmt_aval(a) for a in self.out_avals)
        return f"{self.op.name}({ins}{kws}{static}) -> ({outs})"

    @functools.cached_property
    def input_shapes(self) -> tuple:
        """The positional arguments as pytrees of ShapeDtypeStruct."""
        return self.args([_sds(a) for a in self.in_avals])

    @property
    def n_kw(self) -> int:
        """The number of keyword operand leaves the user passed (without closures)."""
        return len(self.kw_avals) - self.n_closure

    def is_closure(self, i: int) -> bool:
        """Whether keyword operand leaf ``i`` is a closed-over value."""
        return i >= self.n_kw

    def kw_name(self, i: int) -> str:
        if self.is_closure(i):
            return f"closed-over value {i - self.n_kw} ({fmt_aval(self.kw_avals[i])})"
        return f"keyword argument {self.kw_paths[i]}"

    def out_name(self, j: int) -> str:
        path = self.out_paths[j]
        return f"output {j}" + (f" ({path})" if path else "")


class _Identity:
    """What equal ``Call``s share: compared by identity, so comparing them allocates nothing."""
    __slots__ = ("hash", "__weakref__")

    def __init__(self, hash_: int) -> None:
        self.hash = hash_


_COMPARED = tuple(f.name for f in dataclasses.fields(Call)
                  if f.compare and f.name != "op_token")
_identities: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # by compared value
_identities_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Batch:
    """How a primitive application is batched.

    Every operand carries one leading batch axis: of length ``size`` where
    ``mask`` is True, of length 1 (broadcast against the batch) where False.
    Every output carries a leading axis of length ``size``. Nested ``vmap``
    merges its axis into this one, so a host function always sees exactly one.

    ``axes``: when a ``vmap`` that made the axis names it (``axis_name=``), the
    factors of the merged axis, ``((name, size), ...)`` outermost first, None
    for an unnamed one, so that traced code sees each named axis again (see
    ``_batching.vmapped``); () when none is named. Host code ignores it.
    """
    size: int
    mask: tuple
    axes: tuple = ()


class InBatched(tuple):
    """The ``in_batched`` a vmap rule receives.

    A tuple with one entry per positional argument (a pytree of bools matching
    that argument); ``.kwargs`` holds the same for keyword operands.
    """
    kwargs: dict


def _sds(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                weak_type=getattr(aval, "weak_type", False))


def to_aval(x) -> ShapedArray:
    """The aval of an operand; a Python scalar's stays weakly typed, as JAX's own do."""
    aval = jax.typeof(x)
    return ShapedArray(aval.shape, aval.dtype, weak_type=aval.weak_type)


def infer_outputs(op, args_tree, kw_tree, static, in_avals, kw_avals, shape=None,
                  what: str = "output spec", wide: list | None = None):
    """Evaluate a declared spec (the op's outputs by default) on these inputs.

    ``wide``: a list given to receive, per leaf, whether the spec declared a
    64-bit dtype that x64 off made 32-bit (JAX's one narrowing).
    """
    args = args_tree.unflatten([_sds(a) for a in in_avals])
    kwargs = kw_tree.unflatten([_sds(a) for a in kw_avals])
    kwargs.update(static)
    if what == "output spec":
        shape = op.shape
    if shape is None:
        if op.traced:
            flat_args = [*in_avals, *kw_avals]
            try:
                out = jax.eval_shape(
                    lambda *leaves: op.fn(*args_tree.unflatten(leaves[:len(in_avals)]),
                                          **kw_tree.unflatten(leaves[len(in_avals):]),
                                          **dict(static)),
                    *[_sds(a) for a in flat_args])
            except TypeError as e:
                scalars = [n for n, a in zip(kw_paths_of(kw_tree), kw_avals) if not a.shape]
                if scalars and _takes(op.fn, args, kwargs):  # meant as static values?
                    raise TypeError(
                        f"anybind op '{op.name}': tracing its function failed: {e}\n"
                        f"The keyword argument(s) {', '.join(scalars)} are 0-d arrays (NumPy "
                        f"or JAX scalars), so they are traced operands, as jax.jit traces "
                        f"them; pass a Python number (int(n), float(n)) for a static "
                        f"value") from e
                if _takes(op.fn, args, kwargs):
                    raise
                fn = getattr(op.fn, "__qualname__", repr(op.fn))
                raise TypeError(
                    f"anybind op '{op.name}': its function {fn} does not take "
                    f"{len(args)} positional argument(s) and the keyword(s) "
                    f"{sorted(kwargs)}: {e}") from None
        else:
            raise TypeError(
                f"anybind op '{op.name}': a host function needs an output spec; pass "
                f"shape=ab.like(0), a jax.ShapeDtypeStruct pytree, or a callable of the "
                f"inputs' ShapeDtypeStructs to ab.bind")
    elif callable(shape):
        try:
            out = shape(*args, **kwargs)
        except Exception as e:
            raise TypeError(
                f"anybind op '{op.name}': the {what} {shape!r} failed on inputs "
                f"{args!r} with keywords {kwargs!r}: {type(e).__name__}: {e}") from e
    else:
        out = shape
    if out is None and shape is not None and what == "output spec":  # given, not inferred
        raise TypeError(
            f"anybind op '{op.name}': the output spec gave None; it must give a "
            f"jax.ShapeDtypeStruct or a pytree of them (() for an op with no outputs)")
    leaves_with_path, out_tree = tree_util.tree_flatten_with_path(out)
    out_avals = []
    for path, leaf in leaves_with_path:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TypeError(
                f"anybind op '{op.name}': the {what} must be a pytree of objects with "
                f"shape and dtype (jax.ShapeDtypeStruct), but at "
                f"{tree_util.keystr(path) or 'the root'} it holds {leaf!r}")
        shape = tuple(leaf.shape)
        if not all(is_symbolic_dim(d) or (isinstance(d, (int, np.integer)) and d >= 0)
                   for d in shape):
            raise TypeError(
                f"anybind op '{op.name}': the {what} gives {_output_at(path)} the shape "
                f"{shape}; every dimension must be a non-negative integer (or a symbolic "
                f"dimension of jax.export)")
        try:
            dtype = canonicalize_dtype(leaf.dtype)
        except TypeError as e:
            raise TypeError(
                f"anybind op '{op.name}': the {what} gives {_output_at(path)} the dtype "
                f"{leaf.dtype!r}, which is not an array dtype ({e})") from None
        if not (issubdtype(dtype, np.number) or issubdtype(dtype, np.bool_)):
            raise TypeError(
                f"anybind op '{op.name}': the {what} gives {_output_at(path)} the dtype "
                f"{str(np.dtype(dtype))!r}, which no JAX array has (a number or bool dtype)")
        out_avals.append(ShapedArray(
            tuple(d if is_symbolic_dim(d) else int(d) for d in shape), dtype))
        if wide is not None:
            wide.append(np.dtype(leaf.dtype) != np.dtype(dtype))
    paths = tuple(tree_util.keystr(p) for p, _ in leaves_with_path)
    if (op.linear or op.multilinear) and what == "output spec":
        bad = [i for i, a in enumerate([*in_avals, *out_avals]) if not is_float(a)]
        if bad:
            declared = "linear=True" if op.linear else "multilinear=True"
            raise TypeError(
                f"anybind op '{op.name}' is declared {declared}, so its positional inputs "
                f"and outputs must be floating or complex; got inputs "
                f"{[fmt_aval(a) for a in in_avals]} and outputs {[fmt_aval(a) for a in out_avals]}")
    return out_tree, tuple(out_avals), paths


def kw_paths_of(kw_tree) -> list[str]:
    """The keyword operands' leaves as the user wrote them (``n``, ``opts['a']``)."""
    paths = tree_util.tree_flatten_with_path(kw_tree.unflatten(range(kw_tree.num_leaves)))[0]
    return [f"{getattr(p[0], 'key', p[0])}{tree_util.keystr(p[1:])}" for p, _ in paths]


def _takes(fn, args, kwargs) -> bool:
    """Whether ``fn``'s signature accepts these arguments (True if it has none to read)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin)
        return True
    return True


def _output_at(path) -> str:
    return f"output {tree_util.keystr(path)}" if path else "the output"


def split_kwargs(op, kwargs: dict, is_array: Callable[[Any], bool] | None = None,
                 kind: str = "an array"):
    """Separate keyword operands (pytrees of arrays) from static keywords.

    ``is_array``/``kind``: what a front end takes as an array (torch tensors, say)."""
    is_array = is_array or _is_array
    operands, static = {}, []
    for name, value in kwargs.items():
        leaves = tree_util.tree_leaves(value)
        if leaves and all(is_array(l) for l in leaves):
            operands[name] = value
            continue
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                f"anybind op '{op.name}': keyword argument '{name}' is neither {kind} "
                f"(a non-differentiable operand) nor hashable (a static value); got "
                f"{type(value).__name__}. Pass arrays, or make static values hashable "
                f"(e.g. a tuple instead of a list)") from None
        static.append((name, value))
    return operands, tuple(sorted(static))


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, Tracer))
