"""The token-by-token scan of GLA, built on ``recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.recurrent import recurrent_gated_linear
from lin_attn_jax.ops.gla.inputs import GLA

recurrent_gla = GLA.form(
    recurrent_gated_linear, __name__, doc="""\
Token-by-token scan; arguments as in ``chunk_gla``.
""")
