"""The shard route: an op bound with ``shard=RULE`` runs per shard, on many devices and hosts.

JAX is the distributed engine: the op's rule (``core._sharding``) becomes a
Shardy sharding rule on a ``jax.experimental.custom_partitioning`` call, and
each device runs the op's host or compiled code on its own shard.

==================  =========================================================
piece               what it does
==================  =========================================================
``claims``          host or compiled code of a ``shard=`` op, in a program
                    partitioned over several devices
``lower``           one host callback registered with the program, whose
                    partition callback makes the shard's ``Call`` and runs
                    the same role on it (compiled code: the same primitive
                    on the shard's ``Call``)
==================  =========================================================
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from ..core import _jax
from ..core._errors import HostError
from ..core._jax import ShapedArray
from ..core._lowering import Site
from ..core._sharding import factors_of, mesh_axes, plan_factors, role_factors, splittable_factors
from ..core._spec import Batch, Call
from ..core.roles import out_avals
from . import _callback, _pyffi
from ._compiled import is_compiled
from ._host import Slot, cpu_only, emit, host_callback, not_exported, runner_for

# -------------------------------------------------------------------- lowering

def partitioned(ctx) -> bool:
    """Whether this lowering is of a program partitioned over several devices by XLA."""
    ac = ctx.module_context.axis_context
    return (isinstance(ac, _jax.ShardingContext) and ac.num_devices > 1
            and ac.device_assignment is not None)


_shard_call_p = _jax.Primitive("anybind_shard_call")
_shard_call_p.multiple_results = True
_shard_call_p.def_abstract_eval(lambda *args, slot: list(slot.out_avals))


@dataclasses.dataclass(frozen=True, eq=False)
class _Slot:
    """A host callback registered with the whole program, run on one shard's buffers."""
    host: Slot
    out_avals: tuple
    has_side_effect: bool


def _lower_shard_call(ctx, *args, slot: _Slot):
    return emit(ctx, *args, slot=slot.host, has_side_effect=slot.has_side_effect)


_jax.register_lowering(_shard_call_p, _lower_shard_call)


