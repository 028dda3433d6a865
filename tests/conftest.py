"""Tests run strict: x64 on, rank promotion raises, warnings are errors (pyproject)."""
import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
