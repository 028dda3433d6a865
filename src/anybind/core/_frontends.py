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
``load_present``  imports each front end whose framework the process has imported,
                  so that it guards host code that calls that framework
================  ===============================================================

A front end fills these when it is imported; ``front`` imports it by name
(``anybind.<name>``) the first time an op asks for it.
"""
from __future__ import annotations

import importlib
import sys
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


# front end name -> the framework module whose presence calls for it
FRAMEWORKS = {"torch": "torch"}


def load_present() -> None:
    """Import the front ends of the frameworks already imported (routes call this when
    they lower host code, which may call those frameworks on its read-only inputs)."""
    for name, module in FRAMEWORKS.items():
        if name not in MAKERS and module in sys.modules:
            importlib.import_module(f"{__package__.rpartition('.')[0]}.{name}")
