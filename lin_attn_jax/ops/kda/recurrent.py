"""The token-by-token scan of Kimi Delta Attention, built on
``recurrent_delta_rule``."""

from lin_attn_jax.ops.delta_rule.recurrent import recurrent_delta_rule
from lin_attn_jax.ops.kda.inputs import KDA

recurrent_kda = KDA.form(
    recurrent_delta_rule, __name__, doc="""\
``kda_step`` scanned over time; ``g: [B, T, HV, K]``.
""")
