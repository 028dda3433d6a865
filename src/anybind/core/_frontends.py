"""The registry through which front ends plug into core, which never imports them.

================  ===============================================================
name              what it holds
================  ===============================================================
``FRONT_ENDS``    array type → ``run(op, *args, **kw)``: how an op runs on another
                  framework's arrays (``torch.Tensor``), so that bound ops called
                  inside a rule on those arrays dispatch to that front end
``MAKERS``        front end name → ``make(op)``, the op's front-end object
``LIVE_OPS``      every live op by ``id``, for front ends that can pass only
                  numbers (``torch.compile``)
``front``         ``MAKERS[name](op)``, importing the front end at its first use
================  ===============================================================

A front end fills these when it is imported; ``front`` imports it by name
(``anybind.<name>``) the first time an op asks for it.
"""
from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable
from typing import Any

FRONT_ENDS: dict[type, Callable] = {}
MAKERS: dict[str, Callable] = {}
LIVE_OPS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def front(name: str, op) -> Any:
    """The op's object of front end ``name`` (e.g. ``"torch"``: ``op.torch``)."""
    make = MAKERS.get(name)
    if make is None:
        importlib.import_module(f"{__package__.rpartition('.')[0]}.{name}")  # registers itself
        make = MAKERS[name]
    return make(op)
