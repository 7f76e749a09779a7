"""The mLSTM of xLSTM (Beck et al. 2024, https://arxiv.org/abs/2405.04517):
a matrix memory with an exponential input gate, a sigmoid forget gate, a
normaliser and the max state that stabilises them, on the gated-linear
core (README.md)."""

from lin_attn_jax.ops.mlstm.inputs import (pack_mlstm_state,
                                           unpack_mlstm_state)
from lin_attn_jax.ops.mlstm.naive import naive_recurrent_mlstm
from lin_attn_jax.ops.mlstm.parallel import parallel_mlstm
from lin_attn_jax.ops.mlstm.chunk import chunk_mlstm
from lin_attn_jax.ops.mlstm.recurrent import recurrent_mlstm
from lin_attn_jax.ops.mlstm.step import mlstm_step

__all__ = [
    "chunk_mlstm",
    "mlstm_step",
    "naive_recurrent_mlstm",
    "pack_mlstm_state",
    "parallel_mlstm",
    "recurrent_mlstm",
    "unpack_mlstm_state",
]
