"""The reference recurrence of simple GLA, built on
``naive_recurrent_gated_linear``."""

from lin_attn_jax.ops.gated_linear.naive import naive_recurrent_gated_linear
from lin_attn_jax.ops.simple_gla.inputs import SIMPLE_GLA

naive_recurrent_simple_gla = SIMPLE_GLA.form(
    naive_recurrent_gated_linear, __name__, doc="""\
Reference recurrence; arguments as in ``chunk_simple_gla``.
""")
