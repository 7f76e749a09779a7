"""Validation and normalisation of the gated-linear-attention core's inputs."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks


def default_scale(scale, dk: int) -> float:
  return dk ** -0.5 if scale is None else scale


def validate(q, k, v, g, initial_state, segment_ids, *, gate_name="g",
             gate_kinds=("scalar", "channel")):
  """Checks a sequence call and returns ``(B, T, H, K, V, g)``.

  ``g`` comes back as float32 ``[B, T, H, G]`` with ``G`` 1 (a scalar decay
  per head) or ``K`` (a decay per key channel), or ``None`` (no decay).
  """
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  g = normalise_gate(g, (b, t, h), dk, gate_name, gate_kinds, "[B, T, H]")
  checks.check_state("initial_state", initial_state, (b, h, dk, dv),
                     "[B, H, K, V]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, dk, dv, g


def validate_step(q, k, v, g, state, reset, *, gate_name="g",
                  gate_kinds=("scalar", "channel")):
  """Checks a decoding step and returns ``(B, H, K, V, g)``, g ``[B, H, G]``."""
  b, h, dk, dv = checks.check_qkv_step(q, k, v)
  g = normalise_gate(g, (b, h), dk, gate_name, gate_kinds, "[B, H]")
  checks.check_state("state", state, (b, h, dk, dv), "[B, H, K, V]")
  checks.check_reset(reset, b)
  return b, h, dk, dv, g


def normalise_gate(g, lead, dk, name, kinds, lead_layout):
  """Log-decay ``lead`` or ``lead + (K,)`` -> float32 ``lead + (1 | K,)``."""
  if g is None:
    return None
  checks.check_float(name, g)
  shape = checks.shape_of(g)
  expected = []
  if "scalar" in kinds:
    expected.append((tuple(lead), lead_layout))
  if "channel" in kinds:
    expected.append((tuple(lead) + (dk,), lead_layout[:-1] + ", K]"))
  if shape not in [e for e, _ in expected]:
    options = " or ".join(f"{e} {lay}" for e, lay in expected)
    raise ValueError(f"{name} must have shape {options}, got {shape}")
  checks.check_nonpositive(name, g)
  g = jnp.asarray(g, jnp.float32)
  return g[..., None] if shape == tuple(lead) else g
