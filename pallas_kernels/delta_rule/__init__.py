"""Pallas kernels of the chunked delta rule (DeltaNet, Gated DeltaNet, KDA:
no decay, a scalar decay per head or a decay per key channel), with
initial and final states, forward and backward.

- ``chunk_delta_rule_gpu``: the whole chunk form on chunk-parallel Triton
  kernels (the WY terms, a sweep over chunks, the outputs and all
  gradients), from q, k, v, beta and the log-decays.
- ``chunk_delta_rule_tpu``: the same on chunk-parallel Mosaic kernels.
- ``chunk_delta_rule_sweep``: the sequential part only, from the WY terms
  of every chunk, on TPU (Mosaic) and GPU (Triton).
"""

from pallas_kernels.delta_rule.block_sizes import BlockSizes
from pallas_kernels.delta_rule.chunked_ops import (chunk_delta_rule_gpu,
                                                   chunk_delta_rule_tpu)
from pallas_kernels.delta_rule.ops import ChunkTerms, chunk_delta_rule_sweep
from pallas_kernels.delta_rule.reference import (
    chunk_delta_rule_sweep_reference)

__all__ = [
    "BlockSizes",
    "ChunkTerms",
    "chunk_delta_rule_gpu",
    "chunk_delta_rule_tpu",
    "chunk_delta_rule_sweep",
    "chunk_delta_rule_sweep_reference",
]
