"""The reference recurrence of GLA, built on
``naive_recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.naive import naive_recurrent_gated_linear
from lin_attn_jax.ops.gla.inputs import GLA

naive_recurrent_gla = GLA.form(
    naive_recurrent_gated_linear, __name__, doc="""\
Reference recurrence; arguments as in ``chunk_gla``.
""")
