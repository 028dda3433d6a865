"""Host code's read-only inputs stay read-only when torch wraps them.

A host function's inputs are read-only NumPy views of XLA's buffers. torch does
not keep that flag: ``torch.from_numpy`` only warns that the array is not
writable, and ``torch.from_dlpack`` (also ``torch.utils.dlpack.from_dlpack``),
``torch.as_tensor`` and ``torch.asarray`` say nothing; torch has no read-only
tensors, and torch 2.15 asks NumPy for a versioned DLPack capsule, which carries
the read-only flag, and ignores the flag. So a tensor over the view would write
into the caller's JAX array. While host code runs (``routes._host.in_host_call``),
these functions, given a read-only NumPy array, wrap a private copy of it
instead: a write stays in the copy, as under ``ab.from_torch``. Elsewhere they
are torch's own.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import torch.utils.dlpack

from ..routes._host import in_host_call


def _guarded(wrap):
    @functools.wraps(wrap)
    def guarded(obj, *args, **kwargs):
        if type(obj) is np.ndarray and not obj.flags.writeable and in_host_call():
            obj = np.array(obj)  # a private, writable copy
        return wrap(obj, *args, **kwargs)
    guarded.__anybind_guarded__ = True
    return guarded


def install() -> None:
    """Guard torch's wrappers of NumPy memory (once), under each public name they have."""
    for space, name in ((torch, "from_numpy"), (torch, "from_dlpack"), (torch, "as_tensor"),
                        (torch, "asarray"), (torch.utils.dlpack, "from_dlpack")):
        fn = getattr(space, name)
        if not getattr(fn, "__anybind_guarded__", False):
            setattr(space, name, _guarded(fn))


install()
