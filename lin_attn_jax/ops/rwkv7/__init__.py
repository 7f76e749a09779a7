"""RWKV-7 (Goose) on the delta-rule core: a diagonal-plus-rank-one transition
``S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T``."""

from lin_attn_jax.ops.rwkv7.chunk import chunk_rwkv7
from lin_attn_jax.ops.rwkv7.naive import naive_recurrent_rwkv7
from lin_attn_jax.ops.rwkv7.parallel import parallel_rwkv7
from lin_attn_jax.ops.rwkv7.recurrent import recurrent_rwkv7
from lin_attn_jax.ops.rwkv7.step import rwkv7_step

__all__ = [
    "chunk_rwkv7",
    "naive_recurrent_rwkv7",
    "parallel_rwkv7",
    "recurrent_rwkv7",
    "rwkv7_step",
]
