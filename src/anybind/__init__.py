"""anybind: bind any function into JAX as a primitive that works under every transformation."""
import os as _os

from jax._src import traceback_util as _traceback_util

from ._api import Op, bind
from ._check import RuleError, check
from ._compiled import C_SIGNATURE, ctypes_signature, dtype_code, numba_signature
from ._debug import debug
from ._hostcall import HostError
from ._recipes import fixed_point, reversible_loop, root
from ._roles import MissingRuleError
from ._spec import like

__all__ = ["bind", "like", "Op", "HostError", "MissingRuleError", "check", "RuleError",
           "C_SIGNATURE", "numba_signature", "ctypes_signature", "dtype_code",
           "reversible_loop", "root", "fixed_point", "debug"]
__version__ = "0.1.0"

_traceback_util.register_exclusion(_os.path.dirname(__file__))
