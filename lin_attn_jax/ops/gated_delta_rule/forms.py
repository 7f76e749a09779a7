"""Gated DeltaNet: the delta-rule core with a scalar log-decay per head.

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
Delta Rule" (https://arxiv.org/abs/2412.06464). The argument order
``(q, k, v, g, beta)`` is the usual one for this op; shapes, options and
returns are those of ``lin_attn_jax.ops.delta_rule.chunk_delta_rule`` with
``g: [B, T, HV]`` (``[B, HV]`` for the step).
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule import (chunk_delta_rule, delta_rule_step,
                                         naive_recurrent_delta_rule,
                                         parallel_delta_rule,
                                         recurrent_delta_rule)


def _check_gate(g, rank, layout):
  checks.check_rank("g", g, rank, layout)


def naive_recurrent_gated_delta_rule(q, k, v, g, beta, **options):
  """Reference recurrence; ``g: [B, T, HV]``."""
  _check_gate(g, 3, "[B, T, HV]")
  return naive_recurrent_delta_rule(q, k, v, beta, g, **options)


def parallel_gated_delta_rule(q, k, v, g, beta, **options):
  """Quadratic form; ``g: [B, T, HV]``."""
  _check_gate(g, 3, "[B, T, HV]")
  return parallel_delta_rule(q, k, v, beta, g, **options)


def chunk_gated_delta_rule(q, k, v, g, beta, **options):
  """Chunkwise form (WY representation), the training path.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV]`` log-decay
      ``<= 0``; beta: ``[B, T, HV]``.
    **options: ``scale, initial_state, output_final_state, segment_ids,
      chunk_size, sub_chunk_size, use_qk_l2norm, impl`` as in
      ``chunk_delta_rule`` (``impl="pallas"``: the sweep over chunks and its
      backward pass as Pallas kernels, the WY terms in XLA).
  Returns:
    ``(o [B, T, HV, V], final_state [B, HV, K, V] or None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); beta = jnp.full((1, 100, 2), 0.5)
    >>> o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    >>> o.shape
    (1, 100, 2, 32)
  """
  _check_gate(g, 3, "[B, T, HV]")
  return chunk_delta_rule(q, k, v, beta, g, **options)


def recurrent_gated_delta_rule(q, k, v, g, beta, **options):
  """``gated_delta_rule_step`` scanned over time; ``g: [B, T, HV]``."""
  _check_gate(g, 3, "[B, T, HV]")
  return recurrent_delta_rule(q, k, v, beta, g, **options)


def gated_delta_rule_step(q, k, v, g, beta, state=None, **options):
  """One decoding step; ``g: [B, HV]``, options ``scale, reset,
  use_qk_l2norm``. Returns ``(o [B, HV, V], state [B, HV, K, V])``."""
  _check_gate(g, 2, "[B, HV]")
  return delta_rule_step(q, k, v, beta, g, state, **options)
