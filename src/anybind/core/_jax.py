"""The one seam between anybind and JAX's non-public API.

Every ``jax._src`` symbol anybind uses, and every symbol of a JAX namespace
that JAX does not document as stable (``jax.interpreters.*``, ``jax.core``'s
internals), is imported here and nowhere else, one line per symbol, saying
what it is for and since which JAX release it has the form used. A JAX
upgrade touches this file; differences between the releases of the supported
window (``pyproject.toml``: the oldest, up to the newest tested) are handled
here and nowhere else.

Public JAX (``jax.ffi``, ``jax.extend``, ``jax.export``, ``jax.sharding``,
``jax.experimental.custom_partitioning``, ``jax.shard_map``) is imported where
it is used.
"""
from __future__ import annotations

import functools
import inspect

import jax
from jax._src import (
    api_util as _api_util,
    config as _config,
    core as _core,
    dispatch as _dispatch,
    dtypes as _dtypes,
    effects as _effects,
    linear_util as _lu,
    mesh as _mesh,
    sharding_impls as _sharding_impls,
    traceback_util as _traceback_util,
    util as _util,
)
from jax._src.interpreters import ad as _ad, batching as _batching, mlir as _mlir
from jax._src.lib.mlir.dialects import hlo as _hlo
from jax.extend import core as _xcore

VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# ---------------------------------------------------------------- primitives
Primitive = _xcore.Primitive                      # an op's primitives (jax.extend, 0.4.30)
ShapedArray = _core.ShapedArray                   # avals of operands and results (0.4)
Tracer = _core.Tracer                             # what an enclosing trace passes in (0.4)
eval_jaxpr = _core.eval_jaxpr                     # closure-converted code replayed (0.4)
jaxpr_as_fun = _xcore.jaxpr_as_fun                # a closed jaxpr as a function (0.4.30)
trace_ctx = _core.trace_ctx                       # the current trace: is a call under one (0.4.36)
EvalTrace = _core.EvalTrace                       # the trace of eager evaluation (0.4.36)
is_symbolic_dim = _core.is_symbolic_dim           # a jax.export symbolic dimension (0.4.24)

# ------------------------------------------------------------ rule tables
primitive_jvps = _ad.primitive_jvps               # jvp rule per primitive (0.4)
primitive_transposes = _ad.primitive_transposes   # transpose rule per primitive (0.4)
primitive_linearizations = _ad.primitive_linearizations  # linearize rule, keeps residuals (0.5)
# 0.9.1 calls a linearize rule as rule(is_vjp, nonzeros, *primals); 0.8.0-0.9.0 as
# rule(nonzeros, *primals)
_LINEARIZE_IS_VJP = "_is_vjp" in inspect.signature(_ad.fallback_linearize_rule).parameters


def linearize_rule(rule):
    """``rule(is_vjp, nonzeros, *primals, **params)`` in the form this JAX calls it."""
    return rule if _LINEARIZE_IS_VJP else functools.partial(rule, False)


fancy_primitive_batchers = _batching.fancy_primitive_batchers  # vmap rules given the axis (0.4.36)
batch_jaxpr = _batching.batch_jaxpr               # which outputs vary over an axis (0.4.36)
NamedAxisEffect = _core.NamedAxisEffect           # axis names a jaxpr's collectives use (0.4.36)


def axis_name(axis_data):
    """The name of the vmap axis a fancy batcher gets (``axis_data``), or None (0.4.36)."""
    name = axis_data.name
    return None if name is _core.no_axis_name else name


register_lowering = _mlir.register_lowering       # MLIR lowering per primitive (0.4)
lowerings = _mlir._lowerings                      # cleared when an op is collected (0.4)
platform_specific_lowerings = _mlir._platform_specific_lowerings  # likewise (0.4)
# shard= (0.4.31)
requires_devices_during_lowering = _dispatch.prim_requires_devices_during_lowering

# --------------------------------------------------------------- autodiff
Zero = _ad.Zero                                   # a symbolic zero tangent or cotangent (0.4)
UndefinedPrimal = _ad.UndefinedPrimal             # a linear operand under transposition (0.4)
instantiate_zeros = _ad.instantiate_zeros         # a symbolic zero as an array (0.4)
linearize_from_jvp = _ad.linearize_from_jvp       # a jvp rule as a linearize rule (0.5)
wrap_init = _lu.wrap_init                         # a function in linear_util form (0.5)
debug_info = _api_util.debug_info                 # the debug info wrap_init takes (0.5)
float0 = _dtypes.float0                           # the tangent dtype of integer values (0.4)
dtype_of = _dtypes.dtype                          # dtype of a value, float0 included (0.4)
issubdtype = _dtypes.issubdtype                   # knows JAX's extended dtypes (0.4)
canonicalize_dtype = _dtypes.canonicalize_dtype   # a dtype as x64 mode makes it (0.4)

# ----------------------------------------------------------------- effects
Effect = _effects.Effect                          # has_side_effect=True ops (0.4)
no_effects = _effects.no_effects                  # (0.4)
lowerable_effects = _effects.lowerable_effects    # (0.4)
control_flow_allowed_effects = _effects.control_flow_allowed_effects  # (0.4)
custom_derivatives_allowed_effects = _effects.custom_derivatives_allowed_effects  # (0.4)
remat_allowed_effects = _effects.remat_allowed_effects  # (0.4)

# ------------------------------------------------------------ configuration
_BOOL_STATE = inspect.signature(_config.bool_state).parameters


