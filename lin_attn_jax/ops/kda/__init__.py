"""Kimi Delta Attention on the delta-rule core (log-decay per key channel)."""

from lin_attn_jax.ops.kda.forms import (chunk_kda, kda_step,
                                        naive_recurrent_kda, parallel_kda,
                                        recurrent_kda)

__all__ = [
    "chunk_kda",
    "kda_step",
    "naive_recurrent_kda",
    "parallel_kda",
    "recurrent_kda",
]
