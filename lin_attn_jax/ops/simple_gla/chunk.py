"""The chunkwise form of simple GLA, built on ``chunk_gated_linear``."""

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.simple_gla.inputs import SIMPLE_GLA

chunk_simple_gla = SIMPLE_GLA.form(
    chunk_gated_linear, __name__, doc="""\
Chunkwise simple GLA.

Args:
  q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
  g: data-dependent log-decay ``[B, T, H]``, ``<= 0``; or
  g_gamma: constant log-decay per head ``[H]``, ``<= 0`` (not both; neither
    means no decay).
  scale, initial_state ``[B, H, K, V]``, output_final_state, segment_ids
    ``[B, T]``, chunk_size, impl: as in ``chunk_gated_linear``.
Returns:
  ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.
""")
