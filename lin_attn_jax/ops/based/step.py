"""One decoding step of Based, built on ``linear_attn_step``."""

from lin_attn_jax.ops.linear_attn.step import linear_attn_step
from lin_attn_jax.ops.based.inputs import BASED

based_step = BASED.form(
    linear_attn_step, __name__, doc="""\
One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``.
""")
