"""The user API: ``bind`` and the ``Op`` it returns."""
from __future__ import annotations

import re
import threading
from typing import Any, Callable, Literal, Union

import jax
import jax.numpy as jnp
from jax import tree_util

from . import _partition
from ._hostcall import pop_host_error
from ._primitive import Family
from ._spec import Call, Rule, infer_outputs, split_kwargs, to_aval

VmapMode = Union[Literal["sequential", "vectorized"], Callable[..., Any]]


class Op:
    """A function bound into JAX as a family of primitives. Create with ``ab.bind``.

    >>> import anybind as ab, numpy as np, jax
    >>> square = ab.bind(np.square, shape=ab.like(0), name="square")
    >>> @square.def_jvp
    ... def _(primals, tangents):
    ...     (x,), (dx,) = primals, tangents
    ...     return 2 * x * dx
    >>> float(jax.jvp(square, (3.0,), (1.0,))[1])
    6.0
    """

    def __init__(self, fn: Callable, *, shape, jvp, vjp, transpose, linear,
                 vmap: VmapMode, traced: bool, has_side_effect: bool, name: str | None,
                 examples: Callable[[], tuple] | None = None, out: bool = False,
                 shard: str | None = None, replicated: tuple[str, ...] = ()):
        if not callable(fn):
            raise TypeError(f"ab.bind expects a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = _primitive_name(name or getattr(fn, "__name__", None) or "op")
        self.shape = shape
        if isinstance(linear, (tuple, list)):
            if not all(isinstance(i, int) and i >= 0 for i in linear):
                raise TypeError(f"anybind op '{self.name}': linear must be a bool or a tuple of "
                                f"positional argument indices, got {linear!r}")
            self.linear, self.linear_argnums = False, tuple(sorted(set(linear)))
        else:
            self.linear, self.linear_argnums = bool(linear), ()
        self.traced = bool(traced)
        self.has_side_effect = bool(has_side_effect)
        self.examples = examples
        self._calls: dict = {}
        self._lock = threading.Lock()
        self._version = 0
        self._host_errors: dict = {}  # see _hostcall.remember_host_error
        self.inplace = bool(out)
        self.shard = _partition.parse_rule(self.name, shard, replicated)
        self._shard_factors: dict = {}
        if self.shard is not None and self.has_side_effect:
            raise TypeError(f"anybind op '{self.name}': has_side_effect=True runs the function "
                            f"exactly once per execution, so it cannot also run per shard "
                            f"(shard=)")
        if self.inplace and self.traced:
            raise TypeError(f"anybind op '{self.name}': out=True is for host functions that "
                            f"write into preallocated outputs; a traced function returns them")
        self.jvp_rule: Rule | None = None
        self.vjp_rule: Rule | None = None
        self.transpose_rule: Rule | None = None
        self.fwd_rule: Rule | None = None
        self.bwd_rule: Rule | None = None
        self.residuals = None
        self.vmap: str = "sequential"
        self.vmap_rule: Rule | None = None
        if vmap in ("sequential", "vectorized"):
            self.vmap = vmap
        elif callable(vmap):
            self.def_vmap(vmap, traced=traced)
        else:
            raise ValueError(f"anybind op '{self.name}': vmap must be 'sequential', "
                             f"'vectorized' or a rule, got {vmap!r}")
        if jvp is not None:
            self.def_jvp(jvp, traced=traced)
        if vjp is not None:
            self.def_vjp(vjp, traced=traced)
        if transpose is not None:
            self.def_transpose(transpose, traced=traced)
        self._family = Family(self)

    def __repr__(self) -> str:
        rules = [k for k in ("jvp", "vjp", "transpose", "vmap")
                 if getattr(self, f"{k}_rule") is not None]
        return (f"<anybind op '{self.name}' {'traced' if self.traced else 'host'}"
                f"{' linear' if self.linear else ''} rules={rules} vmap={self.vmap!r}>")

    # ---------------------------------------------------------------- rules

    def _set(self, kind: str, rule, traced: bool, symbolic_zeros: bool = False,
             input_shapes: bool = False):
        def register(r):
            if not callable(r):
                raise TypeError(f"anybind op '{self.name}': def_{kind} expects a callable, "
                                f"got {type(r).__name__}")
            setattr(self, f"{kind}_rule",
                    Rule(r, bool(traced), bool(symbolic_zeros), bool(input_shapes)))
            with self._lock:  # calls made from now on use the new rule, eagerly and under jit
                self._version += 1
                self._calls.clear()
                self._shard_factors.clear()
            return r
        return register if rule is None else register(rule)

    def def_jvp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False):
        """Set the JVP rule ``jvp(primals, tangents, **kw) -> output tangent(s)``.

        Computes ∂f(x)·ẋ. ``primals`` and ``tangents`` are tuples matching the
        positional arguments; zero tangents arrive as zero arrays (as ``None``
        with ``symbolic_zeros=True``), integer inputs' tangents as ``None``;
        return ``None`` for a zero output tangent. Usable as a decorator.
        """
        return self._set("jvp", rule, traced, symbolic_zeros)

    def def_vjp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False):
        """Set the VJP rule ``vjp(primals, cotangent, **kw) -> tuple``.

        Computes ∂f(x)ᵀ·ȳ: one cotangent per positional argument (a pytree like
        it, or ``None`` for zero). ``cotangent`` matches the output; zero ones
        arrive as zero arrays, integer outputs' as ``None``. With
        ``symbolic_zeros=True`` zero cotangents arrive as ``None`` and the rule
        also gets ``needs``, one bool per positional argument: it may return
        ``None`` for arguments not needed (e.g. under ``grad`` with respect to
        one argument) and skip their work. Usable as a decorator.
        """
        return self._set("vjp", rule, traced, symbolic_zeros)

    def def_transpose(self, rule: Callable | None = None, *, traced: bool = False,
                      symbolic_zeros: bool = False, input_shapes: bool = False):
        """Set the transpose ``transpose(cotangent, **kw) -> tuple`` of a ``linear=True`` op.

        Computes Aᵀ·ȳ for f(x) = A·x: one cotangent per positional argument
        (``None`` for zero). ``symbolic_zeros`` as for ``def_vjp``. With
        ``input_shapes=True`` the rule also gets ``input_shapes``: the positional
        arguments as pytrees of ``jax.ShapeDtypeStruct`` (for maps whose output
        does not determine the input's shape, such as a real FFT). Usable as a
        decorator.
        """
        if not self.linear:
            raise TypeError(f"anybind op '{self.name}': def_transpose needs an op bound "
                            f"with linear=True")
        return self._set("transpose", rule, traced, symbolic_zeros, input_shapes)

    def def_fwd(self, rule: Callable | None = None, *, residuals):
        """Set a forward pass ``fwd(*args, **kw) -> (out, residuals)`` for reverse mode.

        Under ``grad``/``vjp`` the op runs ``fwd`` instead of its function and
        keeps ``residuals`` (a pytree of arrays declared by ``residuals``, a spec
        like ``shape``: a callable of the inputs' ShapeDtypeStructs or a
        constant) for the bwd rule, so an expensive intermediate (a
        factorisation, an ODE trajectory) is computed once. Host code; goes
        with ``def_bwd``. Usable as a decorator.
        """
        self.residuals = residuals
        return self._set("fwd", rule, False)

    def def_bwd(self, rule: Callable | None = None):
        """Set the backward pass ``bwd(residuals, cotangent, **kw) -> tuple``: ∂f(x)ᵀ·ȳ.

        One cotangent per positional argument (``None`` for zero), computed from
        the residuals saved by the fwd rule. It replaces the vjp rule in reverse
        mode; forward mode still uses the jvp rule. Usable as a decorator.
        """
        return self._set("bwd", rule, False)

    def def_vmap(self, rule: Callable | None = None, *, traced: bool = False):
        """Set the batching rule ``(axis_size, in_batched, *args, **kw) -> (out, out_batched)``.

        Batched arguments carry the batch axis at 0; ``in_batched`` is a tuple of
        bools (pytrees like the arguments), with ``in_batched.kwargs`` for
        keyword operands; ``out_batched`` is a bool or a pytree like ``out``.
        Usable as a decorator.
        """
        return self._set("vmap", rule, traced)

    # ---------------------------------------------------------------- calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        operands, static = split_kwargs(self, kwargs)
        xs, args_tree = tree_util.tree_flatten(args)
        ks, kw_tree = tree_util.tree_flatten(operands)
        xs = [_as_operand(self, x, f"positional input leaf {i}") for i, x in enumerate(xs)]
        ks = [_as_operand(self, k, f"keyword operand leaf {i}") for i, k in enumerate(ks)]
        key = (args_tree, kw_tree, static, tuple(to_aval(x) for x in xs),
               tuple(to_aval(k) for k in ks), tuple(type(v) for _, v in static))
        call = self._calls.get(key)
        if call is None:
            call = self._make_call(*key)
        if any(isinstance(x, jax.core.Tracer) for x in (*xs, *ks)):
            ops = _partition.vary([*xs, *ks])  # inside shard_map: one set of varying axes
            outs = self._family["primal"].bind(*ops, call=call, batch=None)
        else:  # eager: a failing host call surfaces as the HostError it raised
            try:
                outs = self._family["primal"].bind(*xs, *ks, call=call, batch=None)
            except Exception as e:
                err = pop_host_error(self, e)
                if err is None:
                    raise
                raise err from None
        return tree_util.tree_unflatten(call.out_tree, outs)

    def _call_of(self, *args: Any, **kwargs: Any) -> Call:
        """The ``Call`` of calling the op on these inputs (as ``__call__`` makes it)."""
        operands, static = split_kwargs(self, kwargs)
        xs, args_tree = tree_util.tree_flatten(args)
        ks, kw_tree = tree_util.tree_flatten(operands)
        key = (args_tree, kw_tree, static, tuple(to_aval(_as_operand(self, x, "input"))
                                                 for x in xs),
               tuple(to_aval(_as_operand(self, k, "input")) for k in ks),
               tuple(type(v) for _, v in static))
        return self._calls.get(key) or self._make_call(*key)

    def _make_call(self, args_tree, kw_tree, static, in_avals, kw_avals, static_types) -> Call:
        out_tree, out_avals, paths = infer_outputs(
            self, args_tree, kw_tree, static, in_avals, kw_avals)
        kw_paths = tuple(tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(
            kw_tree.unflatten(range(len(kw_avals))))[0])
        res_tree, res_avals = None, ()
        if (self.fwd_rule is None) != (self.bwd_rule is None):
            given, missing = ("fwd", "bwd") if self.bwd_rule is None else ("bwd", "fwd")
            raise TypeError(f"anybind op '{self.name}' has a {given} rule but no {missing} "
                            f"rule; def_fwd and def_bwd go together")
        if self.fwd_rule is not None:
            res_tree, res_avals, _ = infer_outputs(
                self, args_tree, kw_tree, static, in_avals, kw_avals, self.residuals,
                "residual spec")
        call = Call(self, args_tree, kw_tree, static, in_avals, kw_avals, out_tree,
                    out_avals, paths, kw_paths, res_tree, res_avals, static_types, self._version)
        if self.shard is not None:
            _partition.factors_of(call)  # the rule must fit: a TypeError at the first call
        with self._lock:
            self._calls[(args_tree, kw_tree, static, in_avals, kw_avals, static_types)] = call
        return call


