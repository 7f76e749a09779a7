"""Stick-breaking attention (Tan et al., 2024, arXiv:2410.17980).

``A_ij = sigmoid(z_ij) prod_{j < l < i} (1 - sigmoid(z_il))``, ``z = scale
q k^T``, ``o_i = sum_j A_ij v_j``: each query breaks a stick from its
nearest key backwards; no softmax and no position encoding. A parallel
definition in log space, a blockwise form in linear memory, decoding with a
KV cache and a split over a ``sequence`` mesh axis.
"""

from lin_attn_jax.ops.stickbreaking_attn.chunk import chunk_stickbreaking_attn
from lin_attn_jax.ops.stickbreaking_attn.parallel import (
    parallel_stickbreaking_attn)
from lin_attn_jax.ops.stickbreaking_attn.step import (
    stickbreaking_attn_extend, stickbreaking_attn_step)

__all__ = [
    "chunk_stickbreaking_attn",
    "parallel_stickbreaking_attn",
    "stickbreaking_attn_extend",
    "stickbreaking_attn_step",
]
