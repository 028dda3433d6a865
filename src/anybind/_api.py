"""The user API: ``bind`` and the ``Op`` it returns."""
from __future__ import annotations

import functools
import re
import threading
from typing import Any, Callable, Literal, Union

import jax
import jax.numpy as jnp
from jax import tree_util
from . import routes  # noqa: F401  (registers the routes of host, compiled and device code)
from .core import _closures, _debug, _jax, _sharding
from .core._code import is_compiled
from .core._errors import pop_host_error, to_raise
from .core._frontends import FRONT_ENDS, LIVE_OPS, front
from .core._primitive import Family
from .core._spec import Call, Rule, infer_outputs, split_kwargs, to_aval
from .core.roles import check_symmetric
from .routes import _compiled, _gpu_device

VmapMode = Union[Literal["sequential", "vectorized"], Callable[..., Any]]
RuleVmap = Union[Literal["sequential", "vectorized"], Callable[..., Any], None]



class _Op:
    """What an op is and does: its code, rules, primitives and calls.

    Users hold it through an ``Op`` handle; everything JAX keeps (primitive
    parameters, jaxprs, compiled programs) refers to this object, never to the
    handle (see ``Op``).
    """

    def __init__(self, fn: Callable, *, shape, jvp, vjp, transpose, linear,
                 vmap: VmapMode, traced: bool, has_side_effect: bool, name: str | None,
                 examples: Callable[[], tuple] | None = None, out: bool = False,
                 multilinear: bool = False, shard: str | None = None,
                 replicated: tuple[str, ...] = (), symmetric: bool = False,
                 device: bool = False, host: Callable | None = None):
        if not callable(fn):
            raise TypeError(f"ab.bind expects a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = _primitive_name(name or getattr(fn, "__name__", None) or "op")
        _compiled.adopt(self, "function", fn, traced)
        self.shape = shape
        if isinstance(linear, (tuple, list)):
            if not all(isinstance(i, int) and i >= 0 for i in linear):
                raise TypeError(f"anybind op '{self.name}': linear must be a bool or a tuple of "
                                f"positional argument indices, got {linear!r}")
            self.linear, self.linear_argnums = False, tuple(sorted(set(linear)))
        else:
            self.linear, self.linear_argnums = bool(linear), ()
        self.multilinear = bool(multilinear)
        if self.multilinear and (self.linear or self.linear_argnums):
            raise TypeError(f"anybind op '{self.name}': multilinear=True (linear in each "
                            f"argument separately) and linear={linear!r} exclude each other")
        self.transpose_rules: dict = {}  # argnum -> Rule, for a multilinear op
        self.traced = bool(traced)
        _gpu_device.check_declaration(self.name, "ab.bind", traced, device, host)
        self.device, self.host = bool(device), host  # GPU code, and its host fallback
        self.symmetric = bool(symmetric)  # ∂f(x) = ∂f(x)ᵀ: the jvp rule serves as the vjp
        self.has_side_effect = bool(has_side_effect)
        self.examples = examples
        self._calls: dict = {}
        self._version = 0  # the rules' version: front ends key their caches on it
        self._lock = threading.Lock()
        self._host_errors: dict = {}  # see core._errors.remember_host_error
        self.inplace = bool(out)
        self.shard = _sharding.parse_rule(self.name, shard, replicated)
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
        # self.vmap: how host code without a batching of its own batches. "sequential"
        # unless declared, or "vectorized" once the function has a vmap rule (its
        # host rules are then taken to be written for batched arrays too).
        self.vmap: str = "sequential"
        self._vmap_declared = isinstance(vmap, str)
        self.vmap_rule: Rule | None = None
        self.vmap_out_batched = None  # a host vmap rule's declared out_batched
        if vmap is None or _is_mode(vmap):
            self.vmap = vmap or "sequential"
        elif callable(vmap):
            self.def_vmap(vmap, traced=traced, device=device)
        else:
            raise ValueError(f"anybind op '{self.name}': vmap must be 'sequential', "
                             f"'vectorized' or a rule, got {vmap!r}")
        if jvp is not None:
            self.def_jvp(jvp, traced=traced, device=device)
        if vjp is not None:
            self.def_vjp(vjp, traced=traced, device=device)
        if transpose is not None and self.multilinear:
            if not isinstance(transpose, (tuple, list)):
                raise TypeError(f"anybind op '{self.name}' is multilinear: transpose= takes a "
                                f"tuple with one rule per positional argument (None where "
                                f"there is none), got {type(transpose).__name__}")
            for i, t in enumerate(transpose):
                if t is not None:
                    self.def_transpose(t, traced=traced, argnum=i, device=device)
        elif transpose is not None:
            self.def_transpose(transpose, traced=traced, device=device)
        self._family = Family(self)
        LIVE_OPS[id(self)] = self

    def __repr__(self) -> str:
        rules = [k for k in ("jvp", "vjp", "transpose", "vmap")
                 if getattr(self, f"{k}_rule") is not None]
        rules += [f"transpose in {i}" for i in sorted(self.transpose_rules)]
        kind = " linear" if self.linear else " multilinear" if self.multilinear else ""
        kind += " symmetric" if self.symmetric else ""
        code = "traced" if self.traced else "compiled" if is_compiled(self.fn) \
            else "device" if self.device else "host"
        return (f"<anybind op '{self.name}' {code}"
                f"{kind} rules={rules} vmap={self.vmap!r}>")

    # ---------------------------------------------------------------- rules

    def _set(self, kind: str, rule, traced: bool, symbolic_zeros: bool = False,
             input_shapes: bool = False, vmap=None, argnum: int | None = None,
             out: bool = False, device: bool = False, host: Callable | None = None):
        if not (vmap is None or _is_mode(vmap) or callable(vmap)):
            raise ValueError(f"anybind op '{self.name}': def_{kind}'s vmap must be "
                             f"'sequential', 'vectorized', a host function with the rule's "
                             f"signature for batched arrays, or None, got {vmap!r}")

        if self.multilinear and kind in ("jvp", "vjp", "fwd", "bwd"):
            raise TypeError(f"anybind op '{self.name}' is multilinear: its jvp (Σᵢ f(…, ẋᵢ, "
                            f"…)) and vjp (the transposes) are derived, so def_{kind} does "
                            f"not apply; give op.def_transpose(rule, argnum=i) per argument")

        if out and traced:
            raise TypeError(f"anybind op '{self.name}': def_{kind}(out=True) is for host rules "
                            f"that write into preallocated outputs; a traced rule returns them")
        _gpu_device.check_declaration(self.name, f"def_{kind}", traced, device, host)

        def register(r):
            if not callable(r):
                raise TypeError(f"anybind op '{self.name}': def_{kind} expects a callable, "
                                f"got {type(r).__name__}")
            _compiled.adopt(self, kind, r, traced)
            if callable(vmap):  # a batched variant of the rule
                _compiled.adopt(self, f"{kind}.vmap", vmap, traced)
            if out and is_compiled(r):
                raise TypeError(f"anybind op '{self.name}': def_{kind}(out=True) is for "
                                f"Python host rules; a compiled rule always writes into "
                                f"XLA's buffers (anybind's C calling convention)")
            made = Rule(r, bool(traced), bool(symbolic_zeros), bool(input_shapes), vmap,
                        bool(out), bool(device), host)
            if argnum is None:
                setattr(self, f"{kind}_rule", made)
            else:
                self.transpose_rules[argnum] = made
            with self._lock:
                used = bool(self._calls)
                self._version += 1
                self._calls.clear()
                self.__dict__.pop("_torch_front", None)  # op.torch's nodes hold the old rules
                self._shard_factors.clear()
            if used:  # every program traced with the old rule is traced again at its next call
                self._family.eager.programs.clear()
                self._family.eager.kept.clear()
                jax.clear_caches()
            return r
        return register if rule is None else register(rule)

    def def_jvp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None):
        """Set the JVP rule ``jvp(primals, tangents, **kw) -> output tangent(s)``.

        Computes ∂f(x)·ẋ. ``primals`` and ``tangents`` are tuples matching the
        positional arguments; zero tangents arrive as zero arrays (as ``None``
        with ``symbolic_zeros=True``), integer inputs' tangents as ``None``;
        return ``None`` for a zero output tangent. Usable as a decorator.

        ``vmap`` (for every ``def_*`` rule) says how a host rule runs under
        ``jax.vmap``: ``"vectorized"`` (one call; every array it gets has a leading
        batch axis, of length 1 where unbatched), ``"sequential"`` (one call per
        row), a host function with the rule's signature that is called like a
        vectorized rule (a batched variant, such as another C entry point), or
        None (the default): the op's mode, which is vectorized when the function
        has a vmap rule.

        ``out=True`` (host rules): the rule is called as ``jvp(primals, tangents,
        out=out, **kw)``, ``out`` a pytree like the output holding writable NumPy
        views of XLA's tangent buffers (``None`` at integer leaves); it writes
        every element and returns None, and nothing is copied. A batched variant
        given as ``vmap`` is called the same way, on the batched buffers.

        ``device=True`` (for every ``def_*`` rule): GPU code on CuPy arrays, as
        for ``ab.bind``; ``host`` is its fallback in programs for the CPU.

        >>> import anybind as ab, numpy as np, jax
        >>> sq = ab.bind(np.square, shape=ab.like(0), name="sq")
        >>> @sq.def_jvp(out=True)
        ... def _(primals, tangents, *, out):
        ...     np.multiply(primals[0], tangents[0], out=out)
        ...     out *= 2
        >>> float(jax.jvp(sq, (3.0,), (1.0,))[1])
        6.0
        """
        return self._set("jvp", rule, traced, symbolic_zeros, vmap=vmap, out=out,
                         device=device, host=host)

    def def_vjp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None):
        """Set the VJP rule ``vjp(primals, cotangent, **kw) -> tuple``.

        Computes ∂f(x)ᵀ·ȳ: one cotangent per positional argument (a pytree like
        it, or ``None`` for zero). ``cotangent`` matches the output; zero ones
        arrive as zero arrays, integer outputs' as ``None``. With
        ``symbolic_zeros=True`` zero cotangents arrive as ``None`` and the rule
        also gets ``needs``, one bool per positional argument: it may return
        ``None`` for arguments not needed (e.g. under ``grad`` with respect to
        one argument) and skip their work. Usable as a decorator.

        ``out=True`` (host rules): the rule is called as ``vjp(primals, cotangent,
        out=out, **kw)`` and returns None. ``out`` is a tuple with one entry per
        positional argument: a pytree like the argument of writable NumPy views
        of XLA's cotangent buffers, ``None`` at leaves whose cotangent is not
        needed (integer leaves, arguments not differentiated), and ``None`` for
        an argument with no cotangent needed, whose work the rule skips. The
        rule writes every element of every view (zeros for a zero cotangent);
        nothing is copied, and no cotangent is held outside XLA's buffers.

        >>> import anybind as ab, numpy as np, jax, jax.numpy as jnp
        >>> mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), name="mul")
        >>> @mul.def_vjp(out=True)
        ... def _(primals, ct, *, out):
        ...     x1, x2 = primals
        ...     if out[0] is not None:
        ...         np.multiply(x2**2, ct, out=out[0])
        ...     if out[1] is not None:
        ...         np.multiply(2 * x1 * x2, ct, out=out[1])
        >>> jax.grad(lambda a, b: mul(a, b).sum(), argnums=1)(jnp.ones(2), jnp.full(2, 3.0))
        Array([6., 6.], dtype=float32)
        """
        return self._set("vjp", rule, traced, symbolic_zeros, vmap=vmap, out=out,
                         device=device, host=host)

    def def_transpose(self, rule: Callable | None = None, *, traced: bool = False,
                      symbolic_zeros: bool = False, input_shapes: bool = False,
                      vmap: RuleVmap = None, argnum: int | None = None,
                      out: bool = False, device: bool = False,
                      host: Callable | None = None):
        """Set the transpose ``transpose(cotangent, **kw) -> tuple`` of a ``linear=True`` op.

        Computes Aᵀ·ȳ for f(x) = A·x: one cotangent per positional argument
        (``None`` for zero). ``symbolic_zeros`` as for ``def_vjp``. With
        ``input_shapes=True`` the rule also gets ``input_shapes``: the positional
        arguments as pytrees of ``jax.ShapeDtypeStruct`` (for maps whose output
        does not determine the input's shape, such as a real FFT). Usable as a
        decorator.

        For a ``multilinear=True`` op, ``argnum=i`` gives the transpose in argument
        i, the others fixed: ``rule(primals, ct, **kw)`` returns the cotangent of
        argument i (a pytree like it, or ``None`` for zero); ``primals`` holds every
        positional argument, with entry i None. One rule per argument (a traced
        function's missing ones come from JAX).

        >>> import anybind as ab, numpy as np, jax
        >>> dot = ab.bind(lambda x, y: (x * y).sum(-1), multilinear=True,
        ...               shape=lambda x, y: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype))
        >>> _ = dot.def_transpose(lambda p, ct: ct[..., None] * p[1], argnum=0)
        >>> _ = dot.def_transpose(lambda p, ct: ct[..., None] * p[0], argnum=1)
        >>> jax.grad(dot, argnums=(0, 1))(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
        (Array([3., 4.], dtype=float32), Array([1., 2.], dtype=float32))

        ``out=True`` (host rules): called as ``transpose(cotangent, out=out, **kw)``,
        ``out`` as for ``def_vjp(out=True)``: one entry per positional argument of
        writable views of XLA's buffers (``None`` where not needed); the rule
        writes every element and returns None.

        >>> import anybind as ab, numpy as np, jax, jax.numpy as jnp
        >>> double = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, name="double")
        >>> @double.def_transpose(out=True)
        ... def _(ct, *, out):
        ...     np.multiply(ct, 2, out=out[0])
        >>> jax.linear_transpose(double, jnp.ones(2))(jnp.ones(2))[0]
        Array([2., 2.], dtype=float32)
        """
        if self.multilinear:
            if not (isinstance(argnum, int) and argnum >= 0):
                raise TypeError(f"anybind op '{self.name}' is multilinear: def_transpose needs "
                                f"argnum=i, the positional argument it transposes in; got "
                                f"argnum={argnum!r}")
            if symbolic_zeros or input_shapes or out:
                raise TypeError(f"anybind op '{self.name}': a multilinear op's transpose "
                                f"rules take neither symbolic_zeros, input_shapes nor out=True "
                                f"(they get every argument's value and return a cotangent)")
            return self._set("transpose", rule, traced, vmap=vmap, argnum=argnum,
                             device=device, host=host)
        if argnum is not None:
            raise TypeError(f"anybind op '{self.name}': def_transpose(argnum=...) is for ops "
                            f"bound with multilinear=True")
        if not self.linear:
            raise TypeError(f"anybind op '{self.name}': def_transpose needs an op bound "
                            f"with linear=True (or multilinear=True, with argnum=)")
        return self._set("transpose", rule, traced, symbolic_zeros, input_shapes, vmap,
                         out=out, device=device, host=host)

    def def_fwd(self, rule: Callable | None = None, *, residuals, vmap: RuleVmap = None,
                device: bool = False, host: Callable | None = None):
        """Set a forward pass ``fwd(*args, **kw) -> (out, residuals)`` for reverse mode.

        Under ``grad``/``vjp`` the op runs ``fwd`` instead of its function and
        keeps ``residuals`` (a pytree of arrays declared by ``residuals``, a spec
        like ``shape``: a callable of the inputs' ShapeDtypeStructs or a
        constant) for the bwd rule, so an expensive intermediate (a
        factorisation, an ODE trajectory) is computed once. Host code; goes
        with ``def_bwd``. Usable as a decorator.

        >>> import anybind as ab, numpy as np, jax
        >>> ex = ab.bind(np.exp, shape=ab.like(0), name="ex")
        >>> @ex.def_fwd(residuals=ab.like(0))
        ... def _(x):
        ...     y = np.exp(x)
        ...     return y, y          # exp is its own derivative: keep it
        >>> @ex.def_bwd
        ... def _(y, ct):
        ...     return (y * ct,)
        >>> float(jax.grad(ex)(0.0))
        1.0
        """
        self.residuals = residuals
        return self._set("fwd", rule, False, vmap=vmap, device=device, host=host)

    def def_bwd(self, rule: Callable | None = None, *, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None):
        """Set the backward pass ``bwd(residuals, cotangent, **kw) -> tuple``: ∂f(x)ᵀ·ȳ.

        One cotangent per positional argument (``None`` for zero), computed from
        the residuals saved by the fwd rule. It replaces the vjp rule in reverse
        mode; forward mode still uses the jvp rule. Usable as a decorator.

        ``out=True``: called as ``bwd(residuals, cotangent, out=out, **kw)``, ``out``
        as for ``def_vjp(out=True)``; the rule writes every element and returns None.

        >>> import anybind as ab, numpy as np, jax
        >>> sq = ab.bind(np.square, shape=ab.like(0), name="sq")
        >>> _ = sq.def_fwd(lambda x: (x * x, x), residuals=ab.like(0))
        >>> @sq.def_bwd(out=True)
        ... def _(x, ct, *, out):             # out: one view per argument
        ...     np.multiply(2 * x, ct, out=out[0])
        >>> float(jax.grad(sq)(3.0))
        6.0
        """
        return self._set("bwd", rule, False, vmap=vmap, out=out, device=device, host=host)

    def def_vmap(self, rule: Callable | None = None, *, traced: bool = False,
                 out: bool = False, out_batched=None, device: bool = False,
                 host: Callable | None = None):
        """Set the batching rule ``(axis_size, in_batched, *args, **kw) -> (out, out_batched)``.

        Batched arguments carry the batch axis at 0; ``in_batched`` is a tuple of
        bools (pytrees like the arguments), with ``in_batched.kwargs`` for
        keyword operands; ``out_batched`` is a bool or a pytree like ``out``.
        Unless the op was bound with ``vmap="sequential"`` or ``"vectorized"``,
        its host rules then batch in vectorized mode (see ``def_jvp``'s ``vmap``).
        Outputs the rule returns unbatched leave ``vmap`` unbatched (so
        ``out_axes=None`` works for them) when that is known while tracing: a
        traced rule's is; a host rule's is known only when it runs, so declare
        it here with ``out_batched=``: a bool, a pytree like the output, or a
        callable of ``in_batched`` returning one (the rule may still return
        batched outputs where the declaration says unbatched: that is an error).
        Usable as a decorator.

        ``out=True`` (host rules): called as ``rule(axis_size, in_batched, *args,
        out=out, **kw)``, ``out`` a pytree like the output of writable views of
        XLA's buffers, each with the batch axis (length ``axis_size``) at 0; the
        rule writes every element and returns None (every output is batched).

        >>> import anybind as ab, jax, jax.numpy as jnp
        >>> total = ab.bind(lambda x: x.sum(), name="total",
        ...                 shape=lambda x: jax.ShapeDtypeStruct((), x.dtype))
        >>> @total.def_vmap
        ... def _(size, in_batched, x):
        ...     return x.sum(axis=1), True   # one NumPy call for the whole batch
        >>> jax.vmap(total)(jnp.ones((4, 3)))
        Array([3., 3., 3., 3.], dtype=float32)
        """
        if out_batched is not None and traced:
            raise TypeError(f"anybind op '{self.name}': out_batched= is for host vmap rules; "
                            f"a traced rule's out_batched is read while tracing")
        self.vmap_out_batched = out_batched
        if not self._vmap_declared:
            self.vmap = "vectorized"
        return self._set("vmap", rule, traced, out=out, device=device, host=host)

    # ---------------------------------------------------------------- calls

    @property
    def torch(self):
        """This op as a PyTorch operation (needs ``anybind[torch]``).

        Same function, rules, pytrees and keywords, on torch tensors, under
        autograd, ``torch.func`` and ``torch.compile``.

        >>> import anybind as ab, numpy as np, torch
        >>> cube = ab.bind(lambda x: x**3, shape=ab.like(0), name="cube",
        ...                vjp=lambda p, ct: (3 * p[0]**2 * ct,), traced=False)
        >>> x = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        >>> cube.torch(x).backward(); x.grad
        tensor(12., dtype=torch.float64)
        """
        made = self.__dict__.get("_torch_front")  # made by the first use (hot path)
        if made is not None:
            return made
        return front("torch", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if FRONT_ENDS:
            front = _front_end(args, kwargs)
            if front is not None:
                return front(self, *args, **kwargs)
        operands, static = split_kwargs(self, kwargs)
        xs, args_tree = tree_util.tree_flatten(args)
        ks, kw_tree = tree_util.tree_flatten(operands)
        xs = [_as_operand(self, x, f"positional input leaf {i}") for i, x in enumerate(xs)]
        ks = [_as_operand(self, k, f"keyword operand leaf {i}") for i, k in enumerate(ks)]
        key = (args_tree, kw_tree, static, tuple(to_aval(x) for x in xs),
               tuple(to_aval(k) for k in ks), tuple(type(v) for _, v in static))
        call = self._calls.get((key, _jax.enable_x64.value))  # x64 decides declared dtypes
        if call is None:
            call = self._make_call(*key)
        if _debug.enabled():
            call = call.debugging
        if call.closed or any(isinstance(x, _jax.Tracer) for x in (*xs, *ks)):
            # inside shard_map: one set of varying axes
            ops = _sharding.vary([*xs, *ks, *call.closed])
            outs = self._family["primal"].bind(*ops, call=call, batch=None)
        else:  # eager: a failing host call surfaces as the HostError it raised
            try:
                outs = self._family["primal"].bind(*xs, *ks, call=call, batch=None)
            except Exception as e:
                err = pop_host_error(self, e)
                if err is None:
                    raise
                raise to_raise(err) from err.__cause__
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
        return self._calls.get((key, _jax.enable_x64.value)) or self._make_call(*key)

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
        if self.fwd_rule is not None and self.residuals is None:  # fwd saves nothing
            res_tree, res_avals = tree_util.tree_structure(None), ()
        elif self.fwd_rule is not None:
            res_tree, res_avals, _ = infer_outputs(
                self, args_tree, kw_tree, static, in_avals, kw_avals, self.residuals,
                "residual spec")
        call = Call(self, args_tree, kw_tree, static, in_avals, kw_avals, out_tree,
                    out_avals, paths, kw_paths, res_tree, res_avals, static_types)
        if self.shard is not None:
            _sharding.factors_of(call)  # the rule must fit: a TypeError at the first call
        nested = False
        if _closures.under_trace():  # the op's code may close over tracers of this trace
            _closures.check_host(self)
            nested = _closures.converting(self)  # its own rule, traced: not again
            if not nested:
                call = _closures.convert(call)
        if self.symmetric:
            check_symmetric(call)
        if nested:  # not kept: a later call of this signature converts for itself
            return call
        with self._lock:
            self._calls[((args_tree, kw_tree, static, in_avals, kw_avals, static_types),
                         _jax.enable_x64.value)] = call
        return call


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

    An ``Op`` is a handle on the op itself (``_Op``): attributes and methods
    are the op's. JAX keys caches by a function weakly and keeps what tracing it
    made, so ``jax.jit(op)`` or ``jax.make_jaxpr(op)`` would keep an op that
    jaxprs refer to for the life of the process; they refer to the op, not to
    this handle, so the op goes when the handle and the programs using it do.
    """

    def __init__(self, fn: Callable, **options: Any):
        object.__setattr__(self, "_core", _Op(fn, **options))
        object.__setattr__(self, "_made", (fn, options, []))  # how to make it again

    def __copy__(self) -> "Op":  # an op is a function: its copies are itself, as a def's
        return self

    def __deepcopy__(self, memo: dict) -> "Op":
        return self

    def __reduce__(self):
        """Pickled as how it was made: ``bind``'s arguments, then each ``def_*`` call, so
        an op pickles wherever its function, rules and spec do."""
        fn, options, defs = self._made
        return _remade, (fn, options, tuple(defs))

    def __getattr__(self, name: str) -> Any:  # what the handle lacks: the op's
        return getattr(self.__dict__["_core"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "__doc__":  # the handle's own, as docstring tools read it
            object.__setattr__(self, name, value)
        else:
            setattr(self._core, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._core(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self._core)

    torch = property(lambda self: self._core.torch, doc=_Op.torch.__doc__)


def _forwarded(name: str) -> Callable:
    method = getattr(_Op, name)

    @functools.wraps(method)
    def forwarded(self, rule: Callable | None = None, **kwargs: Any) -> Any:
        done = getattr(self._core, name)(rule, **kwargs)
        defs = self._made[2]
        if rule is not None:
            defs.append((name, rule, kwargs))
            return done

        def decorator(r: Callable) -> Callable:  # used as @op.def_*(...)
            out = done(r)
            defs.append((name, r, kwargs))
            return out
        return decorator
    return forwarded


def _remade(fn: Callable, options: dict, defs: tuple) -> Op:
    op = Op(fn, **options)
    for name, rule, kwargs in defs:
        getattr(op, name)(rule, **kwargs)
    return op


for _name in ("def_jvp", "def_vjp", "def_transpose", "def_fwd", "def_bwd", "def_vmap"):
    setattr(Op, _name, _forwarded(_name))


def _front_end(args, kwargs):
    """The front end whose arrays appear among the arguments, if any."""
    for leaf in tree_util.tree_leaves((args, kwargs)):
        for kind, run in FRONT_ENDS.items():
            if isinstance(leaf, kind):
                return run
    return None


def _as_operand(op: Op, x, what: str):
    if isinstance(x, (jax.Array, _jax.Tracer)):
        return x
    try:
        return jnp.asarray(x)
    except TypeError:
        raise TypeError(f"anybind op '{op.name}': {what} must be an array or a number, got "
                        f"{type(x).__name__}") from None


def _is_mode(vmap) -> bool:
    """Whether ``vmap`` names a batching mode (a string, never an array compared to one)."""
    return isinstance(vmap, str) and vmap in ("sequential", "vectorized")


def _primitive_name(name: str) -> str:
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned or "op"


def bind(fn: Callable | None = None, *, shape=None, jvp=None, vjp=None, transpose=None,
         linear: bool | tuple[int, ...] = False, multilinear: bool = False,
         vmap: VmapMode | None = None,
         traced: bool = False,
         has_side_effect: bool = False, name: str | None = None,
         examples: Callable[[], tuple] | None = None, out: bool = False,
         shard: str | None = None, replicated: tuple[str, ...] = (),
         symmetric: bool = False, device: bool = False, host: Callable | None = None):
    """Bind ``fn`` into JAX as a primitive that works under every transformation.

    Args:
      fn: the function. Host code (NumPy, SciPy, C wrappers) by default; JAX
        code with ``traced=True``. Positional arguments are differentiable
        pytrees of arrays; keyword arrays are non-differentiable operands; other
        keywords are static and reach ``fn`` and every rule.
      shape (jax.ShapeDtypeStruct | Callable | None): the output spec:
        ``ab.like(i)``, a pytree of ``jax.ShapeDtypeStruct``, or a callable of the
        inputs' ShapeDtypeStructs. Inferred when traced.
      jvp (Callable | None): the jvp rule (see ``Op.def_jvp``), of the same kind
        (host or traced) as ``fn``; likewise ``vjp`` and ``transpose``.
      vjp (Callable | None): the vjp rule (see ``Op.def_vjp``).
      transpose (Callable | tuple[Callable, ...] | None): the transpose rule of a
        linear op (see ``Op.def_transpose``); for a multilinear op, a tuple with
        one rule per positional argument.
      linear: ``True``: ``fn`` is linear in its positional arguments jointly. A
        tuple of argument indices: linear in those (jointly, the others fixed),
        so ``jax.linear_transpose`` in them works (through the derivative
        rules); other transformations treat the op as non-linear.
      multilinear: ``fn`` is linear in each positional argument separately, the
        others fixed (a product x·y, A·x in A and in x). Give the transpose in
        each argument with ``def_transpose(rule, argnum=i)``; the jvp, vjp and
        derivatives of every order follow, with host rules too.
      vmap: how the function batches: ``"sequential"`` (the default: one host call
        looping over the batch), ``"vectorized"`` (one call on arrays with a leading
        batch axis) or a batching rule. Host rules batch the same way, except that
        with a batching rule they run vectorized; each rule's ``vmap=`` overrides.
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
      symmetric: the Jacobian with respect to the single positional argument is
        symmetric (J = Jᵀ; for complex values transposed, not conjugated), so the
        jvp rule, run with the cotangent as its tangent, is also the vjp: one rule
        gives forward and reverse mode, and reverse mode stores only what forward
        mode does. With ``traced=True`` and no jvp rule, JAX's jvp of ``fn`` is
        that rule. For ``linear=True`` ops the function is its own transpose.
      device: ``fn`` (and the rules given here) are GPU code: in a program compiled
        for a GPU it gets CuPy views of XLA's device buffers, runs with CuPy's
        current stream set to XLA's (and gets it as ``stream=``, an int, if it
        has that parameter), and returns or writes (``out=True``) CuPy arrays;
        nothing goes through the host. Needs CuPy.
      host: the host function that stands in for a ``device=True`` function in
        programs compiled for the CPU (same signature, NumPy arrays). Without
        one, lowering such a program raises.

    >>> import anybind as ab, numpy as np, jax, jax.numpy as jnp
    >>> mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="vectorized",
    ...               jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
    ...               vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct), name="mul")
    >>> jax.grad(lambda a, b: mul(a, b).sum(), argnums=1)(jnp.ones(2), jnp.full(2, 3.0))
    Array([6., 6.], dtype=float32)

    Device code (CuPy arrays in a GPU program) with its host fallback, which is
    what runs in this CPU program:

    >>> cube = ab.bind(lambda x: x ** 3, shape=ab.like(0), device=True,
    ...                host=lambda x: np.power(x, 3), name="cube")
    >>> float(jax.jit(cube)(2.0))
    8.0
    """
    options = dict(shape=shape, jvp=jvp, vjp=vjp, transpose=transpose, linear=linear,
                   vmap=vmap, traced=traced, has_side_effect=has_side_effect, name=name,
                   examples=examples, out=out, multilinear=multilinear, shard=shard,
                   replicated=replicated, symmetric=symmetric, device=device, host=host)
    if fn is None:
        return lambda f: Op(f, **options)
    return Op(fn, **options)
