"""Validation of RWKV-6's inputs."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.reductions import times_channels
from lin_attn_jax.ops.gated_linear.inputs import default_scale, normalise_gate

__all__ = ["default_scale", "validate", "validate_step"]


def _check_bonus(u, h, dk):
  checks.check_float("u", u)
  checks.check_shape("u", u, (h, dk), "[H, K]")


def validate(r, k, v, w, u, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, K, V)``."""
  b, t, h, dk, dv = checks.check_qkv(r, k, v, names=("r", "k", "v"))
  checks.check_rank("w", w, 4, "[B, T, H, K]")
  normalise_gate(w, (b, t, h), dk, "w", ("channel",), "[B, T, H]")
  _check_bonus(u, h, dk)
  checks.check_state("initial_state", initial_state, (b, h, dk, dv),
                     "[B, H, K, V]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, dk, dv


def validate_step(r, k, v, w, u, state, reset):
  """Checks a decoding step; returns ``(B, H, K, V)``."""
  b, h, dk, dv = checks.check_qkv_step(r, k, v, names=("r", "k", "v"))
  checks.check_rank("w", w, 3, "[B, H, K]")
  normalise_gate(w, (b, h), dk, "w", ("channel",), "[B, H]")
  _check_bonus(u, h, dk)
  checks.check_state("state", state, (b, h, dk, dv), "[B, H, K, V]")
  checks.check_reset(reset, b)
  return b, h, dk, dv


def bonus(r, k, v, u, scale):
  """The current token's term ``scale * (r_t . (u * k_t)) v_t``, float32:
  RWKV-6's bonus in its chunk and parallel forms, and RWKV-7's, which its
  layer adds outside the op (``scale`` 1).

  ``u``'s gradient is a ``column_sum`` over the tokens (as a three-operand
  einsum, autodiff made it a product of transposed copies of ``r * k``;
  see docs/performance.md).
  """
  f32 = jnp.float32
  rk = scale * jnp.asarray(r, f32) * jnp.asarray(k, f32)        # [..., H, K]
  lead, (h, dk) = rk.shape[:-2], rk.shape[-2:]
  scaled = times_channels(rk.reshape(lead + (h * dk,)),
                          jnp.asarray(u, f32).reshape(h * dk))
  weight = jnp.sum(scaled.reshape(rk.shape), axis=-1)           # [..., H]
  return weight[..., None] * jnp.asarray(v, f32)
