"""Building blocks shared by the mixers.

Every parameter carries logical sharding axes (``nnx.with_partitioning``)
for the training code to map onto a mesh; the names used are

- ``"embed"``: the model width ``D``;
- ``"heads"``: a projected width split over heads (``H * K``, ``H * V``);
- ``"mlp"``: the hidden width of the MLP;
- ``"vocab"``: the vocabulary;
- ``"rank"``: a low-rank bottleneck (gate and LoRA projections);
- ``"conv"``: the taps of a short convolution;
- ``"state"``: a state dimension of an SSM;
- ``None``: not sharded.

The metadata is created without a mesh (``eager_sharding=False``), so a
layer builds anywhere; ``nnx.get_partition_spec`` reads the names back.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers.base import OpForms, run_forms
from lin_attn_jax.ops import (causal_conv1d_step, chunk_causal_conv1d,
                              parallel_causal_conv1d, recurrent_causal_conv1d)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.products import project, project_parts
from lin_attn_jax.ops.common.reductions import plus_channels, times_channels
from lin_attn_jax.ops.conv import token_shift as ops_token_shift


def partitioned(init, axes: Sequence[str | None]):
  """``init`` carrying the logical ``axes`` as sharding metadata."""
  return nnx.with_partitioning(init, tuple(axes), eager_sharding=False)


def param(rngs: nnx.Rngs, init, shape, axes, param_dtype=jnp.float32):
  """An ``nnx.Param`` of ``shape`` drawn by ``init`` with logical ``axes``."""
  return nnx.Param(partitioned(init, axes)(rngs.params(), tuple(shape),
                                           param_dtype))


def constant_init(value):
  """An initializer that fills with a fixed array (broadcast to the shape)."""

  def init(key, shape, dtype=jnp.float32):
    del key
    return jnp.broadcast_to(jnp.asarray(value, dtype), shape)

  return init


def uniform_init(low: float, high: float):
  """An initializer drawing uniformly from ``[low, high)``."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, low, high)

  return init


class Dense(nnx.Linear):
  """``nnx.Linear`` (the same parameters and values) whose bias-free product
  of a ``[B, T, D]`` input goes through ``ops.common.products.project``,
  which forms the kernel's gradient in the layout XLA:CPU runs fast (see
  docs/performance.md); elsewhere it is the plain product. Other inputs
  (and a layer with a bias or a matmul precision) take ``nnx.Linear``'s
  path."""

  def _projects(self, inputs) -> bool:
    """Whether ``inputs`` go through ``project`` (bias-free, ``[B, T, D]``,
    no matmul precision)."""
    return (self.bias is None and jnp.ndim(inputs) == 3
            and self.precision is None)

  def __call__(self, inputs, out_sharding=None):
    if out_sharding is not None or not self._projects(inputs):
      return super().__call__(inputs, out_sharding)
    kernel = self.kernel[...]
    return project(inputs, kernel,
                   self.dtype or jnp.result_type(inputs, kernel))

  def parts(self, inputs, sections: Sequence[int]):
    """``jnp.split(self(inputs), sections, axis=-1)``, the same values, each
    part an array of its own where lowered for the CPU
    (``ops.common.products.project_parts``). Inputs that ``__call__`` does
    not send through ``project`` take that path and are split."""
    if not self._projects(inputs):
      return jnp.split(self(inputs), sections, axis=-1)
    kernel = self.kernel[...]
    return project_parts(inputs, kernel, sections,
                         self.dtype or jnp.result_type(inputs, kernel))


def dense(in_features: int, out_features: int, axes=("embed", "heads"), *,
          rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
          use_bias: bool = False, kernel_init=None, bias_init=None):
  """``Dense`` (an ``nnx.Linear``) with partitioned kernel (and bias)
  initialisers.

  The default kernel init is LeCun normal (variance ``1 / in_features``).
  """
  kernel_init = kernel_init or nnx.initializers.lecun_normal()
  bias_init = bias_init or nnx.initializers.zeros_init()
  return Dense(in_features, out_features, use_bias=use_bias,
               kernel_init=partitioned(kernel_init, axes),
               bias_init=partitioned(bias_init, axes[-1:]),
               dtype=dtype, param_dtype=param_dtype, rngs=rngs)


def _value(p):
  """The array of ``p``, an ``nnx.Variable`` or an array."""
  return p[...] if isinstance(p, nnx.Variable) else p


