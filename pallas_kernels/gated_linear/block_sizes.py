"""Tile sizes of the chunked gated-linear-attention kernels.

They change speed and memory use, never results beyond float rounding: every
sub-chunk is computed exactly, whatever its size, and a program that owns a
block of key or value columns computes its part of every sum over them.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels.common import blocks as common

BACKENDS = common.BACKENDS

# Feature columns per program when a BlockSizes field is None, per backend,
# pass and gate kind ("channel": a decay per key channel; "other"):
# (block_k, block_v). GPU programs keep their float32 state block (and in
# the reverse sweep its gradient and the entering state) in registers, with
# a sub-chunk's [16, block] tiles beside it; these are the largest blocks
# that ptxas fits in 255 registers per thread at 4 warps without spilling,
# in float32 and bfloat16 (make compile-check). TPU programs keep them in
# VMEM.
DEFAULT_FEATURES = {
    ("tpu", "forward", "channel"): (256, 256),
    ("tpu", "backward", "channel"): (256, 256),
    ("tpu", "forward", "other"): (256, 256),
    ("tpu", "backward", "other"): (256, 256),
    ("gpu", "forward", "channel"): (32, 32),
    ("gpu", "backward", "channel"): (32, 16),
    ("gpu", "forward", "other"): (64, 32),
    ("gpu", "backward", "other"): (32, 16),
}


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes for one backend; raises ``ValueError`` when inconsistent."""
  backend: str                  # "tpu" (Mosaic) or "gpu" (Triton)
  sub_chunk: int                # c: tokens per state update and per exact
                                # [c, c] block of intra-chunk scores
  chunk: int                    # a multiple of sub_chunk: tokens per grid
                                # step on TPU, and on both backends between
                                # the state checkpoints of the backward pass
  block_k: int | None = None    # key columns per forward program (None:
                                # DEFAULT_FEATURES); more than one block
                                # returns the outputs as parts to add
  block_v: int | None = None    # value columns per forward program
  backward_block_k: int | None = None  # key columns per backward program
  backward_block_v: int | None = None  # value columns per backward program
  num_warps: int | None = None  # GPU only: warps per program
  num_stages: int | None = None  # GPU only: software pipelining stages
  per_channel: bool = False     # the defaults of a decay per key channel

  def __post_init__(self):
    common.check_backend(self.backend)
    common.check_rows("sub_chunk", self.sub_chunk, self.backend)
    common.check_positive("chunk", self.chunk)
    if self.chunk % self.sub_chunk:
      raise ValueError(f"sub_chunk ({self.sub_chunk}) must divide chunk "
                       f"({self.chunk})")
    for name in ("block_k", "block_v", "backward_block_k",
                 "backward_block_v"):
      common.check_width(name, getattr(self, name), self.backend)
    common.check_gpu_settings(self.backend, self.num_warps, self.num_stages)

  def features(self, direction: str) -> tuple[int, int]:
    """``(block_k, block_v)`` requested for ``direction`` ("forward" or
    "backward"), defaults filled in (the layout caps them at K and V)."""
    k, v = ((self.block_k, self.block_v) if direction == "forward"
            else (self.backward_block_k, self.backward_block_v))
    default_k, default_v = DEFAULT_FEATURES[
        (self.backend, direction, "channel" if self.per_channel else "other")]
    return (default_k if k is None else k), (default_v if v is None else v)

  @classmethod
  def default(cls, backend: str, *, per_channel: bool,
              chunk_size: int | None = None) -> BlockSizes:
    """Defaults per backend and gate kind.

    A decay per key channel needs a ``[c, K]`` exponential per key row of a
    sub-chunk, so its sub-chunks are short (16); a scalar decay (or none)
    builds the ``[c, c]`` scores with one matmul and uses 64 on TPU where
    the chunk allows. GPU sub-chunks are 16 tokens (registers). ``chunk_size`` (an op's chunk length) sets the chunk, rounded
    up to whole 16-token tiles; else 128 (per channel) or 256 on TPU and 64
    on GPU.
    """
    common.check_backend(backend)
    if chunk_size is None:
      chunk = (128 if per_channel else 256) if backend == "tpu" else 64
    else:
      common.check_positive("chunk_size", chunk_size)
      chunk = -(-chunk_size // 16) * 16
    if backend == "tpu":
      sub_chunk = 16 if per_channel or chunk % 64 else 64
      return cls("tpu", sub_chunk=sub_chunk, chunk=chunk,
                 per_channel=per_channel)
    # Registers: [16, .] sub-chunks and one pipelining stage (a second would
    # hold the next sub-chunk's loads beside the current one).
    return cls("gpu", sub_chunk=16, chunk=chunk, num_warps=4, num_stages=1,
               per_channel=per_channel)
