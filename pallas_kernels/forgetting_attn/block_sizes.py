"""Tile sizes of the forgetting-attention kernels.

They change speed and memory use, never results beyond float rounding:
every pair of a query block and a key block is either computed whole or
skipped because the mask removes all of it, and the online softmax gives
the same normalised sums for any order and size of the key blocks.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels.common import blocks as common

BACKENDS = common.BACKENDS

# (backend, bfloat16 inputs, K or V wider than 128) -> (block_q, block_k,
# backward_block_q, backward_block_k, num_warps, num_stages). TPU: 256-token
# blocks, two lane tiles of every per-token row, one [256, 256] float32 score
# tile (256 KiB of VMEM) per grid step. GPU: the widest tiles that ptxas
# compiles without a register spill on sm_80 and sm_90 at the checked
# shapes (``make compile-check``); float32 inputs hold three TF32 operands
# per product (``common/dots.py``).
DEFAULTS = {
    ("tpu", True, False): (256, 256, 256, 256, None, None),
    ("tpu", True, True): (256, 256, 256, 256, None, None),
    ("tpu", False, False): (256, 256, 256, 256, None, None),
    ("tpu", False, True): (256, 256, 256, 256, None, None),
    ("gpu", True, False): (128, 64, 64, 64, 8, 2),
    ("gpu", True, True): (64, 32, 32, 32, 8, 2),
    ("gpu", False, False): (64, 32, 32, 32, 4, 2),
    ("gpu", False, True): (32, 32, 32, 16, 4, 2),
}


@dataclasses.dataclass(frozen=True)
class Tiles:
  """The tiles of one call, defaults filled in and capped to the padded
  length (``layout.make_layout``)."""
  block_q: int              # query rows per forward program
  block_k: int              # key rows per step of the forward programs
  backward_block_q: int     # query rows per dq program, and per step of
                            # the dk/dv programs
  backward_block_k: int     # key rows per dk/dv program, and per step of
                            # the dq programs
  num_warps: int | None     # GPU: warps per program
  num_stages: int | None    # GPU: software pipelining stages


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes for one backend; raises ``ValueError`` when inconsistent.

  Every block is a number of tokens: on TPU a multiple of 128 (the
  per-token rows ``[1, block]`` of the forget gates, documents and
  log-sum-exps are lane tiles), on GPU a power of two >= 16 (Triton tiles
  have power-of-two sizes and ``tl.dot`` needs 16 rows or more).
  """
  backend: str                        # "tpu" (Mosaic) or "gpu" (Triton)
  block_q: int | None = None          # query rows per forward program
                                      # (None: DEFAULTS)
  block_k: int | None = None          # key rows per step of the forward
                                      # programs' walk over the keys
  backward_block_q: int | None = None  # query rows per dq program and per
                                      # step of the dk/dv programs
  backward_block_k: int | None = None  # key rows per dk/dv program and per
                                      # step of the dq programs
  num_warps: int | None = None        # GPU only: warps per program
  num_stages: int | None = None       # GPU only: software pipelining stages

  def __post_init__(self):
    common.check_backend(self.backend)
    for name in ("block_q", "block_k", "backward_block_q",
                 "backward_block_k"):
      common.check_width(name, getattr(self, name), self.backend)
    common.check_gpu_settings(self.backend, self.num_warps, self.num_stages)

  def tiles(self, *, bf16: bool, k_pad: int, v_pad: int) -> Tiles:
    """The tiles for inputs of that dtype and padded widths: the fields
    given, ``DEFAULTS`` for the others."""
    default = DEFAULTS[(self.backend, bf16, max(k_pad, v_pad) > 128)]
    given = (self.block_q, self.block_k, self.backward_block_q,
             self.backward_block_k, self.num_warps, self.num_stages)
    return Tiles(*(d if x is None else x for x, d in zip(given, default)))

  @classmethod
  def default(cls, backend: str) -> BlockSizes:
    """Every field None: ``DEFAULTS`` by dtype and width, per call."""
    common.check_backend(backend)
    return cls(backend)
