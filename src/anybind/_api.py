"""The user API: ``bind`` and the ``Op`` handle it returns.

The op itself (its rules, calls and primitives) is ``core._op.CoreOp``; an
``Op`` is what a user holds: the public ``def_*`` methods, with their
docstrings, and how the op pickles.
"""
from __future__ import annotations

import functools
import importlib
import pickle
from collections.abc import Callable
from typing import Any, overload

from . import routes  # noqa: F401  (registers the routes of host, compiled and device code)
from .core._op import CoreOp, Handle, Options, RuleVmap, VmapMode

__all__ = ["Op", "bind", "VmapMode", "RuleVmap"]


class Op(Handle):
    """A function bound into JAX as a family of primitives. Create with ``ab.bind``.

    >>> import anybind as ab, numpy as np, jax
    >>> square = ab.bind(np.square, shape=ab.like(0), name="square")
    >>> @square.def_jvp
    ... def _(primals, tangents):
    ...     (x,), (dx,) = primals, tangents
    ...     return 2 * x * dx
    >>> float(jax.jvp(square, (3.0,), (1.0,))[1])
    6.0

    An ``Op`` is a handle on the op itself: its attributes (``name``, ``fn``,
    ``jvp_rule``, …) are the op's. JAX keys caches by a function weakly and
    keeps what tracing it made, so ``jax.jit(op)`` or ``jax.make_jaxpr(op)``
    would keep an op that jaxprs refer to for the life of the process; they
    refer to the op, not to this handle, so the op goes when the handle and the
    programs using it do.
    """

    def __init__(self, fn: Callable, **options: Any):
        made = Options(**options)
        object.__setattr__(self, "_core", CoreOp(fn, made))
        object.__setattr__(self, "_made", (fn, made, []))  # how to make it again

    def __copy__(self) -> Op:  # an op is a function: its copies are itself, as a def's
        return self

    def __deepcopy__(self, memo: dict) -> Op:
        return self

    def __reduce__(self) -> tuple:
        """Pickled as how it was made: ``bind``'s arguments, then each ``def_*`` call, so
        an op pickles wherever its function, rules and spec do (see ``portable``)."""
        name = self._core.name
        remake = self.__dict__.get("_remake")
        fn, options, defs = self._made
        if remake is not None:
            make, args, kwargs = remake
            made = remade(make, args, kwargs, name)
            if not defs:
                return made
            return _remade_then, (*made, tuple((d, portable(r, name, f"{d} rule"), kw)
                                                 for d, r, kw in defs))
        if options is None:  # a handle_of handle: how the op was made is not known here
            raise pickle.PicklingError(
                f"anybind op '{name}' was given back by a front end (ab.from_torch of its "
                f"op.torch): pickle the op it came from")
        fields = {k: portable(v, name, f"{k}=") for k, v in vars(options).items()}
        return _remade, (portable(fn, name, "function"), Options(**fields),
                         tuple((d, portable(r, name, f"{d} rule"), kw) for d, r, kw in defs))

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

    def _define(self, name: str, rule: Callable | None, kwargs: dict) -> Any:
        """The op's ``name`` (``def_jvp``, …) on ``rule``, recorded for pickling."""
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

    def def_jvp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None) -> Any:
        """Set the JVP rule ``jvp(primals, tangents, **kw) -> output tangent(s)``.

        Computes ∂f(x)·ẋ. ``primals`` and ``tangents`` are tuples matching the
        positional arguments; zero tangents arrive as zero arrays (as ``None``
        with ``symbolic_zeros=True``), integer inputs' tangents as ``None``;
        return ``None`` for a zero output tangent. Usable as a decorator.

        ``vmap`` (for every ``def_*`` rule) says how a host rule runs under
        ``jax.vmap``, with the names of ``jax.pure_callback``'s ``vmap_method``:
        ``"expand_dims"`` (one call; every array it gets has a leading batch axis,
        of length 1 where unbatched; ``"vectorized"`` is its older name),
        ``"broadcast_all"`` (one call; unbatched arrays broadcast to the batch's
        length, as read-only views), ``"sequential"`` (one call per row), a host
        function with the rule's signature that is called like an ``"expand_dims"``
        rule (a batched variant, such as another C entry point), or None (the
        default): the op's mode, which is ``"expand_dims"`` when the function has
        a vmap rule.

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
        return self._define("def_jvp", rule, dict(traced=traced,
            symbolic_zeros=symbolic_zeros, vmap=vmap, out=out, device=device,
            host=host))

    def def_vjp(self, rule: Callable | None = None, *, traced: bool = False,
                symbolic_zeros: bool = False, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None) -> Any:
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
        return self._define("def_vjp", rule, dict(traced=traced,
            symbolic_zeros=symbolic_zeros, vmap=vmap, out=out, device=device,
            host=host))

    def def_transpose(self, rule: Callable | None = None, *, traced: bool = False,
                      symbolic_zeros: bool = False, input_shapes: bool = False,
                      vmap: RuleVmap = None, argnum: int | None = None,
                      out: bool = False, device: bool = False,
                      host: Callable | None = None) -> Any:
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
        return self._define("def_transpose", rule, dict(traced=traced,
            symbolic_zeros=symbolic_zeros, input_shapes=input_shapes, vmap=vmap,
            argnum=argnum, out=out, device=device, host=host))

    def def_fwd(self, rule: Callable | None = None, *, residuals: Any, vmap: RuleVmap = None,
                device: bool = False, host: Callable | None = None) -> Any:
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
        return self._define("def_fwd", rule, dict(residuals=residuals, vmap=vmap,
            device=device, host=host))

    def def_bwd(self, rule: Callable | None = None, *, vmap: RuleVmap = None,
                out: bool = False, device: bool = False, host: Callable | None = None) -> Any:
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
        return self._define("def_bwd", rule, dict(vmap=vmap, out=out, device=device,
            host=host))

    def def_vmap(self, rule: Callable | None = None, *, traced: bool = False,
                 out: bool = False, out_batched: Any = None, device: bool = False,
                 host: Callable | None = None) -> Any:
        """Set the batching rule ``(axis_size, in_batched, *args, **kw) -> (out, out_batched)``.

        Batched arguments carry the batch axis at 0; ``in_batched`` is a tuple of
        bools (pytrees like the arguments), with ``in_batched.kwargs`` for
        keyword operands; ``out_batched`` is a bool or a pytree like ``out``.
        Unless the op was bound with a ``vmap`` mode, its host rules then batch
        in ``"expand_dims"`` mode (see ``def_jvp``'s ``vmap``).
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
        return self._define("def_vmap", rule, dict(traced=traced, out=out,
            out_batched=out_batched, device=device, host=host))

    @property
    def torch(self) -> Any:
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
        return self._core.torch


def handle_of(core: CoreOp) -> Op:
    """An ``Op`` handle on an op that exists already (a front end gives back the op
    behind one of its objects: ``ab.from_torch(op.torch)`` is ``op``)."""
    h = object.__new__(Op)
    object.__setattr__(h, "_core", core)
    object.__setattr__(h, "_made", (core.fn, None, []))
    return h


def subclassed(handle: Op, cls: type) -> Op:
    """A handle of ``cls`` (a front end's ``Op`` subclass) on ``handle``'s op, recording
    only the ``def_*`` calls made on it from now on (the user's, which pickle with it)."""
    h: Op = object.__new__(cls)
    h.__dict__.update(handle.__dict__)
    fn, options, _ = handle._made
    object.__setattr__(h, "_made", (fn, options, []))
    return h


def pickled_as(handle: Op, make: Callable, args: tuple, kwargs: dict) -> Op:
    """Let ``handle`` pickle as ``make(*args, **kwargs)``, a front end's own constructor
    (``ab.from_torch``) rather than the ``bind`` and rules it made."""
    object.__setattr__(handle, "_remake", (make, args, kwargs))
    return handle


def remade(make: Callable, args: tuple, kwargs: dict, op_name: str) -> tuple:
    """The pickle reduction of ``make(*args, **kwargs)``, its pieces made portable."""
    args = tuple(portable(a, op_name, "argument") for a in args)
    kwargs = {k: portable(v, op_name, f"{k}=") for k, v in kwargs.items()}
    return functools.partial(make, **kwargs), args


def portable(obj: Any, op_name: str, what: str) -> Any:
    """``obj`` in a form that pickles: itself where pickle takes it; a reference by module
    and name where it is a module's attribute that pickle refuses (``jax.numpy.sin``);
    cloudpickle's bytes where cloudpickle is installed and takes it (a lambda, a
    closure); else a ``PicklingError`` naming the op and the piece."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    try:
        pickle.dumps(obj)
        return obj
    except Exception as e:  # noqa: BLE001  (pickle raises what the object's reduce raises)
        why = e
    ref = _by_name(obj)
    if ref is not None:
        return ref
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return _Pickled(cloudpickle.dumps(obj))
        except Exception as e:  # noqa: BLE001
            why = e
    raise pickle.PicklingError(
        f"anybind op '{op_name}' cannot be pickled: its {what} {obj!r} does not pickle "
        f"({type(why).__name__}: {why}). Pickle stores functions by module and name: define "
        f"it at a module's top level"
        f"{'' if cloudpickle is not None else ', or install cloudpickle for lambdas and closures'}"
    ) from why


class _ByName:
    """A module attribute that pickle refuses, pickled as its module and name."""

    def __init__(self, module: str, qualname: str):
        self.module, self.qualname = module, qualname

    def __reduce__(self) -> tuple:
        return _lookup, (self.module, self.qualname)


class _Pickled:
    """An object pickled by cloudpickle, loaded back by pickle."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def __reduce__(self) -> tuple:
        return pickle.loads, (self.payload,)


def _by_name(obj: Any) -> _ByName | None:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or "<" in qualname:
        return None
    try:
        return _ByName(module, qualname) if _lookup(module, qualname) is obj else None
    except (ImportError, AttributeError):
        return None


def _lookup(module: str, qualname: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _remade_then(make: Callable, args: tuple, defs: tuple) -> Op:
    """A front end's op made again, then each ``def_*`` call made on it since."""
    op = make(*args)
    for name, rule, kwargs in defs:
        getattr(op, name)(rule, **kwargs)
    return op


def _remade(fn: Callable, options: Options, defs: tuple) -> Op:
    op = Op(fn, **vars(options))
    for name, rule, kwargs in defs:
        getattr(op, name)(rule, **kwargs)
    return op


@overload
def bind(fn: Callable, *, shape: Any = None, jvp: Callable | None = None,
         vjp: Callable | None = None, transpose: Any = None,
         linear: bool | tuple[int, ...] = False, multilinear: bool = False,
         vmap: VmapMode | None = None, traced: bool = False, has_side_effect: bool = False,
         name: str | None = None, examples: Callable[[], tuple] | None = None,
         out: bool = False, shard: str | None = None, replicated: tuple[str, ...] = (),
         symmetric: bool = False, device: bool = False,
         host: Callable | None = None, export_version: str | int | None = None,
         order: str | None = None, state: Any = None) -> Op: ...


@overload
def bind(fn: None = None, *, shape: Any = None, jvp: Callable | None = None,
         vjp: Callable | None = None, transpose: Any = None,
         linear: bool | tuple[int, ...] = False, multilinear: bool = False,
         vmap: VmapMode | None = None, traced: bool = False, has_side_effect: bool = False,
         name: str | None = None, examples: Callable[[], tuple] | None = None,
         out: bool = False, shard: str | None = None, replicated: tuple[str, ...] = (),
         symmetric: bool = False, device: bool = False,
         host: Callable | None = None,
         export_version: str | int | None = None,
         order: str | None = None, state: Any = None) -> Callable[[Callable], Op]: ...


def bind(fn: Callable | None = None, *, shape: Any = None, jvp: Callable | None = None,
         vjp: Callable | None = None, transpose: Any = None,
         linear: bool | tuple[int, ...] = False, multilinear: bool = False,
         vmap: VmapMode | None = None, traced: bool = False, has_side_effect: bool = False,
         name: str | None = None, examples: Callable[[], tuple] | None = None,
         out: bool = False, shard: str | None = None, replicated: tuple[str, ...] = (),
         symmetric: bool = False, device: bool = False,
         host: Callable | None = None,
         export_version: str | int | None = None,
         order: str | None = None, state: Any = None) -> Op | Callable[[Callable], Op]:
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
      vmap: how the function batches, with the names of ``jax.pure_callback``'s
        ``vmap_method``: ``"sequential"`` (the default: one host call looping over
        the batch), ``"expand_dims"`` (one call on arrays with a leading batch axis,
        of length 1 for unbatched arguments; ``"vectorized"`` is its older name),
        ``"broadcast_all"`` (one call, unbatched arguments broadcast to the batch's
        length: for functions that are not elementwise, such as ``x @ W``; host
        code only) or a batching rule. Host rules batch the same way, except that
        with a batching rule they run ``"expand_dims"``; each rule's ``vmap=``
        overrides.
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
      export_version: part of the fingerprint that a program for ``jax.export``
        carries for each compiled function it calls: the program runs only where
        the op is bound with the same function name and ``export_version``
        (change it when the compiled code changes under the same name).
      order: the memory order in which compiled code (the function and its
        compiled rules) gets its arrays: ``"C"`` (row-major) or ``"F"``
        (column-major: an ``(m, n)`` array arrives as Fortran's ``A(m, n)``;
        XLA copies where its own layout differs). ``None`` (the default) is
        ``"C"``, except that compiled code from a Fortran library (one that
        needs a Fortran runtime) given an array of two or more axes is an error
        asking for one. Python code gets NumPy arrays either way.
      state: an ``ab.State``: an object of compiled code (a pointer, and the
        function that frees it) that every compiled function and rule of the op
        gets as a tenth argument, ``void *state``. It lives while the op or a
        program lowered with it does, then is freed once; ``jax.export`` of a
        program with the op is an error.

    >>> import anybind as ab, numpy as np, jax, jax.numpy as jnp
    >>> mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="expand_dims",
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
    options = {k: v for k, v in locals().items() if k != "fn"}  # bind's options, as Options
    if fn is None:
        return lambda f: Op(f, **options)
    return Op(fn, **options)
