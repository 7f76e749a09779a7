"""The Forgetting Transformer's attention (FoX): softmax attention with a
data-dependent forget gate.

``o_i = sum_{j <= i} softmax_j(scale q_i . k_j + sum_{l = j + 1 .. i} g_l)
v_j`` with ``g = log sigmoid(...) <= 0`` per token and query head; a
parallel reference, a blockwise form with an online softmax, a decoding
step and prefill with a cache, and the split over a ``sequence`` mesh axis.
"""

from lin_attn_jax.ops.forgetting_attn.cache import (ForgettingCache,
                                                    forgetting_attn_extend,
                                                    init_forgetting_cache)
from lin_attn_jax.ops.forgetting_attn.chunk import chunk_forgetting_attn
from lin_attn_jax.ops.forgetting_attn.parallel import parallel_forgetting_attn
from lin_attn_jax.ops.forgetting_attn.step import forgetting_attn_step

__all__ = [
    "ForgettingCache",
    "chunk_forgetting_attn",
    "forgetting_attn_extend",
    "forgetting_attn_step",
    "init_forgetting_cache",
    "parallel_forgetting_attn",
]
