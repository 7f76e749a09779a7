"""Mamba-3's SISO recurrence (trapezoidal discretisation, rotary state) on
the gated-linear core; see README.md."""

from lin_attn_jax.ops.mamba3.chunk import chunk_mamba3
from lin_attn_jax.ops.mamba3.inputs import (from_reference_state,
                                            pack_mamba3_state,
                                            to_reference_state,
                                            unpack_mamba3_state)
from lin_attn_jax.ops.mamba3.naive import naive_recurrent_mamba3
from lin_attn_jax.ops.mamba3.parallel import parallel_mamba3
from lin_attn_jax.ops.mamba3.recurrent import recurrent_mamba3
from lin_attn_jax.ops.mamba3.step import mamba3_step

__all__ = [
    "chunk_mamba3",
    "from_reference_state",
    "mamba3_step",
    "naive_recurrent_mamba3",
    "pack_mamba3_state",
    "parallel_mamba3",
    "recurrent_mamba3",
    "to_reference_state",
    "unpack_mamba3_state",
]
