"""The chunked form: the training path, on the gated-linear core."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks, dispatch
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.log_linear_attn.terms import on_core


def chunk_log_linear_attn(q, k, v, g, level_scales, *, scale=None,
                          initial_state=None, output_final_state=False,
                          segment_ids=None, offset=0, chunk_size=64,
                          sub_chunk_size=8, impl="auto"):
  """Log-linear attention, chunkwise: ``chunk_gated_linear`` on the block
  terms (``terms.py``, the mapping in the README).

  Arguments as in ``naive_recurrent_log_linear_attn``, plus
  ``chunk_size``, ``sub_chunk_size`` and ``impl`` of
  ``chunk_gated_linear`` (speed only; ``impl="auto"`` runs its Pallas
  kernel on TPU). Under a mesh with a ``"sequence"`` axis the core splits
  the sequence (``gated_linear/context_parallel.py``).

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); lam = jnp.ones((1, 100, 2, 8))
    >>> o, s = chunk_log_linear_attn(q, k, v, g, lam,
    ...                              output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 8, 16, 32))
  """
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  return on_core(chunk_gated_linear, q, k, v, g, level_scales, scale=scale,
                 initial_state=initial_state,
                 output_final_state=output_final_state,
                 segment_ids=segment_ids, offset=offset,
                 chunk_size=chunk_size, sub_chunk_size=sub_chunk_size,
                 impl=impl)