def linear(x, kernel, bias=None, *, dtype=None):
  """``x W + b`` for ``x [B, T, D]``, a kernel parameter ``W [D, E]`` and
  an optional bias ``b [E]``; computed in ``dtype`` (x's when None) with
  float32 accumulation. The products and sums whose gradients XLA:CPU runs
  slowly in their plain form go through ``ops.common.products.project``
  and ``ops.common.reductions.plus_channels`` (see docs/performance.md).
  """
  y = project(x, _value(kernel), dtype)                        # [B, T, E]
  if bias is None:
    return y
  return plus_channels(y, _value(bias).astype(y.dtype))


def lora(x, down, up, activation=None, bias=None, *, dtype=None):
  """The low-rank map ``b + f(x A) B`` (``A = down [D, R]``, ``B = up [R,
  E]``, ``f = activation`` or the identity, ``b = bias`` or none) of ``x
  [B, T, D]``: ``[B, T, E]`` in ``dtype`` (x's when None), as ``linear``."""
  hidden = linear(x, down, dtype=dtype)                        # [B, T, R]
  if activation is not None:
    hidden = activation(hidden)
  return linear(hidden, up, bias, dtype=dtype)                 # [B, T, E]


class PerChannel:
  """A parameter ``p [D]`` applied to every channel of ``x [..., D]``: ``x *
  per_channel(p)`` and ``x + per_channel(p)`` are ``x * p`` and ``x + p``
  with ``p`` in x's dtype, whose gradient for ``p`` is summed over the
  tokens in the order XLA:CPU runs fast
  (``ops.common.reductions.column_sum``, see docs/performance.md)."""

  def __init__(self, p):
    self.p = _value(p)

  def __rmul__(self, x):
    return times_channels(x, self.p.astype(x.dtype))

  def __radd__(self, x):
    return plus_channels(x, self.p.astype(x.dtype))

  __mul__, __add__ = __rmul__, __radd__


def per_channel(p) -> PerChannel:
  """``p [D]`` (an ``nnx.Variable`` or an array) as a ``PerChannel``."""
  return PerChannel(p)


def rms_norm(features: int, *, rngs: nnx.Rngs, axis_name="embed", eps=1e-6,
             dtype=jnp.float32, param_dtype=jnp.float32):
  """``nnx.RMSNorm`` over the last axis with a partitioned scale."""
  return nnx.RMSNorm(features, epsilon=eps, dtype=dtype,
                     param_dtype=param_dtype,
                     scale_init=partitioned(nnx.initializers.ones_init(),
                                            (axis_name,)),
                     rngs=rngs)


class ChannelRMSNorm(nnx.Module):
  """RMSNorm over the last axis of ``x [..., C]`` with one scale ``[C]``
  shared by every leading axis (per-head q/k norms, whose scale is one
  head's width; the latent norms of MLA).

  ``y = x / sqrt(mean(x^2) + eps) * w``, or ``* (1 + w)`` with
  ``zero_centered=True`` (Qwen3-Next's norms; ``w`` then starts at 0 and
  the norm at the identity scale). Computed in float32, returned in x's
  dtype.
  """

  def __init__(self, features: int, *, rngs: nnx.Rngs, eps: float = 1e-6,
               zero_centered: bool = False, axis_name: str | None = None,
               param_dtype=jnp.float32):
    checks.positive_int("features", features)
    self.eps, self.zero_centered = eps, zero_centered
    init = (nnx.initializers.zeros_init() if zero_centered
            else nnx.initializers.ones_init())
    self.scale = param(rngs, init, (features,), (axis_name,), param_dtype)

  def __call__(self, x):
    """``x: [..., C]`` -> ``[..., C]``."""
    y = x.astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.eps)
    w = self.scale[...].astype(jnp.float32)
    return (y * (1.0 + w if self.zero_centered else w)).astype(x.dtype)


