"""The reference recurrence of linear attention, built on
``naive_recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.naive import naive_recurrent_gated_linear
from lin_attn_jax.ops.linear_attn.inputs import LINEAR_ATTN

naive_recurrent_linear_attn = LINEAR_ATTN.form(
    naive_recurrent_gated_linear, __name__, doc="""\
Reference recurrence; arguments as in ``chunk_linear_attn``.
""")
