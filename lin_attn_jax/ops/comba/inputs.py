"""Validation and preparation of Comba's inputs.

Grouped value heads as in the delta-rule core (``delta_rule/inputs.py``): q,
k and the erase key p have ``H`` heads; v, g, beta and the state have
``HV``, a multiple of ``H``, and value head ``j`` reads query/key head ``j
// (HV // H)``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule.inputs import (check_call, default_scale,
                                                expand_query_key,
                                                l2_normalize)
from lin_attn_jax.ops.gated_linear.inputs import normalise_gate

__all__ = ["core_inputs", "default_scale", "expand_erase_key", "validate",
           "validate_step"]

_F32 = jnp.float32


def _check(q, p, g, beta, lead, lead_layout, hv, dk, dv):
  """p like q; g and beta ``lead + [HV]``, g a log-decay. Returns g
  float32 ``lead + [HV, 1]``."""
  layout = "[" + ", ".join(lead_layout)
  checks.check_float("p", p)
  if checks.shape_of(p) != checks.shape_of(q):
    raise ValueError(f"p must have the shape of q {layout}, H, K] = "
                     f"{checks.shape_of(q)}, got {checks.shape_of(p)}")
  g = normalise_gate(g, tuple(lead) + (hv,), dk, "g", ("scalar",),
                     layout + ", HV]")
  if g is None:
    raise ValueError(f"g must be a log-decay of shape {layout}, HV], got "
                     "None")
  checks.check_float("beta", beta)
  checks.check_shape("beta", beta, tuple(lead) + (hv,), layout + ", HV]")
  return g


def validate(q, k, v, p, g, beta, initial_state, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, HV, K, V, g [B, T, HV,
  1])``."""
  (bs, t), h, hv, dk, dv, g = check_call(
      q, k, v, initial_state, segment_ids,
      functools.partial(_check, q, p, g, beta), step=False)
  return bs, t, h, hv, dk, dv, g


def validate_step(q, k, v, p, g, beta, state, reset):
  """Checks a decoding step; returns ``(B, H, HV, K, V, g [B, HV, 1])``."""
  (bs,), h, hv, dk, dv, g = check_call(
      q, k, v, state, reset, functools.partial(_check, q, p, g, beta),
      step=True)
  return bs, h, hv, dk, dv, g


def expand_erase_key(p, hv: int, use_qk_l2norm: bool):
  """float32 p (L2-normalised if asked) repeated to ``HV`` heads: ``[...,
  H, K] -> [..., HV, K]``."""
  p = l2_normalize(p) if use_qk_l2norm else jnp.asarray(p, _F32)
  if hv > p.shape[-2]:
    p = jnp.repeat(p, hv // p.shape[-2], axis=-2)
  return p


def core_inputs(q, k, v, p, g, beta, hv: int, use_qk_l2norm: bool):
  """The float32 inputs of the delta-rule WY form (README.md).

  Args:
    g: the validated log-decay, float32 ``[..., HV, 1]``.
  Returns:
    ``(q, k, erase, written, g)``: q, k and p L2-normalised if asked (as
    flash-linear-attention's ``use_qk_l2norm_in_kernel`` does all three)
    and repeated to the ``HV`` value heads, the erase key ``beta * p`` (the
    row of the triangular system) and the written value ``beta * v``,
    shaped like their inputs.
  """
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [..,HV,K]
  p = expand_erase_key(p, hv, use_qk_l2norm)                    # [..,HV,K]
  beta = jnp.asarray(beta, _F32)[..., None]                     # [..,HV,1]
  written = beta * jnp.asarray(v, _F32)                         # [..,HV,V]
  return q, k, beta * p, written, g
