"""The supported window, in one place: the oldest and the newest releases CI tests.

``.ci/run`` tests the newest stack first (Python 3.13 with the newest JAX, NumPy,
SciPy and torch the index serves) and the oldest as a second step (Python 3.11,
jax 0.8.0, NumPy 2.1, torch 2.13); its wheel step smoke-tests the wheel on Python
3.12. The release workflow builds and smoke-tests a wheel for every Python in
``WHEELS`` (cp314 too: jaxlib has wheels for it). pyproject.toml (``requires-python``,
the classifiers, the dependencies, the ``torch`` extra, ``[tool.cibuildwheel]``),
the requirements in ``docs/getting-started.md`` and ``python -m anybind info`` say
the same; ``tests/test_window.py`` checks that they do.

>>> from anybind._window import TESTED
>>> TESTED["jax"][0]
'0.8.0'
"""
from __future__ import annotations

WHEELS = ("3.11", "3.12", "3.13", "3.14")
TESTED = {  # (oldest, newest) that CI runs; the newest is what pip gave on the day it was set
    "python": ("3.11", "3.13"),
    "jax": ("0.8.0", "0.12.0.1"),
    "numpy": ("2.1.3", "2.5.5"),
    "torch": ("2.13.0", "2.15.0"),
}
