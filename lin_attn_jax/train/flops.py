"""Model FLOPs per token and model FLOPs utilisation (MFU).

The count is analytic, of the model (not of what XLA runs), for one
training token (forward + backward = 3 x forward):

- projections: ``2 x`` the parameters of every weight matrix (two or more
  dimensions; the input embedding is a lookup and does not count, the
  output head does: with tied embeddings the table counts once);
- sequence mixing, per layer: softmax attention reads ``c`` keys and values
  per query head (``4 x c x H x head_dim``, with ``c`` the mean number of
  visible keys: ``(T + 1) / 2`` for causal attention, fewer under a
  window; for native sparse attention the complete blocks, the tokens of
  the selected blocks and the window); every other mixer reads and writes its recurrent state once per
  token (``4 x`` the floats of its state, ``Mixer.state_size``), the cost
  of the recurrent form, which the chunk forms trade for matmuls (short
  convolutions are counted by their weights, with the projections).

MFU is achieved model FLOPs per second over the devices' peak (dense
bfloat16 matmul, per chip, from the vendors' data sheets); there is no peak
for CPUs, and then MFU is not reported.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx

# Dense bfloat16 peak FLOP/s per chip; matched against device_kind in
# order (first match wins), case-insensitively.
PEAK_FLOPS = (
    ("v6 lite", 918e12), ("v6e", 918e12),
    ("v5 lite", 197e12), ("v5e", 197e12),
    ("v5p", 459e12), ("v5", 459e12),
    ("v4", 275e12),
    ("h200", 989e12), ("gh200", 989e12),
    ("h100 pcie", 756e12), ("h100", 989e12),
    ("a100", 312e12),
)


def peak_flops(device=None) -> float | None:
  """Peak FLOP/s of ``device`` (default: the first device), or None."""
  device = jax.devices()[0] if device is None else device
  if device.platform == "cpu":
    return None
  kind = device.device_kind.lower()
  for key, value in PEAK_FLOPS:
    if key in kind:
      return value
  return None


def _mean_visible_keys(seq_len: int, window: int | None) -> float:
  if window is None or window >= seq_len:
    return (seq_len + 1) / 2
  positions = np.arange(1, seq_len + 1)
  return float(np.minimum(positions, window).mean())


def _nsa_mean_keys(seq_len: int, block_size: int, block_counts: int,
                   window: int | None) -> float:
  """Per query at position ``t``: its ``(t + 1) // l`` complete blocks, at
  most ``n l`` selected tokens and ``min(w, t + 1)`` window keys."""
  seen = np.arange(1, seq_len + 1)
  keys = seen // block_size + np.minimum(seen, block_counts * block_size)
  if window is not None:
    keys = keys + np.minimum(seen, window)
  return float(keys.mean())


def mixing_flops_per_token(mixer, seq_len: int) -> float:
  """Forward FLOPs of ``mixer``'s sequence mixing per token (module doc)."""
  from lin_attn_jax.layers.nsa import NativeSparseAttention
  from lin_attn_jax.layers.softmax import CausalAttention
  if isinstance(mixer, NativeSparseAttention):
    keys = _nsa_mean_keys(seq_len, mixer.block_size, mixer.block_counts,
                          mixer.window_size)
    return 4.0 * keys * mixer.n_heads * mixer.head_dim
  if isinstance(mixer, CausalAttention):
    keys = _mean_visible_keys(seq_len, getattr(mixer, "window_size", None))
    heads = mixer.q_proj.out_features // mixer.head_dim
    return 4.0 * keys * heads * mixer.head_dim
  if not getattr(mixer, "causal", True):
    return 0.0
  return 4.0 * mixer.state_size(seq_len)


def flops_per_token(model, seq_len: int) -> float:
  """Training FLOPs per token (forward + backward) of an ``LM`` (or of a
  model of ``models.encoder``, whose blocks are its ``encoder``'s)."""
  params = nnx.state(model, nnx.Param)
  stack = getattr(model, "encoder", model)
  embed = getattr(stack, "embed", None)
  table = None if embed is None else id(embed.embedding)
  matrix = 0
  for _, variable in nnx.to_flat_state(params):
    if id(variable) == table:
      continue
    shape = np.shape(variable.get_value())
    if len(shape) >= 2:
      matrix += math.prod(shape)
  if embed is not None and getattr(model, "lm_head", False) is None:
    matrix += math.prod(np.shape(embed.embedding.get_value()))
  mixing = sum(mixing_flops_per_token(block.mixer, seq_len)
               for block in stack.blocks if block.mixer is not None)
  return 3.0 * (2.0 * matrix + mixing)


def mfu(tokens_per_second: float, flops_token: float,
        devices=None) -> float | None:
  """Model FLOPs utilisation, or None when the devices have no known peak."""
  devices = jax.devices() if devices is None else list(devices)
  peaks = [peak_flops(d) for d in devices]
  if not peaks or any(p is None for p in peaks):
    return None
  return tokens_per_second * flops_token / sum(peaks)
