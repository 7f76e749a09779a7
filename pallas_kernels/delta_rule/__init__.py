"""Pallas kernels of the delta rule's chunk sweep.

``chunk_delta_rule_sweep`` runs the sequential part of the chunked delta
rule (DeltaNet, Gated DeltaNet, KDA: no decay, a scalar decay per head or a
decay per key channel), from the WY terms of every chunk, with initial and
final states, on TPU (Mosaic) and GPU (Triton), forward and backward.
"""

from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.ops import ChunkTerms, chunk_delta_rule_sweep
from pallas_kernels.delta_rule.reference import (
    chunk_delta_rule_sweep_reference)

__all__ = [
    "BlockSizes",
    "ChunkTerms",
    "chunk_delta_rule_sweep",
    "chunk_delta_rule_sweep_reference",
]
