"""Core ATen ops as ``jax.numpy``/``lax`` code, with torch's semantics.

One rule per op overload, registered right after it is written, all with one
signature: ``rule(node, *args, **kwargs)``, where ``args`` and ``kwargs`` are the
node's own (fx nodes replaced by JAX values; dtypes stay torch dtypes) and
``node`` is a ``Node`` that tells the output's dtype and shape as torch computed
them while capturing (``node.dtype``, ``node.shape``), and hands random ops
their key (``node.key()``).

=========================  ============================================================
torch semantics            how the rules keep them
=========================  ============================================================
dtype promotion            an elementwise op casts its array operands to the output
                           dtype torch recorded (``int32 + float32`` computes in
                           float32; Python scalars stay weak, as torch's do); every
                           result is cast to the recorded dtype
integer division           ``div`` is true division; ``rounding_mode`` ``"floor"`` and
                           ``"trunc"`` are ``floor_divide`` and ``lax.div``
reductions' dtypes         sums of integers and bools are int64; float16/bfloat16 sums,
                           means, norms and softmaxes accumulate in float32, as torch's
                           CPU kernels do
in-place ops, views        ``torch.export`` functionalizes the program: no op writes,
                           and a view is a value (``view``, ``permute``, ``slice``...)
matmul precision           ``Precision.HIGHEST``, torch's default for float32
random draws               from ``node.key()``, a JAX key derived from the op's ``key=``
=========================  ============================================================

``RULES`` maps each op's name (``"aten::add.Tensor"``) to its rule; ``SUPPORTS``
holds, for the few rules that cover part of an op, a predicate on the fx node.
``RANDOM`` names the ops that draw random numbers (``draws(node)``: whether a node
does). ``KEPT`` names the ops kept whole from torch's decomposition to the core op set,
for a rule of their own (recurrent layers: one ``lax.scan`` instead of a loop unrolled
over the sequence; the vector norm, whose derivative torch takes as 0 at a zero vector,
where the root in its decomposition has none).
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ._run import _TORCH_TO_NP

RULES: dict[str, Callable] = {}
KEPT = ("lstm.input", "gru.input", "rnn_tanh.input", "rnn_relu.input",
        "linalg_vector_norm.default")
SUPPORTS: dict[str, Callable] = {}
RANDOM: dict[str, Callable] = {}
HIGHEST = lax.Precision.HIGHEST


def rule(*names: str, supports: Callable | None = None, random: bool | Callable = False):
    """Register ``fn`` as the rule of each ``aten::`` op overload in ``names``;
    ``random``: its nodes draw (True), or a predicate on the fx node saying which do."""
    def register(fn):
        for n in names:
            full = n if "::" in n else f"aten::{n}"
            RULES[full] = fn
            if supports is not None:
                SUPPORTS[full] = supports
            if random:
                RANDOM[full] = random if callable(random) else lambda node: True
        return fn
    return register


def draws(node) -> bool:
    """Whether an fx node's rule draws random numbers (from ``node.key()``)."""
    drawing = RANDOM.get(name_of(node.target)) if node.op == "call_function" else None
    return drawing is not None and bool(drawing(node))


def np_dtype(d) -> np.dtype:
    """A torch dtype as NumPy's (bfloat16 as ml_dtypes'), canonical for JAX's x64 setting."""
    return jax.dtypes.canonicalize_dtype(_TORCH_TO_NP[d])


def _acc(d) -> np.dtype:
    """The dtype torch's CPU kernels accumulate ``d`` in: float32 for the half types."""
    d = np.dtype(d)
    return np.dtype(np.float32) if d.itemsize == 2 and jnp.issubdtype(d, jnp.floating) else d


def _is_array(v) -> bool:
    return isinstance(v, jax.Array | np.ndarray) or hasattr(v, "aval")


def _cast(v, d):
    return v.astype(d) if _is_array(v) and v.dtype != d else v


def _dims(dim, ndim: int) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted(d % max(ndim, 1) for d in dim))


# ------------------------------------------------------------------ elementwise

def _reads(n) -> set:
    """Which outputs of a multi-output fx node the graph reads (``getitem`` indices)."""
    return {u.args[1] if u.target is operator.getitem else None for u in n.users}


def _only_first_output(n) -> bool:
    return _reads(n) <= {0}


def _elementwise(fn: Callable, compute: str = "out") -> Callable:
    """A rule computing ``fn`` on operands cast to the output's dtype (``compute="out"``),
    or to their promoted dtype under torch's rules (``"promote"``: comparisons). A complex
    operand of a real result (``abs``, ``angle``) stays complex."""
    def run(node, *args, **kw):
        d = _acc(node.dtype) if compute == "out" else node.promoted
        real = not jnp.issubdtype(d, jnp.complexfloating)
        return fn(*(a if real and _is_array(a) and jnp.iscomplexobj(a) else _cast(a, d)
                    for a in args), **kw)
    return run


def _binary(fn):
    return _elementwise(lambda x, y, alpha=1: fn(x, y if alpha == 1 else y * alpha))


for _names, _fn in [
    (("add.Tensor", "add.Scalar"), operator.add),
    (("sub.Tensor", "sub.Scalar"), operator.sub),
    (("mul.Tensor", "mul.Scalar"), operator.mul),
    (("div.Tensor", "div.Scalar"), operator.truediv),
    (("maximum.default",), jnp.maximum),
    (("minimum.default",), jnp.minimum),
    (("fmod.Tensor", "fmod.Scalar"), jnp.fmod),
    (("remainder.Tensor", "remainder.Scalar"), jnp.remainder),
    (("atan2.default",), jnp.arctan2),
    (("hypot.default",), jnp.hypot),
    (("copysign.Tensor",), jnp.copysign),
    (("bitwise_and.Tensor", "bitwise_and.Scalar", "__and__.Tensor", "__and__.Scalar"),
     jnp.bitwise_and),
    (("bitwise_or.Tensor", "bitwise_or.Scalar", "__or__.Tensor", "__or__.Scalar"),
     jnp.bitwise_or),
    (("bitwise_xor.Tensor", "bitwise_xor.Scalar", "__xor__.Tensor", "__xor__.Scalar"),
     jnp.bitwise_xor),
    # a shift by the width or more, or by a negative count: 0, or the sign (XLA's, torch's)
    (("__lshift__.Tensor", "__lshift__.Scalar", "bitwise_left_shift.Tensor",
      "bitwise_left_shift.Tensor_Scalar"), jnp.left_shift),
    (("__rshift__.Tensor", "__rshift__.Scalar", "bitwise_right_shift.Tensor",
      "bitwise_right_shift.Tensor_Scalar"), jnp.right_shift),
    (("pow.Tensor_Tensor", "pow.Tensor_Scalar"), jnp.power),
    (("fmax.default",), jnp.fmax), (("fmin.default",), jnp.fmin),
    (("nextafter.default",), jnp.nextafter),
    (("igamma.default",), jax.scipy.special.gammainc),
    (("igammac.default",), jax.scipy.special.gammaincc),
]:
    rule(*_names)(_binary(_fn))


@rule("rsub.Scalar", "rsub.Tensor")
def _rsub(node, x, y, alpha=1):
    d = _acc(node.dtype)
    return _cast(y, d) - _cast(x, d) * alpha


@rule("pow.Scalar")
def _pow_scalar(node, base, x):
    return jnp.power(jnp.asarray(base, _acc(node.dtype)), _cast(x, _acc(node.dtype)))


