"""Validation and preparation of the delta-rule core's inputs.

Grouped value heads: q and k have ``H`` heads, v, beta, g and the state have
``HV`` heads, a multiple of ``H``. Value head ``j`` reads query/key head
``j // (HV // H)`` (consecutive value heads share a key head), and the state
is ``[B, HV, K, V]``, one ``[K, V]`` matrix per value head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.gated_linear.inputs import default_scale, normalise_gate

__all__ = ["check_call", "check_value_heads", "default_scale",
           "expand_query_key", "gate_before_beta", "l2_normalize", "validate",
           "validate_step"]

L2_EPS = 1e-6


def l2_normalize(x, eps: float = L2_EPS):
  """``x / sqrt(sum(x^2) + eps)`` over the last axis, in float32."""
  x = jnp.asarray(x, jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def check_value_heads(q, k, v, lead_layout):
  """Shape checks of q/k ``lead + [H, K]`` and v ``lead + [HV, V]``, ``HV``
  a multiple of ``H``; returns ``(lead, H, HV, K, V)``."""
  rank = len(lead_layout) + 2
  lead = ", ".join(lead_layout)
  for name, x, tail in (("q", q, "H, K"), ("k", k, "H, K"), ("v", v, "HV, V")):
    checks.check_rank(name, x, rank, f"[{lead}, {tail}]")
    checks.check_float(name, x)
  qs, vs = checks.shape_of(q), checks.shape_of(v)
  if checks.shape_of(k) != qs:
    raise ValueError(f"k must have the shape of q [{lead}, H, K] = {qs}, got "
                     f"{checks.shape_of(k)}")
  if vs[:-2] != qs[:-2]:
    raise ValueError(f"v must agree with q on [{lead}] = {qs[:-2]}, got v of "
                     f"shape {vs}")
  h, hv = qs[-2], vs[-2]
  if hv % h:
    raise ValueError(f"v has HV={hv} heads, which must be a multiple of the "
                     f"H={h} heads of q and k (q {qs}, v {vs})")
  return qs[:-2], h, hv, qs[-1], vs[-1]


def check_call(q, k, v, state, positions, check_gates, *, step: bool):
  """The checks of a call with grouped value heads, in this order: q, k and
  v (``check_value_heads``), ``check_gates(lead, lead_layout, HV, K, V)``
  (the variant's own arguments), the state ``[B, HV, K, V]`` and the
  positions: a sequence call (q ``[B, T, H, K]``) takes ``initial_state``
  and ``segment_ids``, a decoding step (``step``, q ``[B, H, K]``)
  ``state`` and ``reset``.

  Returns:
    ``(lead, H, HV, K, V, check_gates' result)``.
  """
  lead_layout = ("B",) if step else ("B", "T")
  lead, h, hv, dk, dv = check_value_heads(q, k, v, lead_layout)
  gates = check_gates(lead, lead_layout, hv, dk, dv)
  checks.check_state("state" if step else "initial_state", state,
                     (lead[0], hv, dk, dv), "[B, HV, K, V]")
  if step:
    checks.check_reset(positions, lead[0])
  else:
    checks.check_segment_ids(positions, *lead)
  return lead, h, hv, dk, dv, gates


def _check_gates(beta, g, gate_kinds, lead, lead_layout, hv, dk, dv):
  """beta ``lead + [HV]``; returns g normalised (``normalise_gate``)."""
  layout = "[" + ", ".join(lead_layout) + ", HV]"
  checks.check_float("beta", beta)
  checks.check_shape("beta", beta, tuple(lead) + (hv,), layout)
  return normalise_gate(g, tuple(lead) + (hv,), dk, "g", gate_kinds, layout)


def validate(q, k, v, beta, g, initial_state, segment_ids, *,
             gate_kinds=("scalar", "channel")):
  """Checks a sequence call.

  Returns:
    ``(B, T, H, HV, K, V, g)`` with ``g`` float32 ``[B, T, HV, G]`` (``G`` 1
    or ``K``) or None.
  """
  (b, t), h, hv, dk, dv, g = check_call(
      q, k, v, initial_state, segment_ids,
      functools.partial(_check_gates, beta, g, gate_kinds), step=False)
  return b, t, h, hv, dk, dv, g


def validate_step(q, k, v, beta, g, state, reset, *,
                  gate_kinds=("scalar", "channel")):
  """Checks a decoding step; returns ``(B, H, HV, K, V, g [B, HV, G])``."""
  (b,), h, hv, dk, dv, g = check_call(
      q, k, v, state, reset,
      functools.partial(_check_gates, beta, g, gate_kinds), step=True)
  return b, h, hv, dk, dv, g


def expand_query_key(q, k, hv: int, use_qk_l2norm: bool):
  """float32 q, k (L2-normalised if asked) repeated to ``HV`` heads.

  The head axis is the second to last: ``[..., H, K] -> [..., HV, K]``.
  """
  q = l2_normalize(q) if use_qk_l2norm else jnp.asarray(q, jnp.float32)
  k = l2_normalize(k) if use_qk_l2norm else jnp.asarray(k, jnp.float32)
  groups = hv // q.shape[-2]
  if groups > 1:
    q = jnp.repeat(q, groups, axis=-2)
    k = jnp.repeat(k, groups, axis=-2)
  return q, k


def gate_before_beta(layout: str, step_layout: str):
  """``Variant.to_core`` for a gated variant that takes ``(q, k, v, g, beta)``:
  checks g's rank against ``layout`` (``step_layout`` for the step) and
  returns the core's ``(q, k, v, beta, g)``."""

  def to_core(step, q, k, v, g, beta):
    expected = step_layout if step else layout
    checks.check_rank("g", g, len(expected.split(",")), expected)
    return q, k, v, beta, g

  return to_core
