"""Tile sizes of the delta-rule chunk-sweep kernels.

They change speed and memory use, never results beyond float rounding: the
value columns of the state are independent in the delta rule's chunk update,
so splitting them over programs computes the same sums, and a program's
products over key channels are summed the same way block by block.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels.common import blocks as common

BACKENDS = common.BACKENDS


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes for one backend; raises ``ValueError`` when inconsistent."""
  backend: str                  # "tpu" (Mosaic) or "gpu" (Triton)
  block_v: int | None = None    # value columns of the state per program, in
                                # the forward and the backward sweep (None:
                                # all)
  block_k: int | None = None    # key columns per product inside a program
                                # (None: all): the state is held as blocks
                                # [block_v, block_k], so no [C, K] term is
                                # loaded whole
  num_warps: int | None = None  # GPU only: warps per program
  num_stages: int | None = None  # GPU only: software pipelining stages

  def __post_init__(self):
    common.check_backend(self.backend)
    common.check_width("block_v", self.block_v, self.backend)
    common.check_width("block_k", self.block_k, self.backend)
    common.check_gpu_settings(self.backend, self.num_warps, self.num_stages)

  @classmethod
  def default(cls, backend: str) -> BlockSizes:
    """Defaults per backend.

    TPU: 128 value columns per program (one lane tile; a ``[128, K]``
    float32 state in VMEM), all key columns and rows at once (smaller key
    blocks move less through registers but spill more in float32 at K >=
    256 on every generation checked). GPU: 16 value
    columns per program and products over 32 key columns at a time at 4
    warps: a program's registers hold ``[C, 16]`` pseudo-values and one
    ``[C, 32]`` / ``[32, 16]`` block of each operand (the state itself stays
    in memory, ``gpu.py``), and ``B * H * V / 16`` programs run at once.
    """
    common.check_backend(backend)
    if backend == "tpu":
      return cls("tpu", block_v=128)
    return cls("gpu", block_v=16, block_k=32, num_warps=4, num_stages=1)