def _as_operand(op: Op, x, what: str):
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return x
    try:
        return jnp.asarray(x)
    except TypeError:
        raise TypeError(f"anybind op '{op.name}': {what} must be an array or a number, got "
                        f"{type(x).__name__}") from None


def _primitive_name(name: str) -> str:
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned or "op"


def bind(fn: Callable | None = None, *, shape=None, jvp=None, vjp=None, transpose=None,
         linear: bool | tuple[int, ...] = False, vmap: VmapMode = "sequential",
         traced: bool = False,
         has_side_effect: bool = False, name: str | None = None,
         examples: Callable[[], tuple] | None = None, out: bool = False,
         shard: str | None = None, replicated: tuple[str, ...] = ()):
    """Bind ``fn`` into JAX as a primitive that works under every transformation.

    Args:
      fn: the function. Host code (NumPy, SciPy, C wrappers) by default; JAX
        code with ``traced=True``. Positional arguments are differentiable
        pytrees of arrays; keyword arrays are non-differentiable operands; other
        keywords are static and reach ``fn`` and every rule.
      shape: the output spec: ``ab.like(i)``, a pytree of ``jax.ShapeDtypeStruct``,
        or a callable of the inputs' ShapeDtypeStructs. Inferred when traced.
      jvp, vjp, transpose: rules (see ``Op.def_jvp`` and friends), of the same
        kind (host or traced) as ``fn``.
      linear: ``True``: ``fn`` is linear in its positional arguments jointly. A
        tuple of argument indices: linear in those (jointly, the others fixed),
        so ``jax.linear_transpose`` in them works (through the derivative
        rules); other transformations treat the op as non-linear.
      vmap: ``"sequential"``, ``"vectorized"`` or a batching rule.
      traced: ``fn`` (and the rules given here) are JAX code, traced inline.
      has_side_effect: every call runs exactly once; XLA may not drop or merge it.
      name: the primitive's name; defaults to ``fn.__name__``.
      out: ``fn`` writes its results into preallocated outputs: it is called as
        ``fn(*args, out=out, **kw)`` with ``out`` a pytree (like the output spec) of
        writable NumPy views of XLA's own output buffers, must write every element,
        and returns None. No output is copied. Rules keep the return form.
      examples: a callable returning ``(args, kwargs)`` of example inputs, used by
        ``ab.check`` and ``python -m anybind check`` when none are given.
      shard: how the op splits over devices under ``jit`` with sharded inputs: an
        einsum-like rule over the flat positional array leaves, then the keyword
        array operands, ``->`` and the outputs (``"b n, n -> b n"``,
        ``"... n -> ... n"``), or ``"elementwise"``. A factor in an output and an
        operand may be split across devices; each device runs ``fn`` (and every
        rule) on its slice. Without it the op runs whole (replicated).
      replicated: factors of ``shard`` that must stay whole (an FFT's axis).

    >>> import anybind as ab, numpy as np, jax, jax.numpy as jnp
    >>> mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="vectorized",
    ...               jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
    ...               vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct), name="mul")
    >>> jax.grad(lambda a, b: mul(a, b).sum(), argnums=1)(jnp.ones(2), jnp.full(2, 3.0))
    Array([6., 6.], dtype=float32)
    """
    options = dict(shape=shape, jvp=jvp, vjp=vjp, transpose=transpose, linear=linear,
                   vmap=vmap, traced=traced, has_side_effect=has_side_effect, name=name,
                   examples=examples, out=out, shard=shard, replicated=replicated)
    if fn is None:
        return lambda f: Op(f, **options)
    return Op(fn, **options)
