"""The GPU host route: host code in a program compiled for a GPU.

XLA's GPU Python callback (``xla_ffi_python_gpu_callback``, the target of
``jax.pure_callback``) copies the operands to the host and the outputs back;
the runner is the CPU routes', filling host arrays allocated here. Host code
per shard (``shard=``) and compiled functions run on the CPU only.
"""
from __future__ import annotations

import jax.ffi
import numpy as np

from ..core import _lifetime
from ..core._lowering import Site
from . import _host
from ._host import host_callback, not_exported, runner_for, single_platform

TARGET = "xla_ffi_python_gpu_callback"


class Route:
    name = "gpu-host"

    def claims(self, site: Site) -> bool:
        return single_platform(site.ctx) in _host.GPU_PLATFORMS

    def lower(self, site: Site, *args):
        ctx, call = site.ctx, site.call
        not_exported(ctx, call, site.name)
        guarded = host_callback(call, site.name, runner_for(site)(call, site.batch))
        avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]

        def callback(*ins):  # host copies of the operands; the outputs go back the same way
            outs = [np.empty(s, d) for s, d in avals]
            ins = [np.asarray(x) for x in ins]
            for x in ins:
                x.setflags(write=False)  # as XLA's buffers on the CPU routes
            guarded(ins, outs)
            return tuple(outs)
        ctx.module_context.add_host_callback(_lifetime.held(ctx, callback))
        index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
        rule = jax.ffi.ffi_lowering(TARGET, has_side_effect=site.effect)
        return rule(ctx, *args, index=index)
