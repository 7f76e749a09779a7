"""Pallas kernels of forgetting attention (FoX): causal softmax attention
with the bias ``c_i - c_j`` of cumulative log forget gates, grouped heads,
packed documents and a sliding window, forward and backward, on TPU
(Mosaic) and GPU (Triton).
"""

from pallas_kernels.forgetting_attn.block_sizes import BlockSizes
from pallas_kernels.forgetting_attn.ops import forgetting_attention
from pallas_kernels.forgetting_attn.reference import (
    forgetting_attention_reference)

__all__ = [
    "BlockSizes",
    "forgetting_attention",
    "forgetting_attention_reference",
]