class HeadNorm(nnx.Module):
  """Per-head normalisation of ``[B, T, H, V]``, with an optional gate.

  ``kind="rms"`` divides by the RMS over ``V`` (GLA, DeltaNet, Mamba-2);
  ``kind="layer"`` also subtracts the mean (RetNet's GroupNorm with one group
  per head). The learned scale has ``H * V`` entries. With ``gate`` given,
  the result is multiplied by ``silu(gate)`` (the output gates of GLA,
  RetNet and Gated DeltaNet); ``gate_first=True`` gates before normalising
  (Mamba-2's gated RMSNorm).
  """

  def __init__(self, heads: int, head_dim: int, *, rngs: nnx.Rngs,
               kind: str = "rms", eps: float = 1e-5, gate_first: bool = False,
               param_dtype=jnp.float32):
    if kind not in ("rms", "layer"):
      raise ValueError(f"kind must be 'rms' or 'layer', got {kind!r}")
    self.kind, self.eps, self.gate_first = kind, eps, gate_first
    self.heads, self.head_dim = heads, head_dim
    self.scale = param(rngs, nnx.initializers.ones_init(),
                       (heads * head_dim,), ("heads",), param_dtype)

  def __call__(self, x, gate=None):
    """``x: [B, T, H, V]``, ``gate: [B, T, H * V]`` or None.

    Returns ``[B, T, H * V]`` in x's dtype.
    """
    b, t = x.shape[:2]
    dtype = x.dtype
    x = x.astype(jnp.float32)
    if gate is not None and self.gate_first:
      x = x * jax.nn.silu(gate.astype(jnp.float32)).reshape(x.shape)
    if self.kind == "layer":
      x = x - jnp.mean(x, axis=-1, keepdims=True)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    y = times_channels(x.reshape(b, t, -1),
                       self.scale[...].astype(jnp.float32))
    if gate is not None and not self.gate_first:
      y = y * jax.nn.silu(gate.astype(jnp.float32))
    return y.astype(dtype)


CAUSAL_CONV1D = OpForms(chunk_causal_conv1d, parallel_causal_conv1d,
                        recurrent_causal_conv1d, causal_conv1d_step)


class ShortConv(nnx.Module):
  """A depthwise causal convolution of ``width`` taps over ``[B, T, C]``.

  Used before the token mixing of Mamba, Mamba-2, DeltaNet and the Griffin
  recurrent block. The weight is initialised like PyTorch's ``Conv1d``
  (uniform in ``+-1/sqrt(width)``). Its cache is the last ``width - 1``
  inputs, ``[B, width - 1, C]`` float32.
  """

  def __init__(self, channels: int, width: int = 4, *, rngs: nnx.Rngs,
               activation: str | None = "silu", use_bias: bool = True,
               axis_name: str = "heads", param_dtype=jnp.float32):
    bound = 1.0 / math.sqrt(width)
    self.width, self.channels, self.activation = width, channels, activation
    self.weight = param(rngs, uniform_init(-bound, bound), (channels, width),
                        (axis_name, "conv"), param_dtype)
    self.bias = (param(rngs, nnx.initializers.zeros_init(), (channels,),
                       (axis_name,), param_dtype) if use_bias else None)

  def init_state(self, batch_size: int):
    return jnp.zeros((batch_size, self.width - 1, self.channels), jnp.float32)

  def __call__(self, x, ctx, state=None):
    """``x: [B, T, C]`` -> ``(y [B, T, C], new state or None)``.

    ``ctx`` is the mixer's ``Context``; ``state`` its cached window.
    """
    return self._convolve(x, slice(None), ctx, state)

  def _convolve(self, x, channels: slice, ctx, state):
    """``x`` convolved with the taps (and bias) of ``channels``; ``state``
    is those channels' cached window or None."""
    weight = self.weight[...][channels]                        # [C, W]
    bias = None if self.bias is None else self.bias[...][channels]
    return run_forms(ctx, CAUSAL_CONV1D, {"x": x}, state, weight=weight,
                     bias=bias, activation=self.activation)

  def parts(self, xs: Sequence, ctx, state=None):
    """The convolution of ``jnp.concatenate(xs, axis=-1)``, as ``(list of
    the outputs' parts, new state or None)``: each part ``[B, T, C_i]``
    (channels in order, ``sum C_i = channels``) convolved with its own
    channels' taps, so that the parts stay arrays of their own (see
    ``ops.common.products.project_parts``). The cached window is split and
    joined the same way; a decoding step too is one step per part."""
    sizes = [x.shape[-1] for x in xs]
    if sum(sizes) != self.channels:
      raise ValueError(f"the parts' channels {sizes} must add up to the "
                       f"convolution's {self.channels}")
    ys, states, lo = [], [], 0
    for x, size in zip(xs, sizes):
      part = slice(lo, lo + size)
      y, part_state = self._convolve(
          x, part, ctx, None if state is None else state[..., part])
      ys.append(y)
      states.append(part_state)
      lo += size
    return ys, (None if state is None else jnp.concatenate(states, axis=-1))


