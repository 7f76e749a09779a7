"""RWKV-6 (Finch) on the gated-linear-attention core: per-channel decay and a
bonus for the current token."""

from lin_attn_jax.ops.rwkv6.chunk import chunk_rwkv6
from lin_attn_jax.ops.rwkv6.naive import naive_recurrent_rwkv6
from lin_attn_jax.ops.rwkv6.parallel import parallel_rwkv6
from lin_attn_jax.ops.rwkv6.recurrent import recurrent_rwkv6
from lin_attn_jax.ops.rwkv6.step import rwkv6_step

__all__ = [
    "chunk_rwkv6",
    "naive_recurrent_rwkv6",
    "parallel_rwkv6",
    "recurrent_rwkv6",
    "rwkv6_step",
]
