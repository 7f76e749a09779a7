"""The reference recurrence of RetNet retention, built on
``naive_recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.naive import naive_recurrent_gated_linear
from lin_attn_jax.ops.retention.inputs import RETENTION

naive_recurrent_retention = RETENTION.form(
    naive_recurrent_gated_linear, __name__, doc="""\
Reference recurrence; arguments as in ``chunk_retention``.
""")
