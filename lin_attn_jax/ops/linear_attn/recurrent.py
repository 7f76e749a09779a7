"""The token-by-token scan of linear attention, built on
``recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.recurrent import recurrent_gated_linear
from lin_attn_jax.ops.linear_attn.inputs import LINEAR_ATTN

recurrent_linear_attn = LINEAR_ATTN.form(
    recurrent_gated_linear, __name__, doc="""\
Token-by-token scan; arguments as in ``chunk_linear_attn``.
""")
