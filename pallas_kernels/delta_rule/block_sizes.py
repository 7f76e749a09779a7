"""Tile sizes of the delta-rule chunk-sweep kernels.

They change speed and memory use, never results beyond float rounding: the
value columns of the state are independent in the delta rule's chunk update,
so splitting them over programs computes the same sums.
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
  block_v: int | None = None    # value columns of the state per program, in
                                # the forward and the backward sweep (None:
                                # all); the backward's sums over value
                                # columns add the programs' parts in XLA
  num_warps: int | None = None  # GPU only: warps per program
  num_stages: int | None = None  # GPU only: software pipelining stages

  def __post_init__(self):
    if self.backend not in BACKENDS:
      raise ValueError(f"backend must be one of {BACKENDS}, got "
                       f"{self.backend!r}")
    if self.block_v is not None and (not isinstance(self.block_v, int)
                                     or self.block_v < 1):
      raise ValueError(f"block_v must be None or a positive int, got "
                       f"{self.block_v!r}")
    if self.backend == "tpu":
      if self.block_v is not None and self.block_v % 128:
        raise ValueError(f"on TPU block_v must be a multiple of 128 (lanes), "
                         f"got {self.block_v}")
      if self.num_warps is not None or self.num_stages is not None:
        raise ValueError("num_warps and num_stages are GPU settings; leave "
                         "them None on TPU")
      return
    # Triton tiles have power-of-two sizes and tl.dot needs 16 or more.
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
  def default(cls, backend: str) -> BlockSizes:
    """Defaults per backend.

    TPU: 128 value columns per program (one lane tile; a ``[128, K]``
    float32 state in VMEM). GPU: 32 value columns per program, so that the
    ``[32, K]`` float32 state of the reverse sweep and its gradient stay in
    registers with 4 warps, and ``B * H * V / 32`` programs run at once.
    """
    if backend == "tpu":
      return cls("tpu", block_v=128)
    if backend == "gpu":
      return cls("gpu", block_v=32, num_warps=4, num_stages=2)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