@rule("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(node, x, y, rounding_mode=None):
    d = _acc(node.dtype)
    x, y = _cast(jnp.asarray(x), d), _cast(jnp.asarray(y), d)
    if rounding_mode is None:
        return x / y
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    if jnp.issubdtype(d, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(x, y))
    return jnp.trunc(x / y)


for _names, _fn in [
    (("eq.Tensor", "eq.Scalar"), operator.eq), (("ne.Tensor", "ne.Scalar"), operator.ne),
    (("lt.Tensor", "lt.Scalar"), operator.lt), (("le.Tensor", "le.Scalar"), operator.le),
    (("gt.Tensor", "gt.Scalar"), operator.gt), (("ge.Tensor", "ge.Scalar"), operator.ge),
    (("logical_and.default",), jnp.logical_and), (("logical_or.default",), jnp.logical_or),
    (("logical_xor.default",), jnp.logical_xor),
]:
    rule(*_names)(_elementwise(_fn, compute="promote"))

def _sign(x):
    """torch's sign: 0 for NaN (a complex NaN's ``sgn`` stays NaN)."""
    return jnp.sign(x) if jnp.iscomplexobj(x) else jnp.where(jnp.isnan(x), 0, jnp.sign(x))


for _name, _fn in [
    ("abs", jnp.abs), ("neg", jnp.negative), ("exp", jnp.exp), ("exp2", jnp.exp2),
    ("expm1", jnp.expm1), ("log", jnp.log), ("log1p", jnp.log1p), ("log2", jnp.log2),
    ("log10", jnp.log10), ("sqrt", jnp.sqrt), ("rsqrt", lax.rsqrt), ("sin", jnp.sin),
    ("cos", jnp.cos), ("tan", jnp.tan), ("asin", jnp.arcsin), ("acos", jnp.arccos),
    ("atan", jnp.arctan), ("sinh", jnp.sinh), ("cosh", jnp.cosh), ("tanh", jnp.tanh),
    ("asinh", jnp.arcsinh), ("acosh", jnp.arccosh), ("atanh", jnp.arctanh),
    ("erf", jax.scipy.special.erf), ("erfc", jax.scipy.special.erfc),
    ("erfinv", jax.scipy.special.erfinv), ("floor", jnp.floor), ("ceil", jnp.ceil),
    ("trunc", jnp.trunc), ("sign", _sign), ("reciprocal", jnp.reciprocal),
    ("sigmoid", jax.nn.sigmoid), ("relu", jax.nn.relu), ("bitwise_not", jnp.invert),
    ("lgamma", jax.scipy.special.gammaln), ("digamma", jax.scipy.special.digamma),
    ("sgn", _sign), ("angle", jnp.angle), ("i0", jax.scipy.special.i0),
    ("special_i0e", jax.scipy.special.i0e), ("special_i1", jax.scipy.special.i1),
    ("special_i1e", jax.scipy.special.i1e), ("special_ndtri", jax.scipy.special.ndtri),
]:
    rule(f"{_name}.default")(_elementwise(_fn))
if jax.__version_info__ >= (0, 12):  # 0.11's erfcx gives 0 on a band of large x (jax#38607)
    rule("special_erfcx.default")(_elementwise(jax.scipy.special.erfcx))

@rule("frexp.Tensor")
def _frexp(node, x):
    return jnp.frexp(_cast(x, _acc(node.dtype)))


for _name, _fn in [("logical_not", jnp.logical_not), ("isnan", jnp.isnan),
                   ("isinf", jnp.isinf), ("isfinite", jnp.isfinite), ("signbit", jnp.signbit)]:
    rule(f"{_name}.default")(_elementwise(_fn, compute="promote"))


@rule("round.default")
def _round(node, x):
    return jnp.round(x)  # half to even, as torch.round


@rule("round.decimals")
def _round_decimals(node, x, decimals=0):
    return jnp.round(x, decimals)


@rule("gelu.default")
def _gelu(node, x, approximate="none"):
    x = _cast(x, _acc(node.dtype))
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@rule("silu.default")
def _silu(node, x):
    return jax.nn.silu(_cast(x, _acc(node.dtype)))


def _clip(x, low=None, high=None, closed=False):
    """``x`` clipped to its bounds, NaN kept; its derivative at a bound is 0 (``jnp.clip``'s
    is 1/2), or 1 where ``closed``."""
    if low is not None:
        x = jnp.where(x < low if closed else x <= low, _cast(low, x.dtype), x)
    if high is not None:
        x = jnp.where(x > high if closed else x >= high, _cast(high, x.dtype), x)
    return x


@functools.cache
def _clamp_ties() -> tuple[float, float]:
    """The derivative torch's ``clamp`` gives ``x`` at a number bound and at a tensor bound:
    1 and 1 in torch 2.13, 0 and 1/2 in 2.15 (pytorch/pytorch#191142), read from the torch
    installed."""
    x = torch.zeros((), dtype=torch.float64, requires_grad=True)
    number = torch.autograd.grad(torch.clamp(x, min=0.0), x)[0]
    tensor = torch.autograd.grad(torch.clamp(x, min=torch.zeros((), dtype=x.dtype)), x)[0]
    return float(number), float(tensor)


@rule("hardtanh.default")
def _hardtanh(node, x, min_val=-1.0, max_val=1.0):
    return _clip(x, min_val, max_val)


@rule("leaky_relu.default")
def _leaky_relu(node, x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


def _training(n) -> bool:
    return bool(n.args[4] if len(n.args) > 4 else n.kwargs.get("training", False))


@rule("rrelu_with_noise_functional.default", random=_training)
def _rrelu(node, x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Eval: a leaky ReLU of the mean slope. Train: each element at or below 0 scaled by a
    slope drawn from U(lower, upper), which ``noise`` returns (1 elsewhere)."""
    if not training:
        return jnp.where(x > 0, x, x * ((lower + upper) / 2)), noise
    slope = jax.random.uniform(node.key(), x.shape, _acc(x.dtype), lower, upper)
    low = x <= 0
    return jnp.where(low, x * slope, x), jnp.where(low, slope, 1)


@rule("elu.default")
def _elu(node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    x = _cast(x, _acc(node.dtype))
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@rule("softplus.default")
def _softplus(node, x, beta=1.0, threshold=20.0):
    x = _cast(x, _acc(node.dtype))
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.logaddexp(bx, 0.0) / beta)


@rule("clamp.default", "clamp.Tensor")
def _clamp(node, x, min=None, max=None):  # noqa: A002  (torch's names)
    d = _acc(node.dtype)
    x = _cast(x, d)
    number, tensor = _clamp_ties()
    if not (_is_array(min) or _is_array(max)):
        return _clip(x, min, max, closed=number == 1)
    if tensor == 1:  # ties: all to x
        return _clip(x, min, max, closed=True)
    if min is not None:  # ties shared, as jnp.maximum shares them
        x = jnp.maximum(x, _cast(min, d))
    if max is not None:
        x = jnp.minimum(x, _cast(max, d))
    return x


@rule("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(node, cond, x, y):
    d = node.dtype
    return jnp.where(cond, _cast(x, d), _cast(y, d))


@rule("lerp.Scalar", "lerp.Tensor")
def _lerp(node, x, end, weight):
    d = _acc(node.dtype)
    x, end = _cast(x, d), _cast(end, d)
    return x + _cast(weight, d) * (end - x)


@rule("_to_copy.default")
def _to_copy(node, x, **kw):
    return _cast(x, node.dtype)


@rule("clone.default", "alias.default", "lift_fresh_copy.default", "detach.default",
      "contiguous.default", "resolve_conj.default", "resolve_neg.default")
def _identity(node, x, **kw):
    return x


@rule("copy.default")
def _copy(node, x, src, non_blocking=False):
    return jnp.broadcast_to(_cast(src, node.dtype), node.shape)


# ------------------------------------------------------------------- creation

@rule("full.default")
def _full(node, size, fill_value, **kw):
    return jnp.full(node.shape, fill_value, node.dtype)


@rule("full_like.default")
def _full_like(node, x, fill_value, **kw):
    return jnp.full(node.shape, fill_value, node.dtype)


@rule("zeros.default", "zeros_like.default", "empty.memory_format", "empty_like.default",
      "empty_strided.default", "empty_permuted.default", "new_zeros.default",
      "new_empty.default", "new_empty_strided.default")
def _zeros(node, *args, **kw):
    return jnp.zeros(node.shape, node.dtype)  # empty memory: zeros, a value like any


@rule("ones.default", "ones_like.default", "new_ones.default")
def _ones(node, *args, **kw):
    return jnp.ones(node.shape, node.dtype)


@rule("new_full.default")
def _new_full(node, x, size, fill_value, **kw):
    return jnp.full(node.shape, fill_value, node.dtype)


@rule("scalar_tensor.default")
def _scalar_tensor(node, s, **kw):
    return jnp.asarray(s, node.dtype)


@rule("arange.default", "arange.start", "arange.start_step")
def _arange(node, *args, **kw):
    start, end, step = {1: (0, args[0] if args else 0, 1), 2: (*args, 1),
                        3: args}[max(len(args), 1)]
    if node.shape[0] == 0:
        return jnp.zeros((0,), node.dtype)
    return (start + step * jnp.arange(node.shape[0], dtype=_acc(node.dtype))).astype(node.dtype)


@rule("eye.default", "eye.m")
def _eye(node, n, m=None, **kw):
    return jnp.eye(*node.shape, dtype=node.dtype)


# ------------------------------------------------------------------ random draws

@rule("rand.default", "rand_like.default", random=True)
def _rand(node, *args, **kw):
    return jax.random.uniform(node.key(), node.shape, _acc(node.dtype))


@rule("randn.default", "randn_like.default", random=True)
def _randn(node, *args, **kw):
    return jax.random.normal(node.key(), node.shape, _acc(node.dtype))


@rule("bernoulli.default", random=True)
def _bernoulli(node, p, **kw):
    return jax.random.uniform(node.key(), node.shape, _acc(p.dtype)) < p


@rule("bernoulli.p", random=True)
def _bernoulli_p(node, x, p=0.5, **kw):
    return jax.random.bernoulli(node.key(), p, node.shape)


def _dropout(key, x, p):
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype)), keep


@rule("native_dropout.default", random=True)
def _native_dropout(node, x, p, train):
    if not train or p == 0:
        return x, jnp.ones(x.shape, bool)
    return _dropout(node.key(), x, p)


@rule("randint.default", "randint.low", random=True)
def _randint(node, *args, **kw):
    low, high = (0, args[0]) if len(args) == 2 else args[:2]
    return jax.random.randint(node.key(), node.shape, low, high, node.dtype)


@rule("randint_like.default", "randint_like.Tensor", "randint_like.low_dtype", random=True)
def _randint_like(node, x, *bounds, **kw):
    low, high = (0, *bounds) if len(bounds) == 1 else bounds
    d = node.dtype if jnp.issubdtype(node.dtype, jnp.integer) else np.dtype(np.int64)
    return jax.random.randint(node.key(), node.shape, low, high, jax.dtypes.canonicalize_dtype(d))


# The functional forms of the in-place fills (``x.uniform_()``, ``x.normal_()``, ...) that
# torch.distributions' samplers use: a draw of the filled tensor's shape, no derivative.
@rule("uniform.default", random=True)
def _uniform(node, x, low=0.0, high=1.0, **kw):
    return jax.random.uniform(node.key(), node.shape, _acc(node.dtype), low, high)


@rule("normal_functional.default", random=True)
def _normal_fill(node, x, mean=0.0, std=1.0, **kw):
    return mean + std * jax.random.normal(node.key(), node.shape, _acc(node.dtype))


@rule("exponential.default", random=True)
def _exponential(node, x, lambd=1.0, **kw):
    return jax.random.exponential(node.key(), node.shape, _acc(node.dtype)) / lambd


@rule("cauchy.default", random=True)
def _cauchy(node, x, median=0.0, sigma=1.0, **kw):
    return median + sigma * jax.random.cauchy(node.key(), node.shape, _acc(node.dtype))


@rule("log_normal.default", random=True)
def _log_normal(node, x, mean=1.0, std=2.0, **kw):
    return jnp.exp(mean + std * jax.random.normal(node.key(), node.shape, _acc(node.dtype)))


@rule("geometric.default", random=True)
def _geometric(node, x, p, **kw):  # the trials up to the first success: 1, 2, ...
    return jax.random.geometric(node.key(), p, node.shape)


@rule("normal.Tensor_Tensor", "normal.Tensor_float", "normal.float_Tensor",
      "normal.float_float", random=True)
def _normal(node, mean, std=1.0, *size, **kw):  # torch.normal has no derivative
    eps = jax.random.normal(node.key(), node.shape, _acc(node.dtype))
    return lax.stop_gradient(mean + std * eps)


@rule("_standard_gamma.default", random=True)
def _standard_gamma(node, alpha, **kw):
    """Gamma(alpha, 1) draws, differentiated in ``alpha`` implicitly through the CDF, the
    reparameterization torch's derivative of them computes."""
    return jax.random.gamma(node.key(), _cast(alpha, _acc(node.dtype)), node.shape)


@rule("_sample_dirichlet.default", random=True)
def _sample_dirichlet(node, alpha, **kw):
    """Dirichlet draws as normalized Gamma draws, differentiated through them: an unbiased
    reparameterization gradient, as torch's own is, but not the same one draw by draw."""
    return jax.random.dirichlet(node.key(), _cast(alpha, _acc(node.dtype)), node.shape[:-1])


@rule("poisson.default", random=True)
def _poisson(node, rate, **kw):
    return jax.random.poisson(node.key(), lax.stop_gradient(rate), node.shape)


@rule("binomial.default", random=True)
def _binomial(node, count, prob, **kw):
    n, p = (lax.stop_gradient(_cast(v, _acc(node.dtype))) for v in (count, prob))
    return jax.random.binomial(node.key(), n, p, node.shape, _acc(node.dtype))


@rule("multinomial.default", random=True)
def _multinomial(node, probs, num_samples, replacement=False, **kw):
    """``num_samples`` category indices per row of (unnormalized) ``probs``: independent
    draws, or, without replacement, the top ones of log-probabilities plus Gumbel noise
    (the order in which a weighted draw without replacement picks them)."""
    logp = jnp.log(lax.stop_gradient(_cast(probs, _acc(probs.dtype))))
    if replacement:
        return jax.random.categorical(node.key(), logp[..., None, :], shape=node.shape)
    return lax.top_k(logp + jax.random.gumbel(node.key(), logp.shape, logp.dtype),
                     num_samples)[1]


# ----------------------------------------------------------------------- views

@rule("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(node, x, size):
    return jnp.reshape(x, node.shape)


@rule("permute.default")
def _permute(node, x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@rule("t.default")
def _t(node, x):
    return x.T


@rule("transpose.int")
def _transpose(node, x, a, b):
    return jnp.swapaxes(x, a, b) if x.ndim else x


@rule("expand.default", "expand_copy.default")
def _expand(node, x, size, implicit=False):
    return jnp.broadcast_to(x, node.shape)


@rule("unsqueeze.default")
def _unsqueeze(node, x, dim):
    return jnp.reshape(x, node.shape)


@rule("squeeze.dims", "squeeze.dim", "squeeze.default")
def _squeeze(node, x, *dims):
    return jnp.reshape(x, node.shape)


@rule("slice.Tensor", "slice_copy.Tensor")
def _slice(node, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    start, end, step = slice(start, end, step).indices(x.shape[dim])
    if end <= start:
        return jnp.zeros(node.shape, x.dtype)
    return lax.slice_in_dim(x, start, end, step, axis=dim)


@rule("select.int", "select_copy.int")
def _select(node, x, dim, index):
    dim = dim % x.ndim
    return lax.index_in_dim(x, index % x.shape[dim], dim, keepdims=False)


@rule("split_with_sizes.default", "split.Tensor", "unsafe_split.Tensor",
      "split_with_sizes_copy.default", "split_copy.Tensor")
def _split(node, x, sizes, dim=0):
    dim = dim % x.ndim
    ends = np.cumsum([s[dim] for s in node.shape])[:-1]
    return tuple(jnp.split(x, [int(e) for e in ends], axis=dim))


@rule("unbind.int")
def _unbind(node, x, dim=0):
    dim = dim % x.ndim
    return tuple(lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim]))


@rule("cat.default")
def _cat(node, xs, dim=0):
    d = node.dtype
    xs = [_cast(x, d) for x in xs if not (x.ndim == 1 and x.shape[0] == 0)]  # torch's legacy
    return jnp.concatenate(xs, axis=dim % len(node.shape)) if xs else jnp.zeros(node.shape, d)


@rule("stack.default")
def _stack(node, xs, dim=0):
    return jnp.stack([_cast(x, node.dtype) for x in xs], axis=dim % len(node.shape))


@rule("flip.default")
def _flip(node, x, dims):
    return jnp.flip(x, [d % x.ndim for d in dims]) if x.ndim else x


@rule("roll.default")
def _roll(node, x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(dims))


@rule("constant_pad_nd.default")
def _pad(node, x, pad, value=0):
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


@rule("tril.default")
def _tril(node, x, diagonal=0):
    return jnp.tril(x, diagonal)


@rule("triu.default")
def _triu(node, x, diagonal=0):
    return jnp.triu(x, diagonal)


@rule("unfold.default")
def _unfold(node, x, dim, size, step):
    """``x.unfold(dim, size, step)``: the windows along ``dim``, each a new last axis."""
    if x.ndim == 0:
        return x.reshape(1)
    dim = dim % x.ndim
    starts = np.arange((x.shape[dim] - size) // step + 1) * step
    windows = jnp.take(x, starts[:, None] + np.arange(size), axis=dim)
    return jnp.moveaxis(windows, dim + 1, -1)


def _contiguous_base(node) -> bool:
    """The input is laid out as its JAX array is, and the view stays inside it (a view of
    a larger tensor can reach past its own end, into memory the array does not have)."""
    base = node.args[0].meta.get("val")
    size, stride = node.args[1], node.args[2]
    offset = node.args[3] if len(node.args) > 3 and node.args[3] is not None else 0
    reach = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    return (isinstance(base, torch.Tensor) and base.is_contiguous()
            and base.storage_offset() == 0 and (0 in size or reach < base.numel()))


LAYOUT = ("aten::as_strided.default", "aten::as_strided_copy.default")


@rule(*LAYOUT, supports=_contiguous_base)
def _as_strided(node, x, size, stride, storage_offset=None):
    idx = (storage_offset or 0) + sum(
        np.arange(n).reshape([-1 if i == j else 1 for j in range(len(size))]) * s
        for i, (n, s) in enumerate(zip(size, stride)))
    return jnp.reshape(x, -1)[np.asarray(idx, np.int64).reshape(tuple(size))]


@rule("slice_scatter.default")
def _slice_scatter(node, x, src, dim=0, start=None, end=None, step=1):
    dim = dim % x.ndim
    start, end, step = slice(start, end, step).indices(x.shape[dim])
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x.at[tuple(idx)].set(_cast(src, x.dtype))


@rule("diagonal_scatter.default")
def _diagonal_scatter(node, x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
    n = src.shape[-1]
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    moved = moved.at[..., rows, cols].set(_cast(src, x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@rule("select_scatter.default")
def _select_scatter(node, x, src, dim, index):
    idx = [slice(None)] * x.ndim
    idx[dim % x.ndim] = index
    return x.at[tuple(idx)].set(_cast(src, x.dtype))


@rule("view_as_real.default")
def _view_as_real(node, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@rule("view_as_complex.default")
def _view_as_complex(node, x):
    return lax.complex(x[..., 0], x[..., 1])


@rule("_conj.default", "conj_physical.default", "_conj_physical.default")
def _conj(node, x):
    return jnp.conj(x)


@rule("polar.default")
def _polar(node, magnitude, angle):
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@rule("_assert_tensor_metadata.default", "_assert_scalar.default",
      "sym_constrain_range_for_size.default")
def _assert(node, *args, **kw):
    return None  # checks torch made while capturing, on shapes and dtypes that are fixed


@rule("diagonal.default")
def _diagonal(node, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@rule("fill.Scalar", "fill.Tensor")
def _fill(node, x, value):
    return jnp.broadcast_to(_cast(jnp.asarray(value), node.dtype), node.shape)


@rule("repeat.default")
def _repeat(node, x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


def _pad_mode(mode):
    def run(node, x, padding):
        n = len(padding) // 2
        cfg = [(0, 0)] * (x.ndim - n) + [(padding[2 * (n - 1 - i)], padding[2 * (n - 1 - i) + 1])
                                         for i in range(n)]
        return jnp.pad(x, cfg, mode=mode)
    return run


rule("reflection_pad1d.default", "reflection_pad2d.default",
     "reflection_pad3d.default")(_pad_mode("reflect"))
rule("replication_pad1d.default", "replication_pad2d.default",
     "replication_pad3d.default")(_pad_mode("edge"))


@rule("sym_size.int")
def _sym_size(node, x, dim):
    return x.shape[dim]


@rule("sym_numel.default")
def _sym_numel(node, x):
    return x.size


def _nearest_index(n_in, n_out, scale):
    s = n_in / n_out if scale is None else 1.0 / scale
    return np.minimum(np.floor(np.arange(n_out) * s).astype(np.int64), n_in - 1)


@rule("upsample_nearest2d.vec", "upsample_nearest1d.vec", "upsample_nearest3d.vec")
def _upsample_nearest(node, x, output_size, scale_factors):
    nsp = len(node.shape) - 2
    for i in range(nsp):
        ax = 2 + i
        sc = None if output_size is not None or scale_factors is None else scale_factors[i]
        x = jnp.take(x, _nearest_index(x.shape[ax], node.shape[ax], sc), axis=ax)
    return x


@rule("upsample_nearest2d.default")
def _upsample_nearest2d(node, x, output_size, scales_h=None, scales_w=None):
    scales = None if scales_h is None and scales_w is None else [scales_h, scales_w]
    return _upsample_nearest(node, x, output_size if scales is None else None, scales)


@rule("upsample_bilinear2d.vec", "upsample_linear1d.vec")
def _upsample_linear(node, x, output_size, align_corners, scale_factors):
    d = _acc(node.dtype)
    x = _cast(x, d)
    nsp = len(node.shape) - 2
    for i in range(nsp):
        ax, n_in, n_out = 2 + i, x.shape[2 + i], node.shape[2 + i]
        if align_corners:
            src = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        else:
            sc = (n_in / n_out if output_size is not None or scale_factors is None
                  else 1.0 / scale_factors[i])
            src = np.maximum((np.arange(n_out) + 0.5) * sc - 0.5, 0.0)
        lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        hi = np.minimum(lo + 1, n_in - 1)
        w = (src - lo).astype(d).reshape((-1,) + (1,) * (x.ndim - ax - 1))
        x = jnp.take(x, lo, axis=ax) * (1 - w) + jnp.take(x, hi, axis=ax) * w
    return x


def _reflect(i, twice_low: int, twice_high: int):
    """Coordinates reflected off the bounds (given doubled) until they fall between them."""
    if twice_low == twice_high:
        return jnp.zeros_like(i)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = jnp.abs(i - low)
    extra = jnp.fmod(d, span)
    even = jnp.floor(d / span) % 2 == 0
    return jnp.where(even, extra + low, span + low - extra)


@rule("grid_sampler_3d.default")
def _grid_sampler_3d(node, a, grid, interpolation_mode, padding_mode, align_corners):
    """torch's decomposition of ``grid_sampler_2d`` in three dims: trilinear (0) or nearest
    (1, rounding half to even); padding by zeros (0), the border (1) or reflection (2)."""
    d = _acc(node.dtype)
    a, grid = _cast(a, d), _cast(grid, d)
    size = a.shape[2:]  # D, H, W; the grid's last axis holds (x, y, z): W, H, D

    def source(g, s):
        i = g * (s * 0.5 - 0.5 if align_corners else s * 0.5) + (s * 0.5 - 0.5)
        if padding_mode == 2:
            i = _reflect(i, 0, 2 * (s - 1)) if align_corners else _reflect(i, -1, 2 * s - 1)
        return jnp.clip(i, 0, s - 1) if padding_mode else i
    at = [source(grid[..., 2 - k], s) for k, s in enumerate(size)]
    batch = jnp.arange(a.shape[0]).reshape(-1, 1, 1, 1)

    def corner(ks, w):  # the input at integer coordinates ks, weighted; zero outside
        inside = functools.reduce(jnp.logical_and, [(k >= 0) & (k < s) for k, s in zip(ks, size)])
        ks = [jnp.where(inside, k, 0).astype(jnp.int32) for k in ks]
        return a[batch, :, ks[0], ks[1], ks[2]] * jnp.where(inside, w, 0)[..., None]

    if interpolation_mode == 1:
        out = corner([jnp.round(i) for i in at], jnp.ones_like(at[0]))
    else:
        low = [jnp.floor(i) for i in at]
        out = sum(corner([lo + b for lo, b in zip(low, bits)],
                         functools.reduce(operator.mul, [i - lo if b else lo + 1 - i
                                                         for i, lo, b in zip(at, low, bits)]))
                  for bits in itertools.product((0, 1), repeat=3))
    return jnp.moveaxis(out, -1, 1)  # (N, oD, oH, oW, C) -> (N, C, oD, oH, oW)


def _root(s, p):
    """``s ** (1 / p)`` with the derivative 0 where ``s`` is 0, where torch's norms and
    distances mask theirs (the root's own is infinite there)."""
    zero = s == 0
    r = jnp.where(zero, 1, s)
    return jnp.where(zero, 0, jnp.sqrt(r) if p == 2 else r ** (1.0 / p))


def _p_norm(diff, p, axis, keepdims=False):
    """The p-norm of real ``diff`` ≥ 0 along ``axis``, differentiated as torch's."""
    if p == float("inf"):
        return jnp.max(diff, axis, keepdims=keepdims)
    if p == -float("inf"):
        return jnp.min(diff, axis, keepdims=keepdims)
    if p == 0:
        return jnp.sum(diff != 0, axis, keepdims=keepdims).astype(diff.dtype)
    if p == 1:
        return jnp.sum(diff, axis, keepdims=keepdims)
    return _root(jnp.sum(diff * diff if p == 2 else diff ** p, axis, keepdims=keepdims), p)


@rule("_cdist_forward.default")
def _cdist(node, a, b, p, compute_mode=None):
    return _p_norm(jnp.abs(a[..., :, None, :] - b[..., None, :, :]), p, -1)


@rule("_pdist_forward.default")
def _pdist(node, a, p=2.0):
    i, j = np.triu_indices(a.shape[0], 1)
    return _p_norm(jnp.abs(a[i] - a[j]), p, -1)


@rule("linalg_vector_norm.default")
def _vector_norm(node, x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    axes, d = _dims(dim, x.ndim), _acc(node.dtype)
    if jnp.iscomplexobj(x) and ord == 2:  # |x|², with no root of 0 on the way
        return _root(jnp.sum(jnp.real(x * x.conj()), axes, keepdims=keepdim).astype(d), 2)
    return _p_norm(jnp.abs(x).astype(d), ord, axes, keepdim)


@rule("masked_scatter.default")
def _masked_scatter(node, x, mask, src):
    mask = jnp.broadcast_to(mask, node.shape).reshape(-1)
    pos = jnp.clip(jnp.cumsum(mask) - 1, 0, max(src.size - 1, 0))
    return jnp.where(mask, src.reshape(-1)[pos].astype(x.dtype),
                     jnp.broadcast_to(x, node.shape).reshape(-1)).reshape(node.shape)


@rule("randperm.default", random=True)
def _randperm(node, n, **kw):
    return jax.random.permutation(node.key(), n).astype(node.dtype)


# -------------------------------------------------------------------- indexing

@rule("index.Tensor")
def _index(node, x, indices):
    return x[tuple(slice(None) if i is None else i for i in indices)]


def _put_shapes(n) -> bool:
    """An ``index_put`` by integer indices, or by one boolean mask where the values do not
    count its elements (one value for all, or one per trailing element): ``x[m] = 0``."""
    vals = [i.meta.get("val") if isinstance(i, torch.fx.Node) else None for i in n.args[1]]
    given = [p for p, v in enumerate(vals) if v is not None]
    if all(vals[p].dtype != torch.bool for p in given):
        return True
    if len(given) != 1:
        return False
    x, values, mask = n.args[0].meta["val"], n.args[2].meta["val"], vals[given[0]]
    return values.numel() == 1 or values.ndim <= x.ndim - given[0] - mask.ndim


@rule("index_put.default", supports=_put_shapes)
def _index_put(node, x, indices, values, accumulate=False):
    values = _cast(values, x.dtype)
    p, m = next((p, m) for p, m in enumerate(indices) if m is not None)
    if m.dtype == bool:  # the one mask, at dim p: a where over x, the values broadcast
        m = m.reshape((1,) * p + m.shape + (1,) * (x.ndim - p - m.ndim))
        v = jnp.broadcast_to(values.reshape(()) if values.size == 1 else values, x.shape)
        return jnp.where(m, x + v if accumulate else v, x)
    at = x.at[tuple(slice(None) if i is None else i for i in indices)]
    return at.add(values) if accumulate else at.set(values)


@rule("searchsorted.Tensor", "searchsorted.Scalar")
def _searchsorted(node, sorted_sequence, x, *, out_int32=False, right=False, side=None,
                  sorter=None):
    """Along the last dim of ``sorted_sequence``, one row per leading index of ``x``."""
    side = side or ("right" if right else "left")
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    x = jnp.asarray(x, seq.dtype)
    if seq.ndim == 1:
        return jnp.searchsorted(seq, x, side=side)
    rows = seq.reshape(-1, seq.shape[-1])
    found = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(
        rows, x.reshape(rows.shape[0], -1))
    return found.reshape(x.shape)


@rule("bucketize.Tensor", "bucketize.Scalar")
def _bucketize(node, x, boundaries, *, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, jnp.asarray(x, boundaries.dtype),
                            side="right" if right else "left")


@rule("index_select.default")
def _index_select(node, x, dim, index):
    return jnp.take(x, index, axis=dim % max(x.ndim, 1)) if x.ndim else x


def _along(x, dim, index):
    """``x`` cut to ``index``'s extent in every axis but ``dim`` (torch allows a smaller index)."""
    return x[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index.shape))]


def _axis_ix(index, dim):
    """Open-mesh indices with ``index`` along ``dim``: ``x[...]`` of them is torch.gather."""
    grids = list(jnp.ix_(*[jnp.arange(n) for n in index.shape])) if index.ndim else []
    grids[dim] = index
    return tuple(grids)


@rule("gather.default")
def _gather(node, x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return x
    dim = dim % x.ndim
    return _along(x, dim, index)[_axis_ix(index, dim)] if index.size else jnp.zeros(
        node.shape, x.dtype)


@rule("scatter.src", "scatter.value")
def _scatter(node, x, dim, index, src):
    dim = dim % max(x.ndim, 1)
    src = jnp.asarray(src, x.dtype)
    if src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    return x.at[_axis_ix(index, dim)].set(jnp.broadcast_to(src, index.shape))


@rule("scatter_add.default")
def _scatter_add(node, x, dim, index, src):
    dim = dim % max(x.ndim, 1)
    src = src[tuple(slice(0, n) for n in index.shape)]
    return x.at[_axis_ix(index, dim)].add(_cast(src, x.dtype))


_SCATTER_REDUCE = {"sum": "add", "amax": "max", "amin": "min", "mean": "add"}


def _scatter_prod(x, at, src):
    """``x.at[at].multiply(src)`` as running products over ``src`` sorted by where each
    element lands: plain products, differentiable to every order, where JAX differentiates
    a scatter's product only for unique indices."""
    if src.size == 0:
        return x
    strides = np.cumprod((*x.shape[1:], 1)[::-1])[::-1]
    flat = sum(jnp.broadcast_to(i, src.shape) * int(s) for i, s in zip(at, strides, strict=True))
    order = jnp.argsort(flat.reshape(-1), stable=True)
    keys, vals = flat.reshape(-1)[order], src.reshape(-1)[order]
    new = keys[1:] != keys[:-1]

    def product(a, b):  # a segmented product: a run restarts where b starts one
        return jnp.where(b[1], b[0], a[0] * b[0]), a[1] | b[1]
    run, _ = lax.associative_scan(product, (vals, jnp.concatenate([jnp.ones(1, bool), new])))
    ends = jnp.where(jnp.concatenate([new, jnp.ones(1, bool)]), keys, x.size)  # a run's last
    prods = jnp.ones(x.size, x.dtype).at[ends].set(run, mode="drop")
    return x * prods.reshape(x.shape)


@rule("scatter_reduce.two")
def _scatter_reduce(node, x, dim, index, src, reduce, *, include_self=True):
    dim = dim % max(x.ndim, 1)
    d = _acc(node.dtype)
    src = _cast(src[tuple(slice(0, n) for n in index.shape)], d)
    at = _axis_ix(index, dim)
    x = _cast(x, d)
    if not include_self:  # the reduction's identity where src lands
        ident = {"sum": 0, "mean": 0, "prod": 1,
                 "amax": -jnp.inf if jnp.issubdtype(d, jnp.floating) else jnp.iinfo(d).min,
                 "amin": jnp.inf if jnp.issubdtype(d, jnp.floating) else jnp.iinfo(d).max}
        base = x.at[at].set(ident[reduce])
    else:
        base = x
    out = (_scatter_prod(base, at, src) if reduce == "prod"
           else getattr(base.at[at], _SCATTER_REDUCE[reduce])(src))
    if reduce == "mean":
        count = jnp.zeros(x.shape, d).at[at].add(1) + (1 if include_self else 0)
        out = jnp.where(count > 0, out / jnp.maximum(count, 1), x)
        if jnp.issubdtype(node.dtype, jnp.integer):
            out = jnp.floor(out)
    return out


@rule("index_reduce.default")
def _index_reduce(node, x, dim, index, source, reduce, *, include_self=True):
    """``scatter_reduce`` with ``index`` along ``dim`` of every slice of ``source``."""
    if x.ndim == 0:
        return _index_reduce(node, x[None], 0, index.reshape(1), source.reshape(1), reduce,
                             include_self=include_self)[0]
    dim = dim % x.ndim
    along = index.reshape([-1 if d == dim else 1 for d in range(source.ndim)])
    return _scatter_reduce(node, x, dim, jnp.broadcast_to(along, source.shape), source, reduce,
                           include_self=include_self)


@rule("put.default")
def _put(node, x, index, source, accumulate=False):
    """``x`` as one flat vector, ``source`` written (or added) at ``index``."""
    at = x.reshape(-1).at[index.reshape(-1)]
    src = _cast(source, x.dtype).reshape(-1)
    return (at.add(src) if accumulate else at.set(src)).reshape(x.shape)


@rule("nonzero_static.default")
def _nonzero_static(node, x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros(node.shape, node.dtype)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), -1)


@rule("embedding.default")
def _embedding(node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight``; as torch's derivative, none reaches the row ``padding_idx``, and
    with ``scale_grad_by_freq`` a row's is divided by how often ``indices`` holds it."""
    rows = jnp.take(weight, indices, axis=0)
    if padding_idx < 0 and not scale_grad_by_freq:
        return rows
    share = jnp.ones(indices.shape, rows.dtype)
    if scale_grad_by_freq:
        share = share / jnp.zeros(weight.shape[0], rows.dtype).at[indices].add(1)[indices]
    if padding_idx >= 0:
        share = jnp.where(indices == padding_idx, 0, share)
    held = lax.stop_gradient(rows)
    return held + (rows - held) * share[..., None]


def _embedding_bag_used(n) -> bool:
    """Only the bags are read (the other three outputs are torch's bookkeeping for its
    backward), and the weights by sample, if any, are summed."""
    mode = n.args[4] if len(n.args) > 4 else n.kwargs.get("mode", 0)
    weighted = len(n.args) > 6 and n.args[6] is not None
    return _only_first_output(n) and not (weighted and mode != 0)


@rule("_embedding_bag.default", "_embedding_bag_forward_only.default",
      supports=_embedding_bag_used)
def _embedding_bag(node, weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """``F.embedding_bag``: bag ``i`` is ``indices[offsets[i]:offsets[i + 1]]`` (the last
    runs to the end unless ``include_last_offset``), reduced by sum, mean or max; entries
    equal to ``padding_idx`` are left out; an empty bag is zeros, as torch's."""
    bags = node.shape[0][0]
    pos = jnp.arange(indices.shape[0])
    bag = jnp.searchsorted(offsets, pos, side="right") - 1
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    rows = jnp.take(weight, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    bag = jnp.where(keep, bag, bags)  # left-out entries land in a bag past the last
    if mode == 2:
        top = jax.ops.segment_max(rows, bag, num_segments=bags + 1)[:bags]
        count = jax.ops.segment_sum(jnp.ones_like(pos), bag, num_segments=bags + 1)[:bags]
        return jnp.where(count[:, None] > 0, top, 0), None, None, None
    d = _acc(node.dtypes[0])
    total = jax.ops.segment_sum(_cast(rows, d), bag, num_segments=bags + 1)[:bags]
    if mode == 1:
        count = jax.ops.segment_sum(jnp.ones(pos.shape, d), bag, num_segments=bags + 1)
        total = total / jnp.maximum(count[:bags], 1)[:, None]
    return total, None, None, None


# ------------------------------------------------------------------ reductions

def _reduction(fn, dtype_arg=True):
    def run(node, x, dim=None, keepdim=False, *, dtype=None):
        d = node.dtype
        acc = _acc(d) if jnp.issubdtype(d, jnp.floating) else d
        axes = _dims(dim, x.ndim)
        if x.ndim == 0:
            return fn(_cast(x, acc), axis=None)
        return fn(_cast(x, acc), axis=axes, keepdims=keepdim)
    return run


rule("sum.dim_IntList", "sum.default")(_reduction(jnp.sum))
rule("mean.dim", "mean.default")(_reduction(jnp.mean))
rule("prod.dim_int", "prod.default")(_reduction(jnp.prod))
rule("amax.default")(_reduction(jnp.max))
rule("amin.default")(_reduction(jnp.min))
rule("any.dim", "any.dims", "any.default")(_reduction(jnp.any))
rule("all.dim", "all.dims", "all.default")(_reduction(jnp.all))


@rule("max.dim", "min.dim")
def _max_dim(node, x, dim, keepdim=False):
    """The value at the first index of the extreme (NaN's, if any), where torch sends the
    derivative; ``jnp.max``'s shares it among ties."""
    arg = jnp.argmax if node.node.target.__name__.startswith("max") else jnp.argmin
    if x.ndim == 0:
        return x, jnp.zeros((), node.dtypes[1])
    dim = dim % x.ndim
    at = arg(x, axis=dim, keepdims=True)
    val = jnp.take_along_axis(x, at, axis=dim)
    return (val, at) if keepdim else (val.squeeze(dim), at.squeeze(dim))


@rule("max.default")
def _max(node, x):
    return jnp.max(x)


@rule("min.default")
def _min(node, x):
    return jnp.min(x)


@rule("argmax.default", "argmin.default")
def _argmax(node, x, dim=None, keepdim=False):
    fn = jnp.argmax if "argmax" in node.node.target.__name__ else jnp.argmin
    if dim is None:
        out = fn(x.reshape(-1))
        return out.reshape((1,) * x.ndim) if keepdim else out
    return fn(x, axis=dim % max(x.ndim, 1), keepdims=keepdim) if x.ndim else jnp.zeros((), int)


@rule("var.correction", "var.dim")
def _var(node, x, dim=None, *, correction=None, keepdim=False, unbiased=None):
    acc = _acc(node.dtype)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return jnp.var(_cast(x, acc), axis=_dims(dim, x.ndim), keepdims=keepdim,
                   ddof=1 if correction is None else correction)


@rule("var_mean.correction")
def _var_mean(node, x, dim=None, *, correction=None, keepdim=False):
    return (_var(node, x, dim, correction=correction, keepdim=keepdim),
            _reduction(jnp.mean)(node, x, dim, keepdim))


@rule("std.correction")
def _std(node, x, dim=None, *, correction=None, keepdim=False):
    acc = _acc(node.dtype)
    return jnp.std(_cast(x, acc), axis=_dims(dim, x.ndim), keepdims=keepdim,
                   ddof=1 if correction is None else correction)


@rule("cumsum.default")
def _cumsum(node, x, dim, *, dtype=None):
    return jnp.cumsum(_cast(x, _acc(node.dtype)), axis=dim % max(x.ndim, 1)) if x.ndim else x


@rule("cumprod.default")
def _cumprod(node, x, dim, *, dtype=None):
    return jnp.cumprod(_cast(x, _acc(node.dtype)), axis=dim % max(x.ndim, 1)) if x.ndim else x


@rule("logsumexp.default")
def _logsumexp(node, x, dim, keepdim=False):
    return jax.nn.logsumexp(_cast(x, _acc(node.dtype)), axis=_dims(dim, x.ndim),
                            keepdims=keepdim)


@rule("cummax.default", "cummin.default")
def _cummax(node, x, dim):
    """The running maximum (minimum) and the index of the last element equal to it, as
    torch's kernel keeps it (NaN, once met, is the maximum from there on)."""
    if x.ndim == 0:
        return x, jnp.zeros((), node.dtypes[1])
    dim = dim % x.ndim
    better = jnp.greater_equal if "cummax" in node.node.target.__name__ else jnp.less_equal

    def pick(a, b):  # b is later: it wins a tie, and a NaN
        take = jnp.isnan(b[0]) | (~jnp.isnan(a[0]) & better(b[0], a[0]))
        return jnp.where(take, b[0], a[0]), jnp.where(take, b[1], a[1])
    idx = lax.broadcasted_iota(node.dtypes[1], x.shape, dim)
    _, at = lax.associative_scan(pick, (lax.stop_gradient(x), idx), axis=dim)
    return jnp.take_along_axis(x, at, axis=dim), at


@rule("logcumsumexp.default")
def _logcumsumexp(node, x, dim):
    if x.ndim == 0:
        return x
    return lax.cumlogsumexp(_cast(x, _acc(node.dtype)), axis=dim % x.ndim)


@rule("_softmax.default")
def _softmax(node, x, dim, half_to_float=False):
    return jax.nn.softmax(_cast(x, _acc(x.dtype)), axis=dim % max(x.ndim, 1))


@rule("_log_softmax.default")
def _log_softmax(node, x, dim, half_to_float=False):
    return jax.nn.log_softmax(_cast(x, _acc(x.dtype)), axis=dim % max(x.ndim, 1))


@rule("sort.default", "sort.stable")
def _sort(node, x, dim=-1, descending=False, *, stable=False):
    if x.ndim == 0:
        return x, jnp.zeros((), node.dtypes[1])
    dim = dim % x.ndim  # stable either way; NaN is the largest, as in torch
    idx = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(x, idx, axis=dim), idx


@rule("topk.default")
def _topk(node, x, k, dim=-1, largest=True, sorted=True):  # noqa: A002  (torch's name)
    dim = dim % x.ndim
    moved = jnp.moveaxis(x if largest else -x, dim, -1)
    vals, idx = lax.top_k(moved, k)
    vals = vals if largest else -vals
    return jnp.moveaxis(vals, -1, dim), jnp.moveaxis(idx, -1, dim)


def _median(x, dim, keepdim, skip_nan):
    """torch's median along ``dim``: the lower of the two middle values; a NaN makes the
    median NaN (its first index), or is left out (``skip_nan``: nanmedian, NaN only where
    all are). Among equal values, the index is the one a stable sort puts in the middle,
    which need not be the one torch's selection finds (so the derivative's place)."""
    order = jnp.argsort(x, axis=dim, stable=True)  # NaNs sort last
    nan = jnp.isnan(x)
    count = x.shape[dim] - (nan.sum(axis=dim, keepdims=True) if skip_nan else 0)
    k = jnp.broadcast_to(jnp.maximum(count - 1, 0) // 2,
                         x.shape[:dim] + (1,) + x.shape[dim + 1:])
    idx = jnp.take_along_axis(order, k, axis=dim)
    if not skip_nan:
        first = jnp.argmax(nan, axis=dim, keepdims=True)
        idx = jnp.where(nan.any(axis=dim, keepdims=True), first, idx)
    val = jnp.take_along_axis(x, idx, axis=dim)
    if not keepdim:
        val, idx = val.squeeze(dim), idx.squeeze(dim)
    return val, idx


@rule("kthvalue.default")
def _kthvalue(node, x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), node.dtypes[1])
    dim = dim % x.ndim
    at = lax.slice_in_dim(jnp.argsort(x, axis=dim, stable=True), k - 1, k, axis=dim)
    val = jnp.take_along_axis(x, at, axis=dim)
    return (val, at) if keepdim else (val.squeeze(dim), at.squeeze(dim))


@rule("histc.default")
def _histc(node, x, bins=100, min=0, max=0):  # noqa: A002  (torch's names)
    """Counts in ``bins`` equal bins of [min, max] (the data's range where both are 0,
    widened by 1 each way where that is one point); the maximum is in the last bin."""
    x = _cast(x, _acc(node.dtype)).reshape(-1)
    lo, hi = (x.min(), x.max()) if min == max else (jnp.asarray(min, x.dtype),
                                                       jnp.asarray(max, x.dtype))
    lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    at = jnp.clip(jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int32), 0, bins - 1)
    inside = (x >= lo) & (x <= hi)
    return jnp.zeros(bins, x.dtype).at[at].add(inside.astype(x.dtype))


@rule("median.dim", "nanmedian.dim")
def _median_dim(node, x, dim=0, keepdim=False):
    skip = node.node.target.__name__.startswith("nanmedian")
    if x.ndim == 0:
        return x, jnp.zeros((), node.dtypes[1])
    return _median(x, dim % x.ndim, keepdim, skip)


@rule("median.default", "nanmedian.default")
def _median_all(node, x):
    skip = node.node.target.__name__.startswith("nanmedian")
    v = lax.stop_gradient(_median(x.reshape(-1), 0, False, skip)[0])
    # torch shares the derivative evenly among the elements equal to the median (or NaN)
    at = lax.stop_gradient((x == v) | (jnp.isnan(x) & jnp.isnan(v)))
    share = jnp.sum(jnp.where(at, x, 0)) / jnp.sum(at)
    return v + (share - lax.stop_gradient(share))


# -------------------------------------------------------------- linear algebra

def _mm(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


_SAME_SHAPE = {"aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default",
               "aten::view_copy.default"}


def _one_matrix(arg) -> bool:
    """Whether a ``bmm`` operand (an fx node) is one matrix copied along the batch: an
    ``expand`` that adds or widens dim 0, seen through views that keep its shape.

    torch's ``matmul`` decomposition writes ``x @ w`` that way where a 3-d ``x`` cannot
    be folded into one ``mm`` (a permuted input, as in ``nn.LSTM``). Taken literally, XLA
    copies ``w`` once per batch and runs a batched product; the rule takes one copy,
    so that XLA (which folds the slice of a broadcast) runs one matrix product with
    ``w`` itself, and the gradient sums over the batch inside it."""
    while (isinstance(arg, torch.fx.Node) and name_of(arg.target) in _SAME_SHAPE
           and arg.args[0].meta["val"].shape == arg.meta["val"].shape):
        arg = arg.args[0]
    if not (isinstance(arg, torch.fx.Node)
            and name_of(arg.target) in ("aten::expand.default", "aten::expand_copy.default")):
        return False
    src = arg.args[0].meta["val"]
    return src.ndim < 3 or src.shape[0] == 1


@rule("mm.default", "bmm.default")
def _mm_rule(node, a, b):
    d = _acc(node.dtype)
    if a.ndim == 3:  # bmm: an operand copied along the batch enters as its one matrix
        a, b = (v[0] if _one_matrix(arg) else v for v, arg in zip((a, b), node.node.args))
    # both copied: one product, copied along the batch as torch's result is
    return jnp.broadcast_to(_mm(_cast(a, d), _cast(b, d)), node.shape)


@rule("addmm.default", "baddbmm.default", "addmv.default")
def _addmm(node, bias, a, b, *, beta=1, alpha=1):
    d = _acc(node.dtype)
    prod = _mm(_cast(a, d), _cast(b, d))
    prod = prod if alpha == 1 else prod * alpha
    if beta == 0:
        return prod
    return prod + (_cast(bias, d) if beta == 1 else _cast(bias, d) * beta)


@rule("addbmm.default")
def _addbmm(node, bias, a, b, *, beta=1, alpha=1):  # the products summed over the batch
    d = _acc(node.dtype)
    prod = jnp.einsum("bij,bjk->ik", _cast(a, d), _cast(b, d), precision=HIGHEST) * alpha
    return prod if beta == 0 else prod + _cast(bias, d) * beta


@rule("dist.default")
def _dist(node, a, b, p=2):
    return jnp.linalg.norm((_cast(a, _acc(node.dtype)) - b).reshape(-1), ord=p)


@rule("dot.default")
def _dot(node, a, b):
    return jnp.dot(a, b, precision=HIGHEST)


@rule("_trilinear.default")
def _trilinear(node, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``nn.Bilinear``'s product: each input widened by size-1 dims at ``expand*``, their
    product summed over ``sumdim``; as one einsum."""
    ndim = i1.ndim + len(expand1)
    size = [1] * ndim
    subs = []
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        axes = [a for a in range(ndim) if a not in expand]
        for a, n in zip(axes, x.shape, strict=True):
            size[a] = size[a] if n == 1 else n
        subs.append((x, axes))
    d = _acc(node.dtype)
    ops = []
    for x, axes in subs:  # a size-1 dim that another input widens: broadcast, dropped
        keep = [i for i, a in enumerate(axes) if x.shape[i] == size[a]]
        ops += [_cast(x.reshape([x.shape[i] for i in keep]), d), [axes[i] for i in keep]]
    out = jnp.einsum(*ops, [a for a in range(ndim) if a not in sumdim], precision=HIGHEST)
    return out.reshape(node.shape)


# torch's matrix functions that can fail (singular, not positive definite) return an error
# flag that a checking node (``aten::_linalg_check_errors``, an effect) raises on: see CHECKS
def _checked(*results, info):
    """supports: the graph reads only the outputs ``results``, and ``info`` only to check."""
    def ok(n) -> bool:
        for u in n.users:
            i = u.args[1] if u.target is operator.getitem else None
            if i not in results and not (i == info and all(map(_is_check, u.users))):
                return False
        return True
    return ok


def _is_check(n) -> bool:
    return (name_of(n.target) == "higher_order::with_effects"
            and name_of(n.args[1]) == "aten::_linalg_check_errors.default")


@rule("higher_order::with_effects", supports=_is_check)
def _with_effects(node, token, op, *args, **kwargs):
    return token, None  # torch's check of an error flag: see _checked and CHECKS


@rule("_assert_async.msg", "_assert_async.default")
def _assert_async(node, cond, msg=None):
    return None  # torch.distributions' checks of their arguments, torch._assert: CHECKS


@rule("_is_all_true.default")
def _is_all_true(node, x):
    return jnp.all(x)


# Checks torch makes while the program runs, raising where they fail; XLA cannot raise.
# "translate" leaves them out (a failed solve gives inf or NaN, as jnp.linalg does;
# an invalid distribution parameter, what its formula gives); "auto", which gives
# "call"'s behaviour, runs a program that has one as one torch call.
CHECKS = ("higher_order::with_effects", "aten::_assert_async.msg",
          "aten::_assert_async.default")


def _ct(a):
    """The conjugate transpose of (a batch of) matrices."""
    return jnp.swapaxes(a, -1, -2).conj()


def _hermitian(a, lower: bool):
    """The Hermitian matrix torch's ``eigh`` and ``cholesky`` read from one triangle of
    ``a``, differentiated as ``a``'s Hermitian part, as torch's rules are."""
    ah = _ct(a)
    tri = jnp.tril(a, -1) + jnp.triu(ah, 1) if lower else jnp.triu(a, 1) + jnp.tril(ah, -1)
    full = tri + jnp.real(jnp.diagonal(a, axis1=-2, axis2=-1))[..., None] * jnp.eye(
        a.shape[-1], dtype=a.dtype)
    sym = (a + ah) / 2
    return sym + lax.stop_gradient(full - sym)


def _batched(a, b):
    """Matrices ``a`` and ``b`` with their batch dims broadcast, as torch's solvers take them."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


@rule("linalg_inv_ex.default", supports=_checked(0, info=1))
def _inv(node, a, check_errors=False):
    return jnp.linalg.inv(a), None


@rule("_linalg_solve_ex.default", supports=_checked(0, info=3))
def _solve(node, a, b, left=True, check_errors=False):
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])  # torch's
    if vector:
        b = b[..., None]
    if not left:  # x a = b: aᵀ xᵀ = bᵀ
        a, b = jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2)
    x = jnp.linalg.solve(*_batched(a, b))
    x = x[..., 0] if vector else x if left else jnp.swapaxes(x, -1, -2)
    return x, None, None, None


@rule("linalg_cholesky_ex.default", supports=_checked(0, info=1))
def _cholesky(node, a, upper=False, check_errors=False):
    low = lax.linalg.cholesky(_hermitian(a, lower=not upper), symmetrize_input=False)
    return (_ct(low) if upper else low), None


@rule("linalg_solve_triangular.default")
def _solve_triangular(node, a, b, *, upper, left=True, unitriangular=False):
    return lax.linalg.triangular_solve(*_batched(a, b), left_side=left, lower=not upper,
                                       unit_diagonal=unitriangular)


@rule("cholesky_solve.default")
def _cholesky_solve(node, b, factor, upper=False):
    low, b = _batched(_ct(factor) if upper else factor, b)
    y = lax.linalg.triangular_solve(low, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(low, y, left_side=True, lower=True,
                                       transpose_a=True, conjugate_a=True)


@rule("cholesky_inverse.default")
def _cholesky_inverse(node, factor, upper=False):
    low = _ct(factor) if upper else factor
    eye = jnp.broadcast_to(jnp.eye(low.shape[-1], dtype=low.dtype), low.shape)
    inv = lax.linalg.triangular_solve(low, eye, left_side=True, lower=True)  # L⁻¹
    return _mm(_ct(inv), inv)  # (L Lᴴ)⁻¹ = L⁻ᴴ L⁻¹


@rule("linalg_matrix_exp.default")
def _matrix_exp(node, a):
    return jax.scipy.linalg.expm(a)


@rule("_linalg_det.default", supports=_only_first_output)
def _det(node, a):
    return jnp.linalg.det(a), None, None


@rule("_linalg_slogdet.default", supports=lambda n: _reads(n) <= {0, 1})
def _slogdet(node, a):
    sign, logabs = jnp.linalg.slogdet(a)
    return sign, logabs, None, None


# the eigenvectors and singular vectors are each fixed only up to a sign (a phase), which
# LAPACK's and XLA's routines need not choose alike: only the values translate
@rule("_linalg_eigh.default", supports=_only_first_output)
def _eigvalsh(node, a, UPLO="L", compute_v=True):  # noqa: N803  (torch's name)
    return jnp.linalg.eigvalsh(_hermitian(a, lower=UPLO == "L"), symmetrize_input=False), None


@rule("_linalg_svd.default", supports=lambda n: _reads(n) <= {1})
def _svdvals(node, a, full_matrices=False, compute_uv=True, driver=None):
    return None, jnp.linalg.svd(a, compute_uv=False), None


@rule("linalg_qr.default")  # Householder QR with LAPACK's signs, in torch and XLA alike
def _qr(node, a, mode="reduced"):
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    return (jnp.zeros(node.shapes[0], node.dtypes[0]) if mode == "r" else q), r


# hermitian=True: torch's value reads the lower triangle, but its derivative is that of
# the whole input, which no translation of the value gives for an input not Hermitian
@rule("linalg_pinv.atol_rtol_tensor", "linalg_pinv.atol_rtol_float",
      supports=lambda n: not n.kwargs.get("hermitian"))
def _pinv(node, a, *, atol=None, rtol=None, hermitian=False):
    """Singular values above max(atol, rtol·σ₁) inverted; ``rtol`` by default the machine
    epsilon times the larger dimension, or 0 where an ``atol`` above 0 is given."""
    if a.size == 0:
        return jnp.zeros(node.shape, node.dtype)
    if rtol is None:
        rtol = np.finfo(node.dtype).eps * max(a.shape[-2:])
        if atol is not None:
            rtol = jnp.where(jnp.asarray(atol) > 0, 0.0, rtol)
    if atol is not None:  # as a tolerance relative to σ₁, jnp.linalg.pinv's one argument
        top = lax.stop_gradient(jnp.linalg.svd(a, compute_uv=False)[..., 0])
        rtol = jnp.maximum(rtol, jnp.asarray(atol) / top)
    return jnp.linalg.pinv(a, rtol=rtol)


@rule("convolution.default")
def _convolution(node, x, w, bias, stride, padding, dilation, transposed, output_padding,
                 groups):
    nsp = x.ndim - 2
    stride, padding, dilation, output_padding = (
        list(v) * (nsp // len(v)) if len(v) else [0] * nsp
        for v in (stride, padding, dilation, output_padding))
    d = _acc(node.dtype)
    x, w = _cast(x, d), _cast(w, d)
    spatial = "DHW"[-nsp:] if nsp <= 3 else None
    dn = lax.conv_dimension_numbers(x.shape, w.shape,
                                    ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    if not transposed:
        y = lax.conv_general_dilated(x, w, window_strides=tuple(stride),
                                     padding=[(p, p) for p in padding],
                                     rhs_dilation=tuple(dilation), dimension_numbers=dn,
                                     feature_group_count=groups, precision=HIGHEST)
    else:  # the gradient of a convolution: dilate the input, flip the kernel
        k = [w.shape[2 + i] for i in range(nsp)]
        pads = [(dilation[i] * (k[i] - 1) - padding[i],
                 dilation[i] * (k[i] - 1) - padding[i] + output_padding[i]) for i in range(nsp)]
        # (in, out / groups, k...) as (out, in / groups, k...), group by group
        wt = w.reshape(groups, w.shape[0] // groups, *w.shape[1:]).swapaxes(1, 2)
        wt = jnp.flip(wt.reshape(groups * w.shape[1], w.shape[0] // groups, *k),
                      tuple(range(2, 2 + nsp)))
        y = lax.conv_general_dilated(x, wt, window_strides=(1,) * nsp, padding=pads,
                                     lhs_dilation=tuple(stride), rhs_dilation=tuple(dilation),
                                     dimension_numbers=dn, feature_group_count=groups,
                                     precision=HIGHEST)
    if bias is not None:
        y = y + _cast(bias, d).reshape((-1,) + (1,) * nsp)
    return y


# ----------------------------------------------------------------- pooling

def _window_pads(size, k, s, p, dil, ceil_mode):
    """(low, high) padding of one axis so that reduce_window gives torch's output length."""
    eff = dil * (k - 1) + 1
    out = (size + 2 * p - eff + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside
        out -= 1
    return out, (p, max((out - 1) * s + eff - size - p, 0))


def _pool_args(x, kernel, stride, padding, dilation, ceil_mode, nsp):
    kernel = list(kernel) * (nsp // len(kernel))
    stride = list(stride or kernel) * (nsp // len(stride or kernel))
    padding = list(padding) * (nsp // len(padding))
    dilation = list(dilation) * (nsp // len(dilation))
    pads, outs = [], []
    for i in range(nsp):
        o, pd = _window_pads(x.shape[x.ndim - nsp + i], kernel[i], stride[i], padding[i],
                             dilation[i], ceil_mode)
        outs.append(o)
        pads.append(pd)
    lead = x.ndim - nsp
    return ((1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
            [(0, 0)] * lead + pads, (1,) * lead + tuple(dilation))


@rule("max_pool2d_with_indices.default", "max_pool3d_with_indices.default",
      "max_pool1d_with_indices.default")
def _max_pool(node, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    nsp = int(node.node.target.__name__.split("max_pool")[1][0])
    win, strides, pads, dil = _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode,
                                         nsp)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    init = np.array(-np.inf if floating else np.iinfo(x.dtype).min, x.dtype)
    y = lax.reduce_window(x, init, lax.max, win, strides, pads, window_dilation=dil)
    if not _reads(node.node) - {0}:
        return y, None
    # the indices into each input plane, as torch's kernel picks them: the first of equal
    # maxima, a NaN over any number (the last NaN); padding never
    plane = x.shape[x.ndim - nsp:]
    at = jnp.broadcast_to(jnp.arange(math.prod(plane), dtype=node.dtypes[1]).reshape(plane),
                          x.shape)

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        nan_a, nan_b = (jnp.isnan(va), jnp.isnan(vb)) if floating else (False, False)
        b_wins = ((vb > va) | ((vb == va) & (ib < ia)) | (nan_b & ~nan_a)
                  | (nan_a & nan_b & (ib > ia)))
        return jnp.where(b_wins, vb, va), jnp.where(b_wins, ib, ia)
    _, at = lax.reduce_window((lax.stop_gradient(x), at),
                              (init, np.array(np.iinfo(at.dtype).max, at.dtype)), pick,
                              win, strides, pads, window_dilation=dil)
    return y, at


@rule("avg_pool2d.default", "avg_pool3d.default", "avg_pool1d.default")
def _avg_pool(node, x, kernel_size, stride=(), padding=(0,), ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    nsp = int(node.node.target.__name__.split("avg_pool")[1][0])
    d = _acc(node.dtype)
    x = _cast(x, d)
    win, strides, pads, _ = _pool_args(x, kernel_size, stride, padding, (1,), ceil_mode, nsp)
    total = lax.reduce_window(x, np.array(0, d), lax.add, win, strides, pads)
    if divisor_override:
        return total / divisor_override
    # torch divides by the window clipped to the padded input (count_include_pad) or the input
    ones = jnp.ones(x.shape[x.ndim - nsp:], d)
    lead = x.ndim - nsp
    sp = pads[lead:]
    if count_include_pad:  # the padding counts, the overhang of ceil_mode does not
        padded = lax.pad(ones, jnp.asarray(1, d), [(lo, lo, 0) for lo, _ in sp])
        cnt = lax.reduce_window(padded, np.array(0, d), lax.add, win[lead:], strides[lead:],
                                [(0, hi - lo) for lo, hi in sp])
    else:
        cnt = lax.reduce_window(ones, np.array(0, d), lax.add, win[lead:], strides[lead:], sp)
    return total / cnt


@rule("_adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default",
      "adaptive_avg_pool1d.default")
def _adaptive_avg_pool(node, x, output_size):
    return _adaptive(_cast(x, _acc(node.dtype)), output_size, jnp.mean)


@rule("adaptive_max_pool2d.default", "adaptive_max_pool3d.default",
      supports=_only_first_output)
def _adaptive_max_pool(node, x, output_size):
    return _adaptive(x, output_size, jnp.max), None  # the indices: no node reads them


def _adaptive(x, output_size, reduce):
    """Bin ``j`` of ``o`` along an axis of length ``n`` reduces ``[⌊jn/o⌋, ⌈(j+1)n/o⌉)``,
    one spatial axis at a time."""
    nsp = len(output_size)
    for i, o in enumerate(output_size):
        ax = x.ndim - nsp + i
        n = x.shape[ax]
        bins = [reduce(lax.slice_in_dim(x, (j * n) // o, -((-(j + 1) * n) // o), axis=ax),
                       axis=ax, keepdims=True) for j in range(o)]
        x = jnp.concatenate(bins, axis=ax)
    return x


# ------------------------------------------------------------- normalization

@rule("native_layer_norm.default")
def _layer_norm(node, x, normalized_shape, weight, bias, eps):
    d = _acc(x.dtype)
    xf = _cast(x, d)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * _cast(weight, d)
    if bias is not None:
        y = y + _cast(bias, d)
    return y, mean, rstd


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_apply(x, mean, rstd, weight, bias, d):
    y = (_cast(x, d) - mean.reshape(_bn_shape(x))) * rstd.reshape(_bn_shape(x))
    if weight is not None:
        y = y * _cast(weight, d).reshape(_bn_shape(x))
    if bias is not None:
        y = y + _cast(bias, d).reshape(_bn_shape(x))
    return y


def _bn_stats(x, d, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = _cast(x, d)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_bn_shape(x))), axis=axes)
    return mean, var, lax.rsqrt(var + eps), math.prod(x.shape) // x.shape[1]


# The running statistics are buffers, as in torch: no derivative goes through them
# (torch's kernels refuse one), and their update in place records none, so an updated
# statistic keeps the derivative it had before: new = old + stop_gradient(new - old).

def _bn_running(x, weight, bias, running_mean, running_var, eps, d):
    rstd = lax.rsqrt(_cast(lax.stop_gradient(running_var), d) + eps)
    return _bn_apply(x, _cast(lax.stop_gradient(running_mean), d), rstd, weight, bias, d)


@rule("_native_batch_norm_legit_no_training.default")
def _bn_eval(node, x, weight, bias, running_mean, running_var, momentum, eps):
    d = _acc(x.dtype)
    y = _bn_running(x, weight, bias, running_mean, running_var, eps, d)
    return y, jnp.zeros((0,), d), jnp.zeros((0,), d)


@rule("_native_batch_norm_legit_functional.default")
def _bn_train(node, x, weight, bias, running_mean, running_var, training, momentum, eps):
    d = _acc(x.dtype)
    if not training:
        y = _bn_running(x, weight, bias, running_mean, running_var, eps, d)
        return y, jnp.zeros((0,), d), jnp.zeros((0,), d), running_mean, running_var
    mean, var, rstd, n = _bn_stats(x, d, eps)
    y = _bn_apply(x, mean, rstd, weight, bias, d)
    stats = lax.stop_gradient
    new_mean = (1 - momentum) * running_mean + momentum * stats(mean).astype(running_mean.dtype)
    unbiased = stats(var) * (n / max(n - 1, 1))
    new_var = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return (y, mean, rstd, running_mean + stats(new_mean - running_mean),
            running_var + stats(new_var - running_var))


@rule("_native_batch_norm_legit.no_stats")
def _bn_no_stats(node, x, weight, bias, training, momentum, eps):
    d = _acc(x.dtype)
    mean, _, rstd, _ = _bn_stats(x, d, eps)
    return _bn_apply(x, mean, rstd, weight, bias, d), mean, rstd


@rule("native_group_norm.default")
def _group_norm(node, x, weight, bias, n, c, hw, group, eps):
    d = _acc(x.dtype)
    xg = _cast(x, d).reshape(n, group, -1)
    mean = jnp.mean(xg, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=2, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = ((xg - mean) * rstd).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * _cast(weight, d).reshape(shape)
    if bias is not None:
        y = y + _cast(bias, d).reshape(shape)
    return y, mean.reshape(n, group), rstd.reshape(n, group)


# ------------------------------------------------------------ recurrent layers

def _lin(x, w, b):
    """``F.linear``: the product in torch's accumulation dtype, rounded to ``x``'s."""
    a = _acc(x.dtype)
    y = _mm(_cast(x, a), _cast(w, a).T)
    return (y if b is None else y + _cast(b, a)).astype(x.dtype)


def _lstm_step(w_hh, b_hh, w_hr):
    def step(hc, gx):
        h, c = hc
        i, f, g, o = jnp.split(gx + _lin(h, w_hh, b_hh), 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        h = h if w_hr is None else _lin(h, w_hr, None)
        return (h, c), h
    return step


def _gru_step(w_hh, b_hh, w_hr):
    def step(h, gx):
        ri, zi, ni = jnp.split(gx, 3, -1)
        rh, zh, nh = jnp.split(_lin(h, w_hh, b_hh), 3, -1)
        r, z = jax.nn.sigmoid(rh + ri), jax.nn.sigmoid(zh + zi)
        n = jnp.tanh(ni + nh * r)
        h = (h - n) * z + n
        return h, h
    return step


def _rnn_step(act):
    def make(w_hh, b_hh, w_hr):
        def step(h, gx):
            h = act(_lin(h, w_hh, b_hh) + gx)
            return h, h
        return step
    return make


def _recurrent_draws(node) -> bool:
    """Dropout between layers, in train mode: (input, hx, params, has_biases,
    num_layers, dropout, train, ...)."""
    num_layers, dropout, train = node.args[4:7]
    return bool(train) and dropout > 0 and num_layers > 1


def _recurrent(make_step, lstm=False):
    """``aten.lstm/gru/rnn_*.input``: per layer and direction, one ``lax.scan`` over the
    sequence (reversed for the second direction), each step's input multiplied by
    ``w_ih`` inside the step, as a model written in JAX would; between layers, in
    train mode, dropout drawn from the node's key, as torch's own kernels apply it.
    (torch's decomposition of these ops, which the translation would otherwise
    follow, unrolls the loop over the sequence, and leaves the dropout out. The input's
    product for all steps at once, before the loop, was no faster on XLA's CPU backend
    at batch 10² and 10³, and cost 1.7× with gradients at batch 1.)"""
    def rnn(node, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first):
        dirs = 2 if bidirectional else 1
        per = len(params) // (num_layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
        h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
        x = jnp.swapaxes(x, 0, 1) if batch_first else x  # (sequence, batch, features)
        hs, cs = [], []
        for layer in range(num_layers):
            outs = []
            for d in range(dirs):
                k = layer * dirs + d
                w = params[k * per:(k + 1) * per]
                b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
                w_hr = w[-1] if lstm and per in (3, 5) else None
                cell = make_step(w[1], b_hh, w_hr)

                def step(carry, xt, cell=cell, w_ih=w[0], b_ih=b_ih):
                    return cell(carry, _lin(xt, w_ih, b_ih))
                carry, ys = lax.scan(step, (h0[k], c0[k]) if lstm else h0[k], x,
                                     reverse=d == 1)
                outs.append(ys)
                hs.append(carry[0] if lstm else carry)
                if lstm:
                    cs.append(carry[1])
            x = outs[0] if dirs == 1 else jnp.concatenate(outs, -1)
            if _recurrent_draws(node.node) and layer < num_layers - 1:
                x = _dropout(jax.random.fold_in(node.key(), layer), x, dropout)[0]
        out = jnp.swapaxes(x, 0, 1) if batch_first else x
        return (out, jnp.stack(hs), jnp.stack(cs)) if lstm else (out, jnp.stack(hs))
    return rnn


rule("lstm.input", random=_recurrent_draws)(_recurrent(_lstm_step, lstm=True))
rule("gru.input", random=_recurrent_draws)(_recurrent(_gru_step))
rule("rnn_tanh.input", random=_recurrent_draws)(_recurrent(_rnn_step(jnp.tanh)))
rule("rnn_relu.input", random=_recurrent_draws)(_recurrent(_rnn_step(jax.nn.relu)))


# ------------------------------------------------------------ Fourier transforms

def _fft_norm(normalization: int, forward: bool) -> str:
    """torch's ``fft_norm_mode`` (0: none, 1: by √n, 2: by n) as ``jnp.fft``'s ``norm``:
    the scaling of the transform in the direction given, forward or inverse. (``jnp.fft``
    names the direction that divides by n: ``"forward"`` or ``"backward"``.)"""
    if normalization == 1:
        return "ortho"
    divides = normalization == 2
    return "forward" if divides == forward else "backward"


@rule("_fft_r2c.default")
def _fft_r2c(node, x, dim, normalization, onesided):
    fft = jnp.fft.rfftn if onesided else jnp.fft.fftn
    return fft(x, axes=dim, norm=_fft_norm(normalization, True))


@rule("_fft_c2c.default")
def _fft_c2c(node, x, dim, normalization, forward):
    fft = jnp.fft.fftn if forward else jnp.fft.ifftn
    return fft(x, axes=dim, norm=_fft_norm(normalization, forward))


@rule("_fft_c2r.default")
def _fft_c2r(node, x, dim, normalization, last_dim_size):
    s = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(x, s=s, axes=dim, norm=_fft_norm(normalization, False))


# ---------------------------------------------------------- python operators

@rule("_operator::getitem")
def _getitem(node, seq, i):
    return seq[i]


def name_of(target) -> str:
    """The table's name of an fx node's target: ``"aten::add.Tensor"``, or the callable's."""
    if type(target).__name__ == "OpOverload":  # torch.ops.aten.add.Tensor: "aten.add.Tensor"
        ns, _, rest = str(target).partition(".")
        return f"{ns}::{rest}"
    if target is operator.getitem:
        return "_operator::getitem"
    if getattr(target, "namespace", None) == "higher_order":  # with_effects, ...
        return f"higher_order::{target.name()}"
    return getattr(target, "__qualname__", None) or repr(target)
