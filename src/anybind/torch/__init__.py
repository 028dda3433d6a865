"""The PyTorch front end: ``op.torch``, an adapter over core (needs ``anybind[torch]``).

Modules, bottom to top (each imports only those above it in this table):

=================  ==============================================================
module             what it holds
=================  ==============================================================
``_torch``         the one seam for torch's private APIs
``_guard``         torch's wrappers of NumPy memory copy host code's read-only inputs
``_run``           dtypes, NumPy views, traced code on tensors, one node application
``_ad``            what a node's ``backward``, ``jvp`` and ``vmap`` compute, and the
                   ``torch.autograd.Function`` that calls them
``_front``         ``op.torch`` (``TorchOp``) and the nodes that run an op's roles on
                   torch tensors; ``anybind::run`` under ``torch.compile``
``_effects``       what torch code may do besides computing: writes into its inputs,
                   random draws
``_trees``         a torch function's output as the matching JAX pytree
``_torch_engine``  how the bridges run torch code on NumPy views of XLA's buffers,
                   and torch's own jvp, vjp and vmap of it
``_jax_engine``    the same for JAX code on NumPy views of torch's tensors
``_bridges``       ``ab.from_torch`` and ``ab.to_torch``: ops whose code is torch
                   code, torch operations whose code is JAX code; ``op.torch``'s maker
=================  ==============================================================

Importing this package registers the front end with core
(``core._frontends``): ``op.torch`` and bound ops called on torch tensors.
"""
from . import _bridges, _guard  # noqa: F401  (they register the front end, and guard)
