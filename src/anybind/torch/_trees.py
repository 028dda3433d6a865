"""A torch function's output as the matching JAX pytree.

============================  ===========================================================
piece                         what it does
============================  ===========================================================
``jax_tree(out, number)``     structseqs as tuples, a class only torch's pytrees know
                              registered with JAX's (torch's own flattening; a dataclass
                              field for field), numbers through ``number``
``number_dtype(v)``           the dtype of the array ``jax.jit`` makes of a number
============================  ===========================================================
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import jax
import numpy as np
import torch
from jax import tree_util

from . import _torch


def jax_tree(out, number: Callable):
    """A torch function's output as the matching JAX pytree.

    torch's structseqs (``torch.return_types.max``, ...) and ``torch.Size`` become
    tuples; a class registered only with torch's pytrees (``register_dataclass``,
    ``register_pytree_node``) is registered with JAX's, by torch's own flatten and
    unflatten functions, so the same class comes back; a Python or NumPy number
    becomes ``number(v)``, the array ``jax.jit`` makes of a Python number it returns.
    Other leaves stay, for the output check to name.
    """
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (bool, int, float, complex, np.generic)):
        return number(out)
    if isinstance(out, tuple):  # a named tuple stays one; a structseq becomes a tuple
        items = [jax_tree(o, number) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    if isinstance(out, list):
        return [jax_tree(o, number) for o in out]
    if isinstance(out, dict):
        return {k: jax_tree(v, number) for k, v in out.items()}
    if out is None or not _jax_node(out):
        return out
    return tree_util.tree_map(lambda o: jax_tree(o, number), out,
                              is_leaf=lambda o: o is not out)


class OutputError(TypeError):
    """A torch function's output that no JAX pytree of arrays can hold."""


def check_leaves(name: str, out, array: type | tuple[type, ...]) -> None:
    """Each leaf of ``out`` (``jax_tree``'s) is an ``array``, or an error naming the op,
    the output and what it is."""
    for path, leaf in tree_util.tree_leaves_with_path(out):
        if not isinstance(leaf, array):
            text = repr(leaf)
            raise OutputError(
                f"anybind op '{name}': the torch function's output "
                f"{tree_util.keystr(path) or '(the whole output)'} is a "
                f"{type(leaf).__module__}.{type(leaf).__qualname__} "
                f"({text[:60] + '...' if len(text) > 60 else text}); expected a tensor or a "
                f"Python number, in containers both torch's and JAX's pytrees can hold "
                f"(tuple, list, dict, a named tuple, a torch structseq, None, or a class "
                f"registered with torch.utils._pytree or jax.tree_util)")


def number_dtype(v) -> np.dtype:
    """The dtype of the array JAX makes of a returned number: a NumPy scalar's own, a
    Python number's canonical one (64-bit with ``jax_enable_x64``, else 32-bit)."""
    if isinstance(v, np.generic):
        return v.dtype
    return jax.dtypes.canonicalize_dtype(np.asarray(v).dtype)


_JAX_NODES = threading.Lock()
_LEAF = tree_util.tree_structure(0)


def _jax_node(obj) -> bool:
    """Whether JAX's pytrees know ``obj``'s class as a node, after registering it there
    if only torch's know it (once, under a lock: two threads may meet the class first)."""
    cls = type(obj)
    node = _torch.pytree_node(cls)
    with _JAX_NODES:
        if tree_util.tree_structure(obj) != _LEAF:
            return True
        if node is None or cls.__module__.split(".")[0] in ("builtins", "collections",
                                                            "torch"):
            return False  # no JAX counterpart (a deque, torch's own types): named later
        fields = _dataclass_fields(obj, node)
        if fields is not None:  # torch's register_dataclass: the same fields, None kept
            data = [f.name for f in dataclasses.fields(cls) if f.name in fields]
            tree_util.register_dataclass(cls, data_fields=data, meta_fields=[], drop_fields=[
                f.name for f in dataclasses.fields(cls) if f.init and f.name not in fields])
            return True

        def flatten(o):
            children, context = node.flatten_fn(o)
            return children, _Context(context)

        def unflatten(context, children):  # JAX's order of the two, not torch's
            return node.unflatten_fn(list(children), context.value)

        tree_util.register_pytree_node(cls, flatten, unflatten)
        return True


def _dataclass_fields(obj, node) -> set[str] | None:
    """The fields torch's ``register_dataclass`` flattens, read from its context
    ``[names of fields set, names of fields that are None]``; None for other nodes."""
    if not dataclasses.is_dataclass(obj):
        return None
    _, context = node.flatten_fn(obj)
    if (isinstance(context, list) and len(context) == 2
            and all(isinstance(c, list) for c in context)):
        return set(context[0]) | set(context[1])
    return None


class _Context:
    """torch's context of a node (lists, often) as the hashable aux data JAX's needs."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other) -> bool:
        return isinstance(other, _Context) and self.value == other.value

    def __hash__(self) -> int:
        return hash(_frozen(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


def _frozen(v):
    if isinstance(v, (list, tuple)):
        return tuple(map(_frozen, v))
    if isinstance(v, dict):
        return tuple((k, _frozen(x)) for k, x in v.items())
    try:
        hash(v)
    except TypeError:
        return type(v).__name__
    return v
