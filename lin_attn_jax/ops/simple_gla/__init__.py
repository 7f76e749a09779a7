"""Simple GLA: a scalar log-decay per head and token (data-dependent ``g``)
or per head (constant ``g_gamma``). ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
``o_t = S_t^T (scale q_t)``. Lightning attention and Mamba-2's SSD are
instances (https://arxiv.org/abs/2312.06635, https://arxiv.org/abs/2405.21060).
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.gated_linear import (chunk_gated_linear,
                                           gated_linear_step,
                                           naive_recurrent_gated_linear,
                                           parallel_gated_linear,
                                           recurrent_gated_linear)


def scalar_decay(q, g, g_gamma, lead_layout="[B, T, H]"):
  """Resolves ``g`` / ``g_gamma`` to one scalar log-decay per head and token.

  ``q`` is ``[B, T, H, K]`` (or ``[B, H, K]`` for a step); returns ``None``
  (no decay), ``g`` itself, or ``g_gamma`` broadcast to ``q.shape[:-1]``.
  """
  checks.check_rank("q", q, len(lead_layout.split(",")) + 1,
                    lead_layout[:-1] + ", K]")
  lead = tuple(q.shape[:-1])
  if g is not None and g_gamma is not None:
    raise ValueError(f"give g or g_gamma, not both (g {checks.shape_of(g)}, "
                     f"g_gamma {checks.shape_of(g_gamma)})")
  if g is not None:
    checks.check_shape("g", g, lead, lead_layout)
    return g
  if g_gamma is None:
    return None
  checks.check_float("g_gamma", g_gamma)
  checks.check_shape("g_gamma", g_gamma, lead[-1:], "[H]")
  return jnp.broadcast_to(jnp.asarray(g_gamma, jnp.float32), lead)


def naive_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None,
                               initial_state=None, output_final_state=False,
                               segment_ids=None):
  """Reference recurrence; arguments as in ``chunk_simple_gla``."""
  return naive_recurrent_gated_linear(
      q, k, v, scalar_decay(q, g, g_gamma), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def parallel_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None):
  """Quadratic masked form; arguments as in ``chunk_simple_gla``."""
  return parallel_gated_linear(
      q, k, v, scalar_decay(q, g, g_gamma), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None,
                     initial_state=None, output_final_state=False,
                     segment_ids=None, chunk_size=64, impl="auto"):
  """Chunkwise simple GLA.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: data-dependent log-decay ``[B, T, H]``, ``<= 0``; or
    g_gamma: constant log-decay per head ``[H]``, ``<= 0`` (not both; neither
      means no decay).
    scale, initial_state ``[B, H, K, V]``, output_final_state, segment_ids
      ``[B, T]``, chunk_size, impl: as in ``chunk_gated_linear``.
  Returns:
    ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.
  """
  return chunk_gated_linear(
      q, k, v, scalar_decay(q, g, g_gamma), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)


def recurrent_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None,
                         initial_state=None, output_final_state=False,
                         segment_ids=None):
  """Token-by-token scan; arguments as in ``chunk_simple_gla``."""
  return recurrent_gated_linear(
      q, k, v, scalar_decay(q, g, g_gamma), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def simple_gla_step(q, k, v, g=None, state=None, *, g_gamma=None, scale=None,
                    reset=None):
  """One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``, g ``[B, H]``
  (or ``g_gamma [H]``), state ``[B, H, K, V]``. Returns ``(o, state)``."""
  return gated_linear_step(q, k, v, scalar_decay(q, g, g_gamma, "[B, H]"),
                           state, scale=scale, reset=reset)
