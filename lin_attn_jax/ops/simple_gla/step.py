"""One decoding step of simple GLA, built on ``gated_linear_step``."""

from lin_attn_jax.ops.gated_linear.step import gated_linear_step
from lin_attn_jax.ops.simple_gla.inputs import SIMPLE_GLA

simple_gla_step = SIMPLE_GLA.form(
    gated_linear_step, __name__, doc="""\
One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``, g ``[B, H]``
(or ``g_gamma [H]``), state ``[B, H, K, V]``. Returns ``(o, state)``.
""")