def bool_state(**kwargs):
    """A flag in JAX's config (the ANYBIND_DEBUG flag, part of cache keys); before 0.8 a
    flag has no ``include_in_trace_context`` (being in the jit key puts it there)."""
    if "include_in_trace_context" not in _BOOL_STATE:
        kwargs.pop("include_in_trace_context", None)
    return _config.bool_state(**kwargs)

enable_x64 = _config.enable_x64                   # declared dtypes follow it (0.4)
disable_jit = _config.disable_jit                 # an eager call runs compiled (0.4)
eager_constant_folding = _config.eager_constant_folding  # off in eager programs (0.6)
_direct_linearize = getattr(_config, "use_direct_linearize", None)  # 0.5; marked for removal


def direct_linearize() -> bool:
    """Whether reverse mode linearizes primitives directly (``jax_use_direct_linearize``,
    its default) rather than by a JVP then partial evaluation; once JAX removes
    the flag, it always does."""
    return True if _direct_linearize is None else bool(_direct_linearize.value)

check_vma = _config._check_vma                    # shard_map varying-axes checking (0.7)
weakref_cache_key_types = _util.weakref_cache_key_types  # Call in JAX's weakref caches (0.4)
register_traceback_exclusion = _traceback_util.register_exclusion  # hide library frames (0.4)

# ----------------------------------------------------------------- lowering
lower_fun = _mlir.lower_fun                       # traced code inlined into a lowering (0.4)
full_like_aval = _mlir.full_like_aval             # constant results of a lowering (0.4)
transpose_value = lambda value, perm: _hlo.transpose(value, _mlir.dense_int_array(perm))  # noqa: E731  axes of a lowered value permuted (0.4.31)
string_attr_value = lambda attr: _mlir.ir.StringAttr(attr).value  # noqa: E731  a lowering's attribute (0.4)


def stable_custom_call_targets() -> set:
    """jax.export's set of custom-call targets it serialises without complaint (0.4.30)."""
    from jax._src.export import _export
    return _export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE


# ------------------------------------------------------------ many devices
get_abstract_mesh = _mesh.get_abstract_mesh       # the mesh of the current trace (0.5)
ShardingContext = _sharding_impls.ShardingContext  # a lowering for many devices (0.4.31)
ManualAxisType = getattr(_core, "ManualAxisType", None)  # the varying axes of an aval (0.10)
empty_varying = getattr(_core, "empty_mat", None)  # no varying axes (0.10)
pvary = getattr(_core, "pvary", None)             # mark a value varying over axes (0.7)


def reductions_in_partitioned_body(mesh):
    """The context of the psums in a custom_partitioning body: they must see the mesh's
    axes as Auto. Under Explicit axes XLA rejects the reducer, whose ``add`` then carries
    sharding annotations ("Unsupported reduction computation"): 0.8.0-0.9.0 and again from
    0.11 (0.9.1-0.10 accepted it either way)."""
    from jax.sharding import AbstractMesh, AxisType
    names = tuple(mesh.axis_names)
    return jax.sharding.use_abstract_mesh(
        AbstractMesh(tuple(mesh.axis_sizes), names, axis_types=(AxisType.Auto,) * len(names)))


def varying_axes(aval) -> frozenset:
    """The manual mesh axes ``aval`` varies over (``vma``); empty outside shard_map."""
    mat = getattr(aval, "mat", None)
    if mat is not None:  # 0.10: a ManualAxisType
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))  # 0.7 – 0.9


def typed_aval(shape, dtype, sharding, axes) -> ShapedArray:
    """An aval with a sharding that varies over the manual mesh axes ``axes``."""
    axes = frozenset(axes)
    if ManualAxisType is not None:  # 0.10
        mat = ManualAxisType(varying=axes) if axes else empty_varying
        return ShapedArray(shape, dtype, sharding=sharding,
                           manual_axis_type=mat)  # type: ignore[arg-type]
    return ShapedArray(shape, dtype, sharding=sharding, vma=axes)  # type: ignore[call-arg]  # 0.7 – 0.9



# ------------------------------------------------------------------- runtime
get_concrete_mesh = _mesh.get_concrete_mesh      # the mesh jax.set_mesh set, or empty (0.8)
use_concrete_mesh = _sharding_impls._internal_use_concrete_mesh  # set it on this thread (0.8)


def without_mesh(fn, *args):
    """``fn(*args)`` with the calling thread's mesh cleared, as JAX's own callbacks run
    Python from 0.12 (``jax._src.callback``): host code may run on the thread that
    dispatched the program, whose ``jax.set_mesh`` is not the host code's. Free when no
    mesh is set."""
    if get_abstract_mesh().empty and get_concrete_mesh().empty:
        return fn(*args)
    with use_concrete_mesh(_mesh.empty_concrete_mesh), \
            _mesh.use_abstract_mesh(_mesh.empty_abstract_mesh):
        return fn(*args)


def _collect_garbage():
    try:
        from jax._src.lib import _jax as _jaxlib
    except ImportError:  # pragma: no cover
        return lambda: None
    return getattr(_jaxlib, "collect_garbage", lambda: None)


# the Python objects jaxlib let go of without the GIL (a NumPy array a zero-copy
# transfer held, say), released now; they are otherwise released at jaxlib's next
# call that takes the GIL (jaxlib 0.4.x: xla_extension, 0.7: _jax)
collect_garbage = _collect_garbage()
