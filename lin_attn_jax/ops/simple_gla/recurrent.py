"""The token-by-token scan of simple GLA, built on
``recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.recurrent import recurrent_gated_linear
from lin_attn_jax.ops.simple_gla.inputs import SIMPLE_GLA

recurrent_simple_gla = SIMPLE_GLA.form(
    recurrent_gated_linear, __name__, doc="""\
Token-by-token scan; arguments as in ``chunk_simple_gla``.
""")