def lower(ctx, *args, role: str, call: Call, batch: Batch | None, lin, need, role_name: str,
          runner_for: Callable, has_side_effect: bool):
    """Lower one primitive of the family to a custom-partitioned call run per shard.

    ``runner_for(local_call, local_batch)`` builds the host runner of the same
    role for a shard's ``Call``. The host callback is registered here, with the
    program being compiled (the partition callback runs during compilation,
    when the program's callbacks are already fixed); it runs the runner built
    for the shapes it receives. Compiled code (``runner_for=None``) needs no
    callback: each shard binds the same primitive with the shard's ``Call``.
    """
    runners: dict = {}

    def dispatch(ins, outs):
        shapes = tuple(x.shape for x in ins)
        if shapes not in runners:
            raise HostError(f"anybind op '{call.op.name}': the {role_name} was called on a "
                            f"shard of shapes {list(shapes)}, which its program did not plan "
                            f"(it planned {[list(k) for k in runners]})")
        runners[shapes](ins, outs)

    host = None if runner_for is None else _register(
        ctx, call, role_name, host_callback(call, role_name, dispatch))
    ops_f, res_f = role_factors(role, call, batch, lin, need)
    splittable = splittable_factors(call, batch)
    fs = factors_of(call)
    sizes = dict(fs.sizes, b=batch.size) if batch is not None else fs.sizes
    sizes.update({f"u{i}": 1 for i in range(len(ops_f))})
    reduce = role in ("vjp", "transpose")

    def partition(mesh, arg_shapes, result_shape):
        specs = [getattr(a.sharding, "spec", P()) for a in arg_shapes]
        specs += [getattr(r.sharding, "spec", P()) for r in result_shape]
        plan = plan_factors(specs, ops_f + res_f, mesh, splittable, set(mesh.axis_names),
                     sizes=sizes)
        n_split = lambda f: math.prod(mesh.shape[a] for a in mesh_axes(plan.get(f)))
        local = lambda ids, shape: tuple(n // n_split(f) for f, n in zip(ids, shape))
        xs = [a.update(shape=local(ids, a.shape)) for ids, a in zip(fs.ins, call.in_avals)]
        ks = [a.update(shape=local(ids, a.shape))
              for ids, a in zip(fs.ins[fs.n_in:], call.kw_avals)]
        local_call = call.op.call_for(call.args_tree, call.kw_tree, call.static, tuple(xs),
                                        tuple(ks), call.static_types)
        local_batch = None if batch is None else Batch(batch.size // n_split("b"), batch.mask)
        want = [local(ids, r.shape) for ids, r in zip(res_f, result_shape)]
        got = [o.shape for o in _local_out_avals(role, local_call, local_batch, lin, need)]
        if got != want:
            raise TypeError(
                f"anybind op '{call.op.name}': on a shard, the output spec gives the "
                f"{role_name} outputs of shapes {got}, but the shard rule "
                f"{fs.text!r} gives {want}; the rule does not fit the op's shapes")
        sums = [tuple(a for f, ax in plan.items() if f not in r for a in mesh_axes(ax))
                if reduce else () for r in res_f]
        if runner_for is None:
            local_params = dict(params, call=local_call, batch=local_batch)
            run = lambda *ops: prim.bind(*ops, **local_params)
        else:
            key_shapes = [local(ids, a.shape) for ids, a in zip(ops_f, arg_shapes)]
            runners[tuple(key_shapes)] = runner_for(local_call, local_batch)
            slot = _Slot(host, tuple(ShapedArray(w, r.dtype)
                                      for w, r in zip(want, result_shape)), has_side_effect)
            run = lambda *ops: _shard_call_p.bind(*ops, slot=slot)

        def lower_fn(*ops):
            outs = run(*ops)
            with _jax.reductions_in_partitioned_body(mesh):
                return [jax.lax.psum(o, s) if s else o for o, s in zip(outs, sums)]
        arg_sh = tuple(NamedSharding(mesh, P(*[plan.get(f) for f in fl])) for fl in ops_f)
        res_sh = [NamedSharding(mesh, P(*[plan.get(f) for f in fl])) for fl in res_f]
        return mesh, lower_fn, res_sh, arg_sh

    def infer(mesh, arg_shapes, result_shape):  # GSPMD (use_shardy_partitioner=False)
        plan = plan_factors([getattr(a.sharding, "spec", P()) for a in arg_shapes], ops_f, mesh,
                     splittable, set(mesh.axis_names), sizes=sizes)
        return [NamedSharding(mesh, P(*[plan.get(f) for f in fl])) for fl in res_f]

    seen = list(dict.fromkeys(f for fl in ops_f + res_f for f in fl))  # Shardy's order
    whole = tuple(f for f in seen if f not in splittable)
    rule = SdyShardingRule(tuple(ArrayMapping(*fl) for fl in ops_f),
                           tuple(ArrayMapping(*fl) for fl in res_f),
                           need_replication_factors=whole)
    prim = call.op.primitive(role)
    params = dict(call=call, batch=batch)
    if role != "primal":
        params.update(lin=lin, need=need)
    cp = custom_partitioning(lambda *ops: prim.bind(*ops, **params))
    cp.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return _jax.lower_fun(lambda *ops: cp(*ops), multiple_results=True)(ctx, *args)


def _local_out_avals(role, call, batch, lin, need) -> list:
    lead = () if batch is None else (batch.size,)
    return [a.update(shape=lead + a.shape) for a in out_avals(role, call, lin, need)]


def _register(ctx, call: Call, role_name: str, guarded) -> Slot:
    """Register ``guarded(ins, outs)`` with the program, by a CPU route of host code."""
    not_exported(ctx, call, role_name)
    cpu_only(ctx, call, "host code per shard (shard=)")
    if _pyffi.usable([*ctx.avals_in, *ctx.avals_out]):
        return _pyffi.slot(ctx, guarded, shapes=False)  # each shard's extents its own
    return _callback.slot(ctx, guarded)


class Route:
    name = "shard"

    def claims(self, site: Site) -> bool:
        return site.op.shard is not None and not site.rule.device and partitioned(site.ctx)

    def lower(self, site: Site, *args):
        build = None if is_compiled(site.rule.fn) else runner_for(site)
        return lower(site.ctx, *args, role=site.role, call=site.call, batch=site.batch,
                     lin=site.lin, need=site.need, role_name=site.name, runner_for=build,
                     has_side_effect=site.effect)
