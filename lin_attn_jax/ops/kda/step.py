"""One decoding step of Kimi Delta Attention, built on ``delta_rule_step``."""

from lin_attn_jax.ops.delta_rule.step import delta_rule_step
from lin_attn_jax.ops.kda.inputs import KDA

kda_step = KDA.form(
    delta_rule_step, __name__, doc="""\
One decoding step; ``g: [B, HV, K]``, options ``scale, reset,
use_qk_l2norm``. Returns ``(o [B, HV, V], state [B, HV, K, V])``.
""")
