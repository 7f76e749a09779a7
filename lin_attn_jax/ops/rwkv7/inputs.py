"""Validation of RWKV-7's inputs."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.gated_linear.inputs import default_scale, normalise_gate

__all__ = ["default_scale", "validate", "validate_step"]


def _check_low_rank(a, b, expected, layout):
  for name, x in (("a", a), ("b", b)):
    checks.check_float(name, x)
    checks.check_shape(name, x, expected, layout)


def validate(r, w, k, v, a, b, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, K, V)``."""
  bs, t, h, dk, dv = checks.check_qkv(r, k, v, names=("r", "k", "v"))
  checks.check_rank("w", w, 4, "[B, T, H, K]")
  normalise_gate(w, (bs, t, h), dk, "w", ("channel",), "[B, T, H]")
  _check_low_rank(a, b, (bs, t, h, dk), "[B, T, H, K]")
  checks.check_state("initial_state", initial_state, (bs, h, dk, dv),
                     "[B, H, K, V]")
  checks.check_segment_ids(segment_ids, bs, t)
  return bs, t, h, dk, dv


def validate_step(r, w, k, v, a, b, state, reset):
  """Checks a decoding step; returns ``(B, H, K, V)``."""
  bs, h, dk, dv = checks.check_qkv_step(r, k, v, names=("r", "k", "v"))
  checks.check_rank("w", w, 3, "[B, H, K]")
  normalise_gate(w, (bs, h), dk, "w", ("channel",), "[B, H]")
  _check_low_rank(a, b, (bs, h, dk), "[B, H, K]")
  checks.check_state("state", state, (bs, h, dk, dv), "[B, H, K, V]")
  checks.check_reset(reset, bs)
  return bs, h, dk, dv
