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

# (backend, bfloat16 inputs, widest of K and V padded: 64, 128 or more) ->
# (block_q, block_k, backward_block_q, backward_block_k, dq_block_q,
# num_warps, num_stages). TPU: 256-token blocks, two lane tiles of every
# per-token row and one [256, 256] float32 score tile per grid step
# (128-token tiles do not spill vector registers; 256 halves the grid steps;
# neither is timed). GPU: tiles that ptxas compiles without a register spill
# on sm_80 and sm_90 at the checked shapes (``make compile-check``, K = V <=
# 128); in bfloat16 every program that carries the products owns 64 rows or
# more (a Hopper wgmma's 64 rows per warpgroup: the forward 128 queries, the
# dq programs 64 queries, the dk/dv programs 64 keys). The dk/dv programs,
# which hold two accumulators beside their key and value blocks, step over
# 32 queries (64 compiles at 252-255 registers of 255 on sm_80 at K = V =
# 64 and 128, no margin left); the dq programs step over 64 keys. Float32
# inputs run IEEE float32 products (``ops.FLOAT32_MODE``).
DEFAULTS = {
    ("tpu", bf16, width): (256, 256, 256, 256, 256, None, None)
    for bf16 in (True, False) for width in (64, 128, 256)}
DEFAULTS.update({
    ("gpu", True, 64): (128, 64, 32, 64, 64, 8, 2),
    ("gpu", True, 128): (128, 64, 32, 64, 64, 8, 2),
    ("gpu", True, 256): (64, 32, 32, 32, 32, 8, 2),
    ("gpu", False, 64): (32, 32, 32, 16, 32, 4, 2),
    ("gpu", False, 128): (16, 16, 16, 16, 16, 4, 2),
    ("gpu", False, 256): (16, 16, 16, 16, 16, 4, 2),
})


def width_class(k_pad: int, v_pad: int) -> int:
  """The ``DEFAULTS`` key of padded widths: 64, 128, or 256 (wider)."""
  widest = max(k_pad, v_pad)
  return 64 if widest <= 64 else 128 if widest <= 128 else 256


@dataclasses.dataclass(frozen=True)
class Tiles:
  """The tiles of one call, defaults filled in and capped to the padded
  length (``layout.make_layout``)."""
  block_q: int              # query rows per forward program
  block_k: int              # key rows per step of the forward programs
  backward_block_q: int     # query rows per step of the dk/dv programs
  backward_block_k: int     # key rows per dk/dv program, and per step of
                            # the dq programs
  dq_block_q: int           # query rows per dq program
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
  backward_block_q: int | None = None  # query rows per step of the dk/dv
                                      # programs
  backward_block_k: int | None = None  # key rows per dk/dv program and per
                                      # step of the dq programs
  num_warps: int | None = None        # GPU only: warps per program
  num_stages: int | None = None       # GPU only: software pipelining stages
  dq_block_q: int | None = None       # query rows per dq program

  def __post_init__(self):
    common.check_backend(self.backend)
    for name in ("block_q", "block_k", "backward_block_q",
                 "backward_block_k", "dq_block_q"):
      common.check_width(name, getattr(self, name), self.backend)
    common.check_gpu_settings(self.backend, self.num_warps, self.num_stages)

  def tiles(self, *, bf16: bool, k_pad: int, v_pad: int) -> Tiles:
    """The tiles for inputs of that dtype and padded widths: the fields
    given, ``DEFAULTS`` for the others."""
    default = DEFAULTS[(self.backend, bf16, width_class(k_pad, v_pad))]
    given = (self.block_q, self.block_k, self.backward_block_q,
             self.backward_block_k, self.dq_block_q, self.num_warps,
             self.num_stages)
    return Tiles(*(d if x is None else x for x, d in zip(given, default)))

  @classmethod
  def default(cls, backend: str) -> BlockSizes:
    """Every field None: ``DEFAULTS`` by dtype and width, per call."""
    common.check_backend(backend)
    return cls(backend)
