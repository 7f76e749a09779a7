"""One decoding step of linear attention, built on ``gated_linear_step``."""

from lin_attn_jax.ops.gated_linear.step import gated_linear_step
from lin_attn_jax.ops.linear_attn.inputs import LINEAR_ATTN

linear_attn_step = LINEAR_ATTN.form(
    gated_linear_step, __name__, doc="""\
One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``, state
``[B, H, K, V]`` (``V + 1`` when normalizing). Returns ``(o, state)``.
""")
