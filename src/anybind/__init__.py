"""anybind: bind any function into JAX as a primitive that works under every transformation.

==============  ====================================================================
package         what it holds (imports run down this table, never up)
==============  ====================================================================
``core``        what an op is: spec, primitives, roles, derivatives, batching,
                closures, lifetime; ``core._jax``, the one seam for JAX's private API
``routes``      where an op's code runs: one route per module behind one interface
``_api``        ``bind`` and ``Op``
``torch``       the PyTorch front end (``op.torch``), registered with core at first use,
                and the bridges ``from_torch``/``to_torch`` (imported when first named)
``check``       ``ab.check``
``recipes``     ``reversible_loop``, ``root``, ``fixed_point``
``contrib``     bindings of SciPy, ducc0 and a Numba N-body kernel
``cli``         ``python -m anybind check|demo``
==============  ====================================================================
"""
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ._api import Op, bind
from .check import RuleError, check
from .core._debug import debug
from .core._errors import HostError, MissingRuleError
from .core._jax import register_traceback_exclusion as _register_traceback_exclusion
from .core._spec import like
from .recipes import fixed_point, reversible_loop, root
from .routes._compiled import (
    C_SIGNATURE,
    GPU_SIGNATURE,
    ctypes_signature,
    deserialize,
    dtype_code,
    numba_signature,
    serialize,
)
from .routes._state import State

__all__ = ["bind", "like", "Op", "HostError", "MissingRuleError", "check", "RuleError",
           "C_SIGNATURE", "GPU_SIGNATURE", "numba_signature", "ctypes_signature", "dtype_code",
           "State", "reversible_loop", "root", "fixed_point", "debug", "serialize",
           "deserialize", "from_torch", "to_torch"]
__version__ = "0.1.0"

_register_traceback_exclusion(_os.path.dirname(__file__))

_LAZY = ("from_torch", "to_torch")  # need torch: imported at first use, not with anybind
if _TYPE_CHECKING:  # what type checkers and the API reference see
    from .torch._bridges import from_torch, to_torch


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        try:
            from .torch import _bridges
        except ImportError as e:
            if e.name != "torch":
                raise
            raise ImportError(f"ab.{name} needs PyTorch: pip install 'anybind[torch]'") from e
        return getattr(_bridges, name)
    raise AttributeError(f"module 'anybind' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
