"""anybind: bind any function into JAX as a primitive that works under every transformation."""
import os as _os

from jax._src import traceback_util as _traceback_util

from ._api import Op, bind
from ._check import RuleError, check
from ._hostcall import HostError
from ._roles import MissingRuleError
from ._spec import like

__all__ = ["bind", "like", "Op", "HostError", "MissingRuleError", "check", "RuleError"]
__version__ = "0.1.0"

_traceback_util.register_exclusion(_os.path.dirname(__file__))
