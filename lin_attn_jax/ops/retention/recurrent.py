"""The token-by-token scan of RetNet retention, built on
``recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.recurrent import recurrent_gated_linear
from lin_attn_jax.ops.retention.inputs import RETENTION

recurrent_retention = RETENTION.form(
    recurrent_gated_linear, __name__, doc="""\
Token-by-token scan (RetNet's recurrent representation).
""")
