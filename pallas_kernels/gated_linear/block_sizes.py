"""Tile sizes of the chunked gated-linear-attention kernels.

They change speed and memory use, never results beyond float rounding: every
sub-chunk is computed exactly, whatever its size.
"""

from __future__ import annotations

import dataclasses

BACKENDS = ("tpu", "gpu")


def _is_power_of_two(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes for one backend; raises ``ValueError`` when inconsistent."""
  backend: str                  # "tpu" (Mosaic) or "gpu" (Triton)
  sub_chunk: int                # c: tokens per state update and per exact
                                # [c, c] block of intra-chunk scores
  chunk: int                    # a multiple of sub_chunk: tokens per grid
                                # step on TPU, and on both backends between
                                # the state checkpoints of the backward pass
  block_v: int | None = None    # value columns per program in the forward
                                # pass (None: all); the backward takes all
  num_warps: int | None = None  # GPU only: warps per program
  num_stages: int | None = None  # GPU only: software pipelining stages

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f"backend must be one of {BACKENDS}, got "
                       f"{self.backend!r}")
    for name in ("sub_chunk", "chunk"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.chunk % self.sub_chunk:
      raise ValueError(f"sub_chunk ({self.sub_chunk}) must divide chunk "
                       f"({self.chunk})")
    if self.block_v is not None and (not isinstance(self.block_v, int)
                                     or self.block_v < 1):
      raise ValueError(f"block_v must be None or a positive int, got "
                       f"{self.block_v!r}")
    if self.backend == "tpu":
      self._check_tpu()
    else:
      self._check_gpu()

  def _check_tpu(self):
    # bfloat16 packs 16 rows per (16, 128) tile: sub-chunks that start on a
    # multiple of 16 rows are tile aligned for every input dtype.
    if self.sub_chunk % 16:
      raise ValueError(f"on TPU sub_chunk must be a multiple of 16, got "
                       f"{self.sub_chunk}")
    if self.block_v is not None and self.block_v % 128:
      raise ValueError(f"on TPU block_v must be a multiple of 128 (lanes), "
                       f"got {self.block_v}")
    if self.num_warps is not None or self.num_stages is not None:
      raise ValueError("num_warps and num_stages are GPU settings; leave them "
                       "None on TPU")

  def _check_gpu(self):
    # Triton tiles have power-of-two sizes and tl.dot needs 16 rows or more.
    if not _is_power_of_two(self.sub_chunk) or self.sub_chunk < 16:
      raise ValueError(f"on GPU sub_chunk must be a power of two >= 16, got "
                       f"{self.sub_chunk}")
    if self.block_v is not None and (not _is_power_of_two(self.block_v)
                                     or self.block_v < 16):
      raise ValueError(f"on GPU block_v must be a power of two >= 16, got "
                       f"{self.block_v}")
    if self.num_warps is not None and not _is_power_of_two(self.num_warps):
      raise ValueError(f"num_warps must be a power of two, got "
                       f"{self.num_warps}")
    if self.num_stages is not None and self.num_stages < 1:
      raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")

  @classmethod
  def default(cls, backend: str, *, per_channel: bool) -> BlockSizes:
    """Defaults per backend and gate kind.

    A decay per key channel needs a ``[c, K]`` exponential per key row of a
    sub-chunk, so its sub-chunks are short (16); a scalar decay (or none)
    builds the ``[c, c]`` scores with one matmul and uses 64.
    """
    sub_chunk = 16 if per_channel else 64
    if backend == "tpu":
      return cls("tpu", sub_chunk=sub_chunk, chunk=128 if per_channel else 256)
    if backend == "gpu":
      # The backward programs hold the whole [V, K] float32 state in
      # registers: 8 warps keep it at 64 registers per thread for 128 x 128.
      return cls("gpu", sub_chunk=sub_chunk, chunk=64, block_v=64,
                 num_warps=8, num_stages=2)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
