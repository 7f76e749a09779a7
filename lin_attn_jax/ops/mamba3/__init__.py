"""Mamba-3's SISO recurrence (trapezoidal discretisation, rotary state) on
the gated-linear core; see README.md."""

from lin_attn_jax.ops.mamba3.chunk import chunk_mamba3, chunk_mamba3_mimo
from lin_attn_jax.ops.mamba3.inputs import (from_reference_state,
                                            interleave_halves,
                                            mimo_from_reference_state,
                                            mimo_to_reference_state,
                                            pack_mamba3_mimo_state,
                                            pack_mamba3_state,
                                            to_reference_state,
                                            unpack_mamba3_mimo_state,
                                            unpack_mamba3_state)
from lin_attn_jax.ops.mamba3.naive import (naive_recurrent_mamba3,
                                           naive_recurrent_mamba3_mimo)
from lin_attn_jax.ops.mamba3.parallel import (parallel_mamba3,
                                              parallel_mamba3_mimo)
from lin_attn_jax.ops.mamba3.recurrent import (recurrent_mamba3,
                                               recurrent_mamba3_mimo)
from lin_attn_jax.ops.mamba3.step import mamba3_mimo_step, mamba3_step

__all__ = [
    "chunk_mamba3",
    "chunk_mamba3_mimo",
    "from_reference_state",
    "interleave_halves",
    "mamba3_mimo_step",
    "mamba3_step",
    "mimo_from_reference_state",
    "mimo_to_reference_state",
    "naive_recurrent_mamba3",
    "naive_recurrent_mamba3_mimo",
    "pack_mamba3_mimo_state",
    "pack_mamba3_state",
    "parallel_mamba3",
    "parallel_mamba3_mimo",
    "recurrent_mamba3",
    "recurrent_mamba3_mimo",
    "to_reference_state",
    "unpack_mamba3_mimo_state",
    "unpack_mamba3_state",
]
