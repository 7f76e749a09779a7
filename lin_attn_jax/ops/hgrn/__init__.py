"""HGRN's gated recurrence on the diagonal-SSM core."""

from lin_attn_jax.ops.hgrn.hgrn import (chunk_hgrn, hgrn_step,
                                        naive_recurrent_hgrn, parallel_hgrn,
                                        recurrent_hgrn)

__all__ = [
    "chunk_hgrn",
    "hgrn_step",
    "naive_recurrent_hgrn",
    "parallel_hgrn",
    "recurrent_hgrn",
]
