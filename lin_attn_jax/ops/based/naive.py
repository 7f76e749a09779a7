"""The reference recurrence of Based, built on
``naive_recurrent_linear_attn``."""

from lin_attn_jax.ops.linear_attn.naive import naive_recurrent_linear_attn
from lin_attn_jax.ops.based.inputs import BASED

naive_recurrent_based = BASED.form(
    naive_recurrent_linear_attn, __name__, doc="""\
Reference recurrence; arguments as in ``chunk_based``.
""")
