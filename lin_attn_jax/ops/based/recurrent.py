"""The token-by-token scan of Based, built on ``recurrent_linear_attn``."""

from lin_attn_jax.ops.linear_attn.recurrent import recurrent_linear_attn
from lin_attn_jax.ops.based.inputs import BASED

recurrent_based = BASED.form(
    recurrent_linear_attn, __name__, doc="""\
Token-by-token scan; arguments as in ``chunk_based``.
""")
