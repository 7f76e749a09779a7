"""The chunkwise form of linear attention, built on ``chunk_gated_linear``."""

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.linear_attn.inputs import LINEAR_ATTN

chunk_linear_attn = LINEAR_ATTN.form(
    chunk_gated_linear, __name__, doc="""\
Chunkwise linear attention.

Args:
  q, k: ``[B, T, H, K]`` (features already mapped); v: ``[B, T, H, V]``.
  scale: query scale, ``K ** -0.5`` when None.
  normalize: divide by ``q_t . sum_{j<=t} k_j`` (positive features).
  initial_state: ``[B, H, K, V]`` (``V + 1`` when normalizing) float32.
  output_final_state: also return the state after the last token.
  segment_ids: ``[B, T]`` int; the state resets where the id changes.
  chunk_size: tokens per chunk (speed only).
  impl: ``"auto"``, ``"xla"`` or ``"pallas"``, as in ``chunk_gated_linear``.
Returns:
  ``(o [B, T, H, V], final_state or None)``.
""")
