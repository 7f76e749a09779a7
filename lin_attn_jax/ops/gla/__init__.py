"""Gated Linear Attention (Yang et al. 2024, https://arxiv.org/abs/2312.06635):
a log-decay per key channel, ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``,
``o_t = S_t^T (scale q_t)``.

The chunk form stays finite and exact with strong gates (log-decays of -20
per token and far below): it uses sub-chunk-local cumulative sums in which
every exponential is a decay ``<= 1`` (see ``gated_linear/chunk.py``).
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.gated_linear import (chunk_gated_linear,
                                           gated_linear_step,
                                           naive_recurrent_gated_linear,
                                           parallel_gated_linear,
                                           recurrent_gated_linear)


def _channel_gate(q, g, layout):
  """``g`` must have q's shape; q's rank is checked first, so that a wrong
  q is named as such."""
  checks.check_rank("q", q, len(layout.split(",")), layout)
  checks.check_shape("g", g, tuple(q.shape), layout)
  return g


def naive_recurrent_gla(q, k, v, g, *, scale=None, initial_state=None,
                        output_final_state=False, segment_ids=None):
  """Reference recurrence; arguments as in ``chunk_gla``."""
  return naive_recurrent_gated_linear(
      q, k, v, _channel_gate(q, g, "[B, T, H, K]"), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def parallel_gla(q, k, v, g, *, scale=None, initial_state=None,
                 output_final_state=False, segment_ids=None):
  """Quadratic masked form; arguments as in ``chunk_gla``."""
  return parallel_gated_linear(
      q, k, v, _channel_gate(q, g, "[B, T, H, K]"), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def chunk_gla(q, k, v, g, *, scale=None, initial_state=None,
              output_final_state=False, segment_ids=None, chunk_size=64,
              impl="auto"):
  """Chunkwise GLA.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: log-decay per key channel ``[B, T, H, K]``, ``<= 0``.
    scale, initial_state ``[B, H, K, V]``, output_final_state, segment_ids
      ``[B, T]``, chunk_size, impl: as in ``chunk_gated_linear``.
  Returns:
    ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 63, 2, 16))
    ...            for i in range(3))
    >>> g = jax.nn.log_sigmoid(jax.random.normal(jax.random.PRNGKey(3),
    ...                                          (1, 63, 2, 16)))
    >>> o, state = chunk_gla(q, k, v, g, output_final_state=True)
    >>> o.shape, state.shape
    ((1, 63, 2, 16), (1, 2, 16, 16))
  """
  return chunk_gated_linear(
      q, k, v, _channel_gate(q, g, "[B, T, H, K]"), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)


def recurrent_gla(q, k, v, g, *, scale=None, initial_state=None,
                  output_final_state=False, segment_ids=None):
  """Token-by-token scan; arguments as in ``chunk_gla``."""
  return recurrent_gated_linear(
      q, k, v, _channel_gate(q, g, "[B, T, H, K]"), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def gla_step(q, k, v, g, state=None, *, scale=None, reset=None):
  """One decoding step: q, k, g ``[B, H, K]``, v ``[B, H, V]``, state
  ``[B, H, K, V]``. Returns ``(o [B, H, V], state)``."""
  return gated_linear_step(q, k, v, _channel_gate(q, g, "[B, H, K]"), state,
                           scale=scale, reset=reset)