class QKVShortConv(nnx.Module):
  """The short convolutions of a mixer's three projections, ``q``, ``k`` and
  ``v`` (fla's ``q_conv1d``, ``k_conv1d``, ``v_conv1d``): each a depthwise
  causal ``ShortConv`` of ``conv_size`` taps, applied right after its
  projection. ``activation`` is SiLU in fla's GLA, retention and delta-rule
  layers, None in its HGRN2. The weights start as PyTorch's ``Conv1d``
  (uniform in ``+-1/sqrt(conv_size)``), as fla's ``ShortConvolution``.

  The cached windows are ``{"q": [B, W - 1, C_q], "k": ..., "v": ...}``
  float32 (``W = conv_size``), ``state_floats`` of them per sequence.
  """

  def __init__(self, channels: Sequence[int], conv_size: int = 4, *,
               rngs: nnx.Rngs, activation: str | None = "silu",
               use_bias: bool = False, param_dtype=jnp.float32):
    checks.positive_int("conv_size", conv_size)
    if len(channels) != 3:
      raise ValueError(f"channels must be those of q, k and v, got "
                       f"{channels!r}")
    q, k, v = (ShortConv(c, conv_size, rngs=rngs, activation=activation,
                         use_bias=use_bias, param_dtype=param_dtype)
               for c in channels)
    self.q_conv, self.k_conv, self.v_conv = q, k, v

  def _convs(self):
    return {"q": self.q_conv, "k": self.k_conv, "v": self.v_conv}

  def init_state(self, batch_size: int) -> dict:
    """Empty windows ``{"q", "k", "v"}``, each ``[B, W - 1, C]`` float32."""
    return {name: conv.init_state(batch_size)
            for name, conv in self._convs().items()}

  def state_floats(self) -> int:
    """Floats of the cached windows per sequence, ``(W - 1) sum C``."""
    return sum((conv.width - 1) * conv.channels
               for conv in self._convs().values())

  def __call__(self, q, k, v, ctx, state=None):
    """``q, k, v: [B, T, C_{q,k,v}]`` -> ``((q, k, v) convolved, new windows
    or None)``; ``state`` the cached windows (``init_state``) or None."""
    outs, new = {}, {}
    for name, x in zip("qkv", (q, k, v)):
      outs[name], new[name] = self._convs()[name](
          x, ctx, None if state is None else state[name])
    return (outs["q"], outs["k"], outs["v"]), (None if state is None
                                               else new)


def qkv_short_conv(use_short_conv: bool, channels: Sequence[int],
                   conv_size: int = 4, conv_bias: bool = False, *,
                   rngs: nnx.Rngs, activation: str | None = "silu",
                   param_dtype=jnp.float32):
  """A ``QKVShortConv`` of ``channels`` when ``use_short_conv``, else None
  (the options every mixer with short convolutions takes, fla's names and
  defaults)."""
  if not use_short_conv:
    return None
  return QKVShortConv(channels, conv_size, rngs=rngs, activation=activation,
                      use_bias=conv_bias, param_dtype=param_dtype)


def _materialized(table):
  """``table [..., K]`` unchanged (a product with the identity, exact), as
  the output of a matmul, which XLA:CPU writes once instead of evaluating
  its producers (``cos``, ``sin``) again inside every consumer (see
  docs/performance.md)."""
  eye = jnp.eye(table.shape[-1], dtype=table.dtype)
  return jnp.einsum("...k,kl->...l", table, eye,
                    precision=jax.lax.Precision.HIGHEST)


def rotary(x, positions, base: float = 10000.0):
  """Rotary position embedding (RoPE, Su et al. 2021) of ``[B, T, H, K]``.

  Pairs channel ``i`` with ``i + K/2`` and rotates by ``position * base **
  (-2i/K)``; ``positions: [B, T]`` int. Computed in float32.
  """
  dim = x.shape[-1]
  if dim % 2:
    raise ValueError(f"rotary needs an even head dimension, got {dim}")
  freq = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
  angle = positions.astype(jnp.float32)[..., None] * freq       # [B, T, K/2]
  table = jax.lax.platform_dependent(
      jnp.concatenate([jnp.cos(angle), jnp.sin(angle)], axis=-1),
      cpu=_materialized, default=lambda table: table)           # [B, T, K]
  cos, sin = table[..., None, :dim // 2], table[..., None, dim // 2:]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def token_shift(x, ctx, last=None):
  """The previous token of every position (RWKV's token shift).

  ``x: [B, T, C]``; ``last: [B, C]`` the token before the first one (from
  the cache) or None for zeros. The previous token is zero at the start of
  every document (``ops.token_shift``, which splits over a ``"sequence"``
  mesh axis). Returns ``(shifted [B, T, C], x[:, -1] as the new last)``.
  """
  first = None if last is None else ctx.carried(last).astype(x.dtype)
  if ctx.decoding:
    shifted = first[:, None]
  else:
    shifted = ops_token_shift(x, first, ctx.segment_ids)
  return shifted, x[:, -1].astype(jnp.float32)
