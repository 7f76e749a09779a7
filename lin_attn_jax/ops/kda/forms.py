"""Kimi Delta Attention: the delta-rule core with a log-decay per key channel.

    S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture"
(https://arxiv.org/abs/2510.26692). The argument order ``(q, k, v, g,
beta)`` is the usual one for this op; shapes, options and returns are those
of ``lin_attn_jax.ops.delta_rule.chunk_delta_rule`` with ``g: [B, T, HV, K]``
(``[B, HV, K]`` for the step). The chunk form keeps every decay factor
``exp`` of a sum of gates (<= 1), so strong per-channel gates underflow to 0
instead of overflowing.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule import (chunk_delta_rule, delta_rule_step,
                                         naive_recurrent_delta_rule,
                                         parallel_delta_rule,
                                         recurrent_delta_rule)


def _check_gate(g, rank, layout):
  checks.check_rank("g", g, rank, layout)


def naive_recurrent_kda(q, k, v, g, beta, **options):
  """Reference recurrence; ``g: [B, T, HV, K]``."""
  _check_gate(g, 4, "[B, T, HV, K]")
  return naive_recurrent_delta_rule(q, k, v, beta, g, **options)


def parallel_kda(q, k, v, g, beta, **options):
  """Quadratic form; ``g: [B, T, HV, K]``."""
  _check_gate(g, 4, "[B, T, HV, K]")
  return parallel_delta_rule(q, k, v, beta, g, **options)


def chunk_kda(q, k, v, g, beta, **options):
  """Chunkwise form (WY representation), the training path.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g: ``[B, T, HV, K]``
      log-decay ``<= 0``; beta: ``[B, T, HV]``.
    **options: ``scale, initial_state, output_final_state, segment_ids,
      chunk_size, sub_chunk_size, use_qk_l2norm, impl`` as in
      ``chunk_delta_rule`` (``impl="pallas"``: the sweep over chunks and its
      backward pass as Pallas kernels, the WY terms in XLA).
  Returns:
    ``(o [B, T, HV, V], final_state [B, HV, K, V] or None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2, 16), -0.1); beta = jnp.full((1, 100, 2), 0.5)
    >>> o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm=True)
    >>> o.shape
    (1, 100, 2, 32)
  """
  _check_gate(g, 4, "[B, T, HV, K]")
  return chunk_delta_rule(q, k, v, beta, g, **options)


def recurrent_kda(q, k, v, g, beta, **options):
  """``kda_step`` scanned over time; ``g: [B, T, HV, K]``."""
  _check_gate(g, 4, "[B, T, HV, K]")
  return recurrent_delta_rule(q, k, v, beta, g, **options)


def kda_step(q, k, v, g, beta, state=None, **options):
  """One decoding step; ``g: [B, HV, K]``, options ``scale, reset,
  use_qk_l2norm``. Returns ``(o [B, HV, V], state [B, HV, K, V])``."""
  _check_gate(g, 3, "[B, HV, K]")
  return delta_rule_step(q, k, v, beta, g, state, **options)
