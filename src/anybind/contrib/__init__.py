"""Ready-made bindings of real scientific libraries, as anybind ops.

- ``anybind.contrib.ducc0``: FFTs (c2c, r2c, c2r, Hartley), spherical harmonic
  synthesis on HEALPix, the non-uniform FFT (types 1 and 2) and the
  radio-interferometric wgridder, all from ducc0.
- ``anybind.contrib.finufft``: a drop-in for jax-finufft (``nufft1``, ``nufft2``,
  ``nufft3``, ``Opts``, ``NestedOpts``) on ducc0's NUFFT, with plans for fixed
  points (``Plan``, ``Plan3``).
- ``anybind.contrib.scipy``: special functions with derivatives of every order
  (``gammaln``, ``digamma``, ``polygamma``, ``erfcx``, Bessel ``jv``, ``yv``,
  ``iv``, ``kv``) and a sparse linear solve differentiable in the matrix and
  the right-hand side.

Importing this package imports nothing heavy; each submodule imports its
library when it is itself imported, and says which extra to install
(``pip install anybind[examples]``) when the library is missing.

>>> import anybind.contrib
>>> sorted(anybind.contrib.SUBMODULES)
['ducc0', 'finufft', 'scipy']
"""
from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

SUBMODULES = ("ducc0", "finufft", "scipy")
__all__ = ["SUBMODULES", "require"]


def reshaped(a, shape: tuple):
    """A view of the array ``a`` with another shape; raises rather than copy, so that
    writes into it reach ``a`` (an output buffer an in-place function fills).

    >>> import numpy as np
    >>> a = np.zeros((2, 3))
    >>> reshaped(a, (3, 2))[0, 0] = 1.0
    >>> float(a[0, 0])
    1.0
    """
    v = a.reshape(shape)  # a view wherever the strides allow one (``.shape =`` is deprecated)
    if v.size and not np.may_share_memory(v, a):
        raise ValueError(f"an output of shape {a.shape} and strides {a.strides} cannot be "
                         f"viewed as shape {shape} without a copy")
    return v


def require(library: str, user: str) -> ModuleType:
    """Import the optional ``library`` for the contrib module ``user``, or explain.

    >>> from anybind.contrib import require
    >>> require("numpy", "anybind.contrib.example").__name__
    'numpy'
    """
    try:
        return importlib.import_module(library)
    except ImportError as e:
        raise ImportError(
            f"{user} needs the optional dependency '{library}', which is not installed "
            f"({e}); install it with: pip install 'anybind[examples]'") from e
