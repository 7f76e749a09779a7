"""Validation and preparation of Gated DeltaNet-2's inputs.

Grouped value heads as in the delta-rule core (``delta_rule/inputs.py``): q
and k have ``H`` heads; v, the gates g, b, w and the state have ``HV``, a
multiple of ``H``, and value head ``j`` reads query/key head ``j // (HV //
H)``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule.inputs import (check_call, default_scale,
                                                expand_query_key)
from lin_attn_jax.ops.gated_linear.inputs import normalise_gate

__all__ = ["core_inputs", "default_scale", "expand_query_key", "validate",
           "validate_step"]

_F32 = jnp.float32


def _check_gates(g, b, w, lead, lead_layout, hv, dk, dv):
  """g and b ``lead + [HV, K]``, w ``lead + [HV, V]``; g is a log-decay."""
  layout = "[" + ", ".join(lead_layout)
  normalise_gate(g, tuple(lead) + (hv,), dk, "g", ("channel",),
                 layout + ", HV]")
  for name, x, width, tail in (("b", b, dk, "HV, K]"), ("w", w, dv, "HV, V]")):
    checks.check_float(name, x)
    checks.check_shape(name, x, tuple(lead) + (hv, width), f"{layout}, {tail}")


def validate(q, k, v, g, b, w, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, HV, K, V)``."""
  (bs, t), h, hv, dk, dv, _ = check_call(
      q, k, v, initial_state, segment_ids,
      functools.partial(_check_gates, g, b, w), step=False)
  return bs, t, h, hv, dk, dv


def validate_step(q, k, v, g, b, w, state, reset):
  """Checks a decoding step; returns ``(B, H, HV, K, V)``."""
  (bs,), h, hv, dk, dv, _ = check_call(
      q, k, v, state, reset, functools.partial(_check_gates, g, b, w),
      step=True)
  return bs, h, hv, dk, dv


def core_inputs(q, k, v, g, b, w, hv: int, use_qk_l2norm: bool):
  """The float32 inputs of the delta-rule WY form (README.md).

  Returns ``(q, k, erase, written, g)``: q and k L2-normalised if asked and
  repeated to the ``HV`` value heads, the erase key ``b * k`` (the row of
  the triangular system) and the written value ``w * v``, shaped like
  their inputs.
  """
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [..,HV,K]
  erase = jnp.asarray(b, _F32) * k                              # [..,HV,K]
  written = jnp.asarray(w, _F32) * jnp.asarray(v, _F32)         # [..,HV,V]
  return q, k, erase, written, jnp.asarray(g, _F32)
