"""The chunkwise form of RetNet retention, built on ``chunk_gated_linear``."""

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.retention.inputs import RETENTION

chunk_retention = RETENTION.form(
    chunk_gated_linear, __name__, doc="""\
Chunkwise retention. q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; other
arguments (``impl`` included) as in ``chunk_simple_gla``. Returns
``(o, final_state)``.
""")
