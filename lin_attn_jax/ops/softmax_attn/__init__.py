"""The softmax family: full, sliding-window and Longformer-style attention.

``o = softmax(scale * q k^T + mask) v`` with a causal mask, a sliding window,
global positions and document boundaries; a parallel reference, a blockwise
form with an online softmax, and a decoding step with a KV cache.
"""

from lin_attn_jax.ops.softmax_attn.cache import (KVCache, init_kv_cache,
                                                 softmax_attn_extend)
from lin_attn_jax.ops.softmax_attn.chunk import chunk_softmax_attn
from lin_attn_jax.ops.softmax_attn.parallel import parallel_softmax_attn
from lin_attn_jax.ops.softmax_attn.step import softmax_attn_step

__all__ = [
    "KVCache",
    "chunk_softmax_attn",
    "init_kv_cache",
    "parallel_softmax_attn",
    "softmax_attn_extend",
    "softmax_attn_step",
]
