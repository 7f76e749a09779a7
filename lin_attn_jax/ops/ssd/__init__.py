"""Mamba-2's state-space dual (SSD): a scalar-decay variant of the GLA core."""

from lin_attn_jax.ops.ssd.gated_linear_forms import chunk_ssd, parallel_ssd
from lin_attn_jax.ops.ssd.naive import naive_recurrent_ssd
from lin_attn_jax.ops.ssd.recurrent import recurrent_ssd, ssd_step

__all__ = [
    "chunk_ssd",
    "naive_recurrent_ssd",
    "parallel_ssd",
    "recurrent_ssd",
    "ssd_step",
]
