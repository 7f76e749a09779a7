"""RetNet multi-scale retention (Sun et al. 2023,
https://arxiv.org/abs/2307.08621): simple GLA with the fixed per-head decay
``gamma_h = 1 - 2 ** (-5 - h)``, i.e. ``g_gamma[h] = log(1 - 2 ** (-5 - h))``.
The group norm and gating of the RetNet layer live in the layer, not here.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.simple_gla import (chunk_simple_gla,
                                         naive_recurrent_simple_gla,
                                         parallel_simple_gla,
                                         recurrent_simple_gla,
                                         simple_gla_step)


def retention_log_decay(num_heads: int):
  """``[H]`` float32: ``log(1 - 2 ** (-5 - h))`` for ``h = 0 .. H-1``."""
  h = jnp.arange(num_heads, dtype=jnp.float32)
  return jnp.log1p(-jnp.exp2(-5.0 - h))


def _heads(q):
  return q.shape[-2] if getattr(q, "ndim", 0) >= 3 else 0


def naive_recurrent_retention(q, k, v, *, scale=None, initial_state=None,
                              output_final_state=False, segment_ids=None):
  """Reference recurrence; arguments as in ``chunk_retention``."""
  return naive_recurrent_simple_gla(
      q, k, v, g_gamma=retention_log_decay(_heads(q)), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def parallel_retention(q, k, v, *, scale=None, initial_state=None,
                       output_final_state=False, segment_ids=None):
  """Quadratic masked form (RetNet's parallel representation)."""
  return parallel_simple_gla(
      q, k, v, g_gamma=retention_log_decay(_heads(q)), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def chunk_retention(q, k, v, *, scale=None, initial_state=None,
                    output_final_state=False, segment_ids=None, chunk_size=64,
                    impl="auto"):
  """Chunkwise retention. q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; other
  arguments (``impl`` included) as in ``chunk_simple_gla``. Returns
  ``(o, final_state)``."""
  return chunk_simple_gla(
      q, k, v, g_gamma=retention_log_decay(_heads(q)), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)


def recurrent_retention(q, k, v, *, scale=None, initial_state=None,
                        output_final_state=False, segment_ids=None):
  """Token-by-token scan (RetNet's recurrent representation)."""
  return recurrent_simple_gla(
      q, k, v, g_gamma=retention_log_decay(_heads(q)), scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)


def retention_step(q, k, v, state=None, *, scale=None, reset=None):
  """One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``."""
  return simple_gla_step(q, k, v, None, state,
                         g_gamma=retention_log_decay(_heads(q)), scale=scale,
                         reset=reset)
