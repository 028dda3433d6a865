"""Where an op's code runs: one route per module, behind ``core._lowering``'s interface.

The primitive inlines traced code itself; every other role is lowered by the
first route below that claims it (``claims(site)``), in this order:

================  ===================  ===============================================
route             module               runs
================  ===================  ===============================================
``gpu-device``    ``_gpu_device``      device code (``device=True``): a compiled
                                       launcher through the shim's CUDA handler, or
                                       Python on CuPy views of XLA's device buffers
                                       and stream; its host fallback by the routes
                                       below elsewhere
``shard``         ``_shard``           host or compiled code per shard of a program
                                       partitioned over several devices (``shard=``)
``compiled``      ``_compiled``        a C function pointer through the FFI shim
                                       (``_shim.c``, loaded by ``_shimlib``): no
                                       Python, no GIL, no copies
``gpu-host``      ``_gpu_host``        host code in a GPU program, by XLA's GPU
                                       Python callback (operands copied to the host)
``pyffi``         ``_pyffi``           host code on the CPU through anybind's own FFI
                                       handler (``_pycall.c``) on NumPy views
``callback``      ``_callback``        host code on the CPU through XLA's buffer
                                       callback: the fallback
================  ===================  ===============================================

What the host routes share (the runner of a role, its guard, the custom
call) is in ``_host``; what the two C handlers share (the declared FFI version,
the error constructor, XLA's metadata handshake) is in ``_ffi.h``. A new route
is a new module and one line below.
"""
from __future__ import annotations

from ..core import _lowering
from . import _callback, _compiled, _gpu_device, _gpu_host, _pyffi, _shard, _shimlib

_shimlib.register_at_import()  # a deserialised program finds the shim's handler
for _route in (_gpu_device.Route(), _shard.Route(), _compiled.Route(), _gpu_host.Route(),
               _pyffi.Route(), _callback.Route()):
    _lowering.register(_route)
