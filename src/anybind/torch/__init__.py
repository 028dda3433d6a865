"""The PyTorch front end: ``op.torch``, an adapter over core (needs ``anybind[torch]``).

=================  ==============================================================
module             what it holds
=================  ==============================================================
``_front``         ``op.torch`` (``TorchOp``), the nodes that run an op's roles on
                   torch tensors, and the ``torch.autograd.Function`` behind them
``_ad``            what a node's ``backward``, ``jvp`` and ``vmap`` compute
``_bridges``       ``ab.from_torch`` and ``ab.to_torch``: ops whose code is torch
                   code, torch operations whose code is JAX code
``_torch_engine``  how the bridges run torch code on NumPy views of XLA's buffers,
                   and torch's own jvp, vjp and vmap of it
``_jax_engine``    the same for JAX code on NumPy views of torch's tensors
=================  ==============================================================

Importing this package registers the front end with core
(``core._frontends``): ``op.torch`` and bound ops called on torch tensors.
"""
from . import _ad, _bridges, _front  # noqa: F401  (_front registers the front end)
