"""One decoding step of GLA, built on ``gated_linear_step``."""

from lin_attn_jax.ops.gated_linear.step import gated_linear_step
from lin_attn_jax.ops.gla.inputs import GLA

gla_step = GLA.form(
    gated_linear_step, __name__, doc="""\
One decoding step: q, k, g ``[B, H, K]``, v ``[B, H, V]``, state
``[B, H, K, V]``. Returns ``(o [B, H, V], state)``.
""")
