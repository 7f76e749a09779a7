"""Argument checks and the shared pieces of the ReLU linear attention
forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks

RELU_EPS = 1e-15

NOT_CAUSAL = (
    "relu_linear_attn is EfficientViT's non-causal attention; for causal "
    "ReLU linear attention use chunk_linear_attn on feature_maps.relu "
    "features with normalize=True")


def check_inputs(q, k, v, segment_ids, causal):
  """``(B, T, H, K, V)``; raises ``ValueError`` for bad shapes or
  ``causal=True``."""
  if causal:
    raise ValueError(NOT_CAUSAL)
  dims = checks.check_qkv(q, k, v)
  if segment_ids is not None:
    checks.check_segment_ids(segment_ids, dims[0], dims[1])
  return dims


def features(x):
  """``relu(x)`` in float32."""
  return jax.nn.relu(jnp.asarray(x, jnp.float32))


def divide(o_aug, dtype, eps):
  """``num / (den + eps)``: the last column of ``o_aug [..., V + 1]`` is
  ``den``; float32 division, then ``dtype``."""
  return (o_aug[..., :-1] / (o_aug[..., -1:] + eps)).astype(dtype)
