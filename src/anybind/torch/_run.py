"""What running an op's node on torch tensors needs, below the derivatives (``_ad``) and
the front end (``_front``): dtypes, NumPy views, traced code on tensors, and the
dispatch of one node application (plain, recorded for autograd, or under
``torch.compile``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
import torch

from ..core._errors import HostError, MissingRuleError
from ..core._spec import Call
from . import _torch

# ----------------------------------------------------------------- dtypes

_TORCH_TO_NP = {t: np.dtype(n) for t, n in [
    (torch.float16, "float16"), (torch.float32, "float32"), (torch.float64, "float64"),
    (torch.complex64, "complex64"), (torch.complex128, "complex128"),
    (torch.int8, "int8"), (torch.int16, "int16"), (torch.int32, "int32"),
    (torch.int64, "int64"), (torch.uint8, "uint8"), (torch.bool, "bool")]}
_BF16 = np.dtype(jnp.bfloat16)  # ml_dtypes' bfloat16, which NumPy views as int16 bits
_TORCH_TO_NP[torch.bfloat16] = _BF16
_NP_TO_TORCH = {n: t for t, n in _TORCH_TO_NP.items()}


def _numpy(t: torch.Tensor) -> np.ndarray:
    """``t.numpy()``, bfloat16 included."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(a)``, bfloat16 included."""
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def np_dtype(op_name: str, t: torch.Tensor, what: str) -> np.dtype:
    try:
        return _TORCH_TO_NP[t.dtype]
    except KeyError:
        raise TypeError(f"anybind op '{op_name}': {what} has dtype {t.dtype}, which NumPy "
                        f"cannot view; supported: {sorted(str(d) for d in _TORCH_TO_NP)}"
                        ) from None


def torch_dtype(op_name: str, dtype) -> torch.dtype:
    try:
        return _NP_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"anybind op '{op_name}': dtype {np.dtype(dtype)} has no torch "
                        f"counterpart") from None


class _TorchXP:
    """The array namespace ``_ad`` makes zeros with, for rules run on torch tensors."""

    @staticmethod
    def zeros(shape, dtype):
        return torch.zeros(tuple(shape), dtype=_NP_TO_TORCH[np.dtype(dtype)])


TXP = _TorchXP()


class NotTorchCode(TypeError):
    """Traced code failed on torch tensors: it is JAX code (``jax.numpy``, ``lax``)."""


def traced(call: Call, name: str, run: Callable, ops) -> list:
    """``run(*ops)`` for a traced rule on torch tensors, with a clear error if it is JAX code."""
    try:
        return list(run(*ops))
    except (HostError, MissingRuleError, TypeError) as e:
        if isinstance(e, TypeError) and "anybind op" not in str(e):
            raise NotTorchCode(_traced_message(call, name, e)) from e
        raise
    except Exception as e:
        if "anybind op" in str(e):
            raise
        raise NotTorchCode(_traced_message(call, name, e)) from e


def _traced_message(call: Call, name: str, e: Exception) -> str:
    return (f"anybind op '{call.op.name}': the traced {name} failed on torch tensors under "
            f"op.torch ({type(e).__name__}: {e}). Traced rules that op.torch runs must use "
            f"plain array arithmetic and bound ops only (not jax.numpy), or be host code "
            f"(traced=False); a traced function written with jax.numpy runs by JAX "
            f"(ab.to_torch)")


def check_outputs(call: Call, name: str, outs, shapes, dtypes, names) -> None:
    """A traced rule's outputs against the expected shapes and dtypes."""
    for o, s, d, n in zip(outs, shapes, dtypes, names):
        if not isinstance(o, torch.Tensor):
            raise NotTorchCode(f"anybind op '{call.op.name}': under op.torch the traced {name} "
                            f"returned {type(o).__name__} for {n}; expected a torch tensor "
                            f"{d}{list(s)} (use plain array arithmetic and bound ops, not "
                            f"jax.numpy)")
        if tuple(o.shape) != tuple(s) or o.dtype != d:
            raise TypeError(f"anybind op '{call.op.name}': the {name} returned "
                            f"{o.dtype}{list(o.shape)} for {n}; expected {d}{list(s)}")


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


# sys.getrefcount of an array held by one local name and the list it came in, only
# (the call's own argument is the third reference)
_FRESH = 3


def _np_view(t: torch.Tensor) -> np.ndarray:
    """A read-only NumPy view of a CPU tensor (a copy only for other devices)."""
    if t.requires_grad:
        t = t.detach()
    try:  # refuses symbolic zeros, other devices, lazy conj/neg and bfloat16: below
        v = t.numpy()
    except (RuntimeError, TypeError):
        v = _np_view_slow(t)
    v.flags.writeable = False
    return v


def _np_view_slow(t: torch.Tensor) -> np.ndarray:
    if _torch.is_zerotensor(t):  # forward AD's symbolic zeros (a tangent nobody set) have no data
        return np.zeros(tuple(t.shape), _TORCH_TO_NP[t.dtype])
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return _numpy(t)


def vmapped(fn: Callable[..., list], mask: Sequence[bool], size: int) -> Callable[..., list]:
    """``fn`` on unbatched operands, lifted to operands in ``Batch`` layout (torch.vmap)."""
    in_dims = tuple(0 if m else None for m in mask)

    def run(*ops):
        squeezed = [o if m else o[0] for o, m in zip(ops, mask)]
        return list(torch.vmap(lambda *a: tuple(fn(*a)), in_dims=in_dims,
                               randomness="same")(*squeezed))
    return run


# ------------------------------------------------------- one application

def tracking(ops: Sequence[torch.Tensor]) -> bool:
    """Whether any transform or autograd would see this application."""
    if _torch.transforms_active() or _torch.dual_level() >= 0:
        return True
    if torch.is_grad_enabled():
        for t in ops:
            if t.requires_grad:
                return True
    return False


def apply(node, ops: Sequence[torch.Tensor]) -> list:
    """The node's outputs, recorded for autograd and torch.func where they look."""
    if not tracking(ops):
        return run_node(node, ops)
    return list(node.fn.apply(node, *ops))


def _symbolic(ops) -> bool:
    """Whether the tensors are fake ones (torch.compile tracing): no data to compute on."""
    for t in ops:
        if type(t) not in _PLAIN and _torch.is_fake(t):
            return True
    return False


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def run_node(node, ops: Sequence[torch.Tensor]) -> list:
    """The node's outputs without autograd: host code, or ``anybind::run`` when tracing."""
    if _symbolic(ops):
        return list(torch.ops.anybind.run(node.id, list(ops)))
    return node.run(ops)


