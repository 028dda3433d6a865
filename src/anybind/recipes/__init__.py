"""Recipes: derivative tricks as features, built on ``ab.bind``'s public API only.

See ``_recipes`` for the table of recipes and their maths.
"""
from ._recipes import fixed_point, reversible_loop, root

__all__ = ["reversible_loop", "root", "fixed_point"]
