"""One decoding step of RetNet retention, built on ``gated_linear_step``."""

from lin_attn_jax.ops.gated_linear.step import gated_linear_step
from lin_attn_jax.ops.retention.inputs import RETENTION

retention_step = RETENTION.form(
    gated_linear_step, __name__, doc="""\
One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``.
""")
