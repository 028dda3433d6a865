"""The one seam between anybind and torch's non-public API.

Every private torch symbol the front end and the bridges use (``torch._C``,
``torch._functorch``, ``torch._subclasses``, ``torch._dynamo``, ``torch._VF``,
the underscored names of ``torch.autograd.forward_ad`` and of ``Tensor``) is
named here and nowhere else, one line per symbol, saying what it is for and
since which torch release it has the form used. A torch upgrade touches this
file. The supported torch is what CI tests (``pyproject.toml``'s ``torch``
extra); the releases named below are where each form first appeared.

Imports are explicit. ``torch._dynamo`` is the one module not imported here
(importing it takes seconds, and only ``torch.compile`` needs it):
``after_import`` runs a function once it has been imported (see there for why
that takes an import hook).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable

import torch
import torch.autograd.forward_ad as _forward_ad
from torch._functorch import eager_transforms as _eager, pyfunctorch as _pyfunctorch
from torch._subclasses import fake_tensor as _fake_tensor
from torch.utils import _python_dispatch

_C = torch._C
_F = torch._C._functorch

# --------------------------------------------------------------- transforms
transforms_active = _C._are_functorch_transforms_active  # a torch.func transform runs (2.1)
current_level = _F.maybe_current_level                   # innermost torch.func level (2.0)
level_of = _F.maybe_get_level                            # a wrapped tensor's level (2.0)
unwrap_for_grad = _F._unwrap_for_grad                    # a tensor less one level's wrapper (2.0)
is_wrapped = _F.is_functorch_wrapped_tensor              # a torch.func wrapper, live or dead (2.0)
JVP = _F.TransformType.Jvp                               # the key of a jvp interpreter (2.1)
current_interpreter = _pyfunctorch.retrieve_current_functorch_interpreter  # its key() (2.1)


def jvp_nesting() -> int:
    """How many ``torch.func.jvp`` levels are open (``eager_transforms.JVP_NESTING``, 2.0)."""
    return _eager.JVP_NESTING


# -------------------------------------------------------------- forward AD
def _load_jvp_decompositions() -> None:
    """Load torch's forward-AD decompositions now, as its first forward-mode call would.

    ``torch.autograd.forward_ad._maybe_load_decompositions`` (1.13) imports
    ``torch._decomp.decompositions_for_jvp``, which compiles its decompositions with
    ``torch.jit.script``, a function torch itself deprecates (a ``DeprecationWarning``
    in 2.13, a ``FutureWarning`` from 2.14). That warning is about torch's own module,
    which no user can change: it is silenced for this one import, here, and every
    forward-mode call after it (the bridges', the user's) warns about nothing. 0.24 s,
    once per process.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script(_method)?` is deprecated")
        _forward_ad._maybe_load_decompositions()


_load_jvp_decompositions()
set_fwd_grad_enabled = _forward_ad._set_fwd_grad_enabled  # forward AD on in a jvp rule (2.0)
unpack_dual_at = torch._VF._unpack_dual                   # a dual's primal at a given level (1.8)


def dual_level() -> int:
    """The open ``forward_ad.dual_level``, -1 if none (``forward_ad._current_level``, 1.9)."""
    return _forward_ad._current_level


# ------------------------------------------------------------------ autograd
will_engine_execute = _C._will_engine_execute_node  # whether backward runs a node (1.13)
_ENGINE = torch.autograd.Variable._execution_engine


def autograd_grad(outputs, inputs, cotangents, create_graph: bool) -> tuple:
    """``torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)`` without its
    per-call checks (``torch.autograd._make_grads``), for cotangents of the outputs' shapes
    and dtypes (``Variable._execution_engine.run_backward``, 2.0)."""
    return _ENGINE.run_backward(tuple(outputs), tuple(cotangents), create_graph, create_graph,
                                tuple(inputs), True, False)


def function_apply(cls, *args):
    """``autograd.Function.apply`` without its per-call ``inspect.signature`` binding
    (``_C._FunctionBase.apply``, the base it delegates to; 2.0), for calls that no
    torch.func transform sees."""
    return super(torch.autograd.Function, cls).apply(*args)


# ----------------------------------------------------------- older vmap (legacy)
is_legacy_batched = _F.is_legacy_batchedtensor   # a BatchedTensor of torch._vmap_internals (2.0)
vmapmode_increment = _C._vmapmode_increment_nesting  # its nesting, +1; returns the new (1.7)
vmapmode_decrement = _C._vmapmode_decrement_nesting  # its nesting, -1 (1.7)
remove_batch_dim = torch._remove_batch_dim       # physical tensor of a level (1.7)
add_batch_dim = torch._add_batch_dim             # a BatchedTensor at a level (1.7)

# ----------------------------------------------------------------- tensors
is_alias_of = _C._is_alias_of                       # shares storage, False if none (1.0)
is_zerotensor = torch.Tensor._is_zerotensor          # forward AD's data-less zeros (1.10)
version_of = torch.Tensor._version.__get__           # a tensor's in-place write counter (1.0)
from_dlpack_capsule = _C._from_dlpack                # a DLPack capsule, unchecked (1.10)

# -------------------------------------------------------------- fake tensors
FakeTensorMode = _fake_tensor.FakeTensorMode  # tensors with shapes and no data (2.0)
is_fake = _fake_tensor.is_fake                # a fake tensor, under torch.compile (2.0)
DynamicOutputShapeException = _fake_tensor.DynamicOutputShapeException  # nonzero & co (2.0)
TorchDispatchMode = _python_dispatch.TorchDispatchMode  # sees every aten op run (2.0)


def schema_of(op):
    """An aten op's schema: its arguments and what each writes (``OpOverload._schema``, 2.0)."""
    return op._schema


# --------------------------------------------------------------------- dynamo

def nonstrict_trace(fn: Callable) -> Callable:
    """``fn`` opaque to dynamo, traced by AOTAutograd (``torch._dynamo.nonstrict_trace``,
    2.7); imports ``torch._dynamo``."""
    import torch._dynamo
    return torch._dynamo.nonstrict_trace(fn)


def after_import(name: str, then: Callable[[], None]) -> None:
    """Run ``then()`` once module ``name`` is imported: now, or right after its import.

    Why a hook: marking a function opaque to dynamo needs ``torch._dynamo``,
    which takes seconds to import and which only ``torch.compile`` imports. No
    code of ours runs between that import and dynamo tracing our entry point
    (tracing reads the entry as it then is), so the mark must be made by the
    import itself. The hook is one finder, removed at its first match.
    """
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of module ``name`` so that ``then()`` runs after it executes."""

    def __init__(self, name: str, then: Callable[[], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, inner, then: Callable[[], None]):
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.then()

    def __getattr__(self, name: str):  # get_source and the rest: the wrapped loader's
        return getattr(self.inner, name)


# ------------------------------------------------ graph capture (mode="translate")

def tree_flatten(tree):
    """torch's own pytree flattening, the order ``torch.export`` numbers a program's
    inputs and outputs in (``torch.utils._pytree.tree_flatten``, 2.0)."""
    from torch.utils import _pytree
    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves, spec):
    """The inverse of ``tree_flatten`` (``torch.utils._pytree.tree_unflatten``, 2.0)."""
    from torch.utils import _pytree
    return _pytree.tree_unflatten(leaves, spec)


def pytree_node(cls: type):
    """The node a class is registered as in torch's pytrees (``register_dataclass``,
    ``register_pytree_node``): its ``flatten_fn`` and ``unflatten_fn``, or None
    (``torch.utils._pytree.SUPPORTED_NODES``, 2.0; its ``NodeDef`` fields, 2.2)."""
    from torch.utils import _pytree
    return _pytree.SUPPORTED_NODES.get(cls)


def aten_packets() -> list[str]:
    """The names of every registered ``aten::`` op, loaded or not (the coverage page's
    core set; ``torch._C._dispatch_get_all_op_names``, 2.0)."""
    return sorted({n.split("::", 1)[1].split(".")[0] for n in _C._dispatch_get_all_op_names()
                   if n.startswith("aten::")})


_core_aten: tuple = (None, None)  # (the count of registered ops it was made for, the split)


def to_core_aten(ep, keep=()):
    """``ep.run_decompositions()``: the program in the core ATen op set, by torch's own
    default table, split into torch's two kinds of decomposition once, not per capture.

    ``run_decompositions`` materializes ``default_decompositions()`` and splits it by
    walking every registered op on each call: 0.1-0.3 s, most of a small program's
    capture. The split (torch's
    ``torch.export.exported_program._split_decomp_table_to_cia_and_python_decomp``,
    applied by ``torch.export.exported_program._decompose_exported_program``, both
    2.6) is made again whenever an op has been registered or removed since
    (``_C._dispatch_get_all_op_names``, 5 ms), so a custom op registered later is
    decomposed as ``run_decompositions`` would. Where torch's names differ, it is
    ``run_decompositions()`` itself. ``keep``: names of aten ops (``"lstm.input"``) left
    whole, as leaving them out of ``run_decompositions``' table does (the split marks
    such an op with ``torch._export.utils._special_op_to_preserve_cia``)."""
    from torch.export import exported_program as _ep
    try:
        from torch._export.utils import _special_op_to_preserve_cia as preserve
    except ImportError:
        preserve = None
    kept = {getattr(getattr(torch.ops.aten, op), overload)
            for op, _, overload in (k.partition(".") for k in keep)}
    split = getattr(_ep, "_split_decomp_table_to_cia_and_python_decomp", None)
    decompose = getattr(_ep, "_decompose_exported_program", None)
    if split is None or decompose is None or preserve is None:
        table = torch.export.default_decompositions()
        for op in kept:
            table.pop(op, None)
        return ep.run_decompositions(table)
    global _core_aten
    n = len(_C._dispatch_get_all_op_names())
    made_for, table = _core_aten  # one tuple, replaced whole: threads see a count and its split
    if made_for != n:
        table = split(torch.export.default_decompositions().materialize())
        _core_aten = (n, table)
    cia, python = table
    return decompose(ep, cia_to_decomp={k: preserve if k in kept else v for k, v in cia.items()},
                     python_decomp_table={k: v for k, v in python.items() if k not in kept},
                     joint_loss_index=None, decompose_custom_triton_ops=False)


def decompositions(ops) -> dict:
    """Of ``ops`` (op overloads), those torch has a Python decomposition of, each with
    it (``torch._decomp.decomposition_table``, 2.0): ``grid_sampler_2d``, the norms'
    backward ops, ... (``ExportedProgram.run_decompositions`` with such a table
    decomposes those and keeps every other op, CompositeImplicit ones included, 2.6.)"""
    from torch._decomp import decomposition_table
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


# ------------------------------------------------------- export's provenance

def made_from(node):
    """Every source torch's export and decompositions record for an fx node, nearest
    first: its ``meta["from_node"]``, each source's own sources after it (2.6)."""
    todo = list(node.meta.get("from_node") or ())
    while todo:
        src = todo.pop(0)
        yield src
        todo[:0] = getattr(src, "from_node", None) or ()


def is_detach(node) -> bool:
    """Whether decomposition made an fx node from ``aten.detach`` (an ``alias`` after it;
    ``meta["original_aten"]``, 2.1)."""
    return str(node.meta.get("original_aten")) == "aten.detach.default"


def no_grad_blocks(ep) -> dict:
    """A captured program's ``torch.no_grad()`` blocks: each ``higher_order.
    wrap_with_set_grad_enabled(False, submodule, ...)`` node by name, with its
    submodule's nodes (training IR, 2.5)."""
    return {n.name: list(getattr(ep.graph_module, n.args[1].target).graph.nodes)
            for n in ep.graph.nodes if n.op == "call_function"
            and "wrap_with_set_grad_enabled" in str(n.target) and n.args[0] is False}


def from_block(source, blocks: dict) -> bool:
    """Whether a provenance source (``made_from``) is one of ``blocks`` (``no_grad_blocks``;
    a source names a block's node and its higher-order op, 2.6)."""
    return (getattr(source, "name", None) in blocks
            and "wrap_with_set_grad_enabled" in str(getattr(source, "target", "")))
