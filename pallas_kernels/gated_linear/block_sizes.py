"""Tile sizes of the chunked gated-linear-attention kernels.

They change speed and memory use, never results beyond float rounding: every
chunk (and on TPU every sub-chunk) is computed exactly, whatever its size,
and a program that owns a block of key or value columns computes its part
of every sum over them.

Both backends run chunk-parallel kernels (``../README.md``; ``gpu.py``,
``tpu_chunks.py``), whose only sequential pass is the state sweep over
chunks; on TPU ``chunk_parallel=False`` runs the earlier sequential sweep
over sub-chunks per (batch, head, key block, value block).
"""

from __future__ import annotations

import dataclasses

from pallas_kernels.common import blocks as common

BACKENDS = common.BACKENDS

# Feature columns per program when a BlockSizes field is None, per backend,
# pass and gate kind ("channel": a decay per key channel; "other"):
# (block_k, block_v). TPU programs keep their state blocks in VMEM. GPU:
# the state tile of the sweeps (64 x 64: one [C, 64]^T [C, 64] wgmma-sized
# matmul per chunk, and K V / 4096 programs per head to walk the chunks).
DEFAULT_FEATURES = {
    ("tpu", "forward", "channel"): (256, 256),
    ("tpu", "backward", "channel"): (256, 256),
    ("tpu", "forward", "other"): (256, 256),
    ("tpu", "backward", "other"): (256, 256),
    ("gpu", "forward", "channel"): (64, 64),
    ("gpu", "backward", "channel"): (64, 64),
    ("gpu", "forward", "other"): (64, 64),
    ("gpu", "backward", "other"): (64, 64),
}
# GPU: value columns per program of the outputs kernel (None: this).
DEFAULT_OUTPUT_BLOCK_V = 128


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes for one backend; raises ``ValueError`` when inconsistent."""
  backend: str                  # "tpu" (Mosaic) or "gpu" (Triton)
  sub_chunk: int | None = None  # TPU only: c, tokens per state update and
                                # per exact [c, c] block of intra-chunk
                                # scores in the sweep; rows per block of
                                # the per-channel scores in the
                                # chunk-parallel kernels (None: 16)
  chunk: int = 64               # TPU: a multiple of sub_chunk, tokens per
                                # grid step and between the state
                                # checkpoints of the backward pass. GPU: at
                                # most C tokens per chunk (a power of two
                                # >= 16; gpu_settings caps it)
  block_k: int | None = None    # key columns per forward program (None:
                                # DEFAULT_FEATURES); TPU: more than one
                                # block returns the outputs as parts to add.
                                # GPU: the forward state sweep's tile
  block_v: int | None = None    # value columns per forward program
  backward_block_k: int | None = None  # key columns per backward program
                                # (GPU: the backward state sweep's tile)
  backward_block_v: int | None = None  # value columns per backward program
  output_block_v: int | None = None  # GPU only: value columns per program
                                # of the outputs kernel (None: 128)
  chunk_block: int | None = None  # GPU only: key (and value) columns per
                                # step of the chunk kernels' loops over K
                                # and V (None: gpu_settings)
  num_warps: int | None = None  # GPU only: warps per program (None:
                                # gpu_settings)
  num_stages: int | None = None  # GPU only: software pipelining stages
                                # (None: 2)
  per_channel: bool = False     # the defaults of a decay per key channel
  chunk_parallel: bool | None = None  # TPU only: the chunk-parallel
                                # kernels (tpu_chunks.py) rather than the
                                # sweep over sub-chunks; None: chunk-
                                # parallel
  step_block: int | None = None  # TPU chunk-parallel kernels only: key or
                                # value columns per step of the outputs' and
                                # gradients' loops (None: 128)

  def __post_init__(self):
    common.check_backend(self.backend)
    if self.backend == "tpu":
      common.check_rows("sub_chunk", 16 if self.sub_chunk is None
                        else self.sub_chunk, self.backend)
      common.check_positive("chunk", self.chunk)
      if self.chunk % self.sub_chunk_rows:
        raise ValueError(f"sub_chunk ({self.sub_chunk_rows}) must divide "
                         f"chunk ({self.chunk})")
      for name in ("output_block_v", "chunk_block"):
        if getattr(self, name) is not None:
          raise ValueError(f"{name} is a GPU setting; leave it None on TPU")
      common.check_width("step_block", self.step_block, self.backend)
    else:
      for name in ("chunk_parallel", "step_block"):
        if getattr(self, name) is not None:
          raise ValueError(f"{name} is a TPU setting; leave it None on GPU")
      if self.sub_chunk is not None:
        raise ValueError("sub_chunk is a TPU setting (the GPU kernels' row "
                         "blocks are chunk_math.ROWS tokens); leave it None "
                         "on GPU")
      common.check_rows("chunk", self.chunk, self.backend)
      common.check_width("output_block_v", self.output_block_v, self.backend)
      common.check_width("chunk_block", self.chunk_block, self.backend)
    for name in ("block_k", "block_v", "backward_block_k",
                 "backward_block_v"):
      common.check_width(name, getattr(self, name), self.backend)
    common.check_gpu_settings(self.backend, self.num_warps, self.num_stages)

  def tpu_chunk_parallel(self) -> bool:
    """TPU: whether the chunk-parallel kernels run (the default) rather
    than the sweep over sub-chunks."""
    return self.chunk_parallel is not False

  @property
  def sub_chunk_rows(self) -> int:
    """TPU: tokens per sub-chunk, the default filled in."""
    return 16 if self.sub_chunk is None else self.sub_chunk

  def gpu_settings(self, *, bf16: bool, k_pad: int, v_pad: int):
    """GPU: ``(chunk, chunk_block, num_warps, num_stages)`` for inputs of
    that dtype and padded widths, the defaults filled in.

    The chunk is ``self.chunk`` capped by gate kind and dtype, and the
    defaults are the widest settings that ptxas compiles without a register
    spill for sm_80 and sm_90 at every checked shape (``make
    compile-check``): bfloat16 with a scalar decay (or none), 64-token
    chunks, 64 columns per step and 4 warps (8 warps are slower; see
    docs/performance.md), or 32 columns and 8 warps when
    K or V is wider than 128; a decay per key channel (row blocks of 16
    tokens, ``gpu.ChannelPairGrads``), 64-token chunks in bfloat16 (a Hopper
    ``wgmma``'s 64 rows in the ``[C, C] x [C, BV]`` and ``[C, BV] x [BV,
    BK]`` products) with one pipelining stage, 32 in float32 (its
    gradients kernel and reverse sweep spill at 64 on sm_80), 16 columns
    and 8 warps; float32 inputs (3xTF32 operands) otherwise, chunks
    of 32, 16 columns and 8 warps. Otherwise 2 pipelining stages.
    """
    stages = 2
    if self.per_channel:
      cap, block, warps = (64, 16, 8) if bf16 else (32, 16, 8)
      stages = 1 if bf16 else 2
    elif bf16 and max(k_pad, v_pad) <= 128:
      cap, block, warps = 64, 64, 4
    elif bf16:
      cap, block, warps = 64, 32, 8
    else:
      cap, block, warps = 32, 16, 8
    return (min(self.chunk, cap),
            block if self.chunk_block is None else self.chunk_block,
            warps if self.num_warps is None else self.num_warps,
            stages if self.num_stages is None else self.num_stages)

  def output_block_v_or_default(self) -> int:
    return (DEFAULT_OUTPUT_BLOCK_V if self.output_block_v is None
            else self.output_block_v)

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

    TPU: the chunk-parallel kernels, with chunks of 128 tokens (one MXU
    tile of ``[C, C]`` scores), or ``chunk_size`` rounded up to whole
    128-token tiles, at most 256 (128 for float32 inputs,
    ``tpu_chunks.FLOAT32_MAX_CHUNK``). A decay per key channel computes the
    scores by row blocks of ``sub_chunk`` = 16 tokens (``[16, C]`` per
    block; the pairs inside a block are summed channel by channel, so the
    blocks are short); otherwise ``sub_chunk`` (64) is the step of the
    sweep that ``chunk_parallel=False`` selects.

    GPU: chunks of 64 tokens, or of ``chunk_size`` rounded up to a power of
    two when that is smaller (the ``[C, C]`` scores and ``[C, K]`` tiles of
    the chunk-parallel kernels live in registers; 64 rows is what a
    Hopper ``wgmma`` takes); warps and column blocks by ``gpu_settings``.
    """
    common.check_backend(backend)
    if chunk_size is not None:
      common.check_positive("chunk_size", chunk_size)
    if backend == "tpu":
      chunk = 128 if chunk_size is None else min(
          256, -(-chunk_size // 128) * 128)
      return cls("tpu", sub_chunk=16 if per_channel else 64, chunk=chunk,
                 per_channel=per_channel)
    chunk = 64 if chunk_size is None else min(
        64, max(16, 1 << (chunk_size - 1).bit_length()))
    return cls("gpu", chunk=chunk, per_channel=per_channel)
