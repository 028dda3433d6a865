"""The PyTorch front end: ``op.torch``, an adapter over core (needs ``anybind[torch]``).

=============  ==================================================================
module         what it holds
=============  ==================================================================
``_front``     ``op.torch`` (``TorchOp``), the nodes that run an op's roles on
               torch tensors, and the ``torch.autograd.Function`` behind them
``_ad``        what a node's ``backward``, ``jvp`` and ``vmap`` compute
=============  ==================================================================

Importing this package registers the front end with core
(``core._frontends``): ``op.torch`` and bound ops called on torch tensors.
"""
from . import _ad, _front

_front.AD = _ad
