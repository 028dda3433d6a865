"""Tests run strict: x64 on, rank promotion raises, warnings are errors (pyproject).

The PyTorch front end's tests (test_torch*.py) and the bridges' (test_bridges*.py) need
the ``torch`` extra; without it they are not collected (CI runs them in a step of their
own that installs it).
"""
import importlib.util

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["test_torch*.py",
                                                                   "test_bridges*.py"]
