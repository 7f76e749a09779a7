"""The reference recurrence of Kimi Delta Attention, built on
``naive_recurrent_delta_rule``."""

from lin_attn_jax.ops.delta_rule.naive import naive_recurrent_delta_rule
from lin_attn_jax.ops.kda.inputs import KDA

naive_recurrent_kda = KDA.form(
    naive_recurrent_delta_rule, __name__, doc="""\
Reference recurrence; ``g: [B, T, HV, K]``.
""")
