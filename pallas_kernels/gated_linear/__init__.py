"""Pallas kernels of the chunked gated-linear-attention recurrence.

``chunk_gated_linear_attention`` covers no decay, a scalar decay per head and
a decay per key channel, with initial and final states and segment ids, on
TPU (Mosaic) and GPU (Triton), forward and backward.
"""

from pallas_kernels.gated_linear.block_sizes import BlockSizes
from pallas_kernels.gated_linear.ops import chunk_gated_linear_attention
from pallas_kernels.gated_linear.reference import (
    chunk_gated_linear_attention_reference)

__all__ = [
    "BlockSizes",
    "chunk_gated_linear_attention",
    "chunk_gated_linear_attention_reference",
]
