"""Compiler settings and cost estimates of a ``pallas_call``.

VMEM (TPU): every kernel states its scoped-VMEM limit. It is the footprint
of its blocks (inputs and outputs double-buffered, scratch) plus as much
again for the values its body holds in VMEM (Mosaic keeps large values and
spilled registers there) plus 4 MiB, rounded up to whole MiB, and at least
16 MiB (v5e's default scoped limit) and at most 32 MiB. Kernels pick their
blocks so that the footprint stays well inside that on every generation
checked (v4, v5e, v5p, v6e, tpu7x); ``make compile-check`` proves
it.

Cost estimates: ``cost(...)`` gives XLA's scheduler the flops, the
transcendentals (``exp``) and the bytes a call moves; without one a Pallas
call counts as free in ``cost_analysis()``.
"""

from __future__ import annotations

import math

import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

MIB = 2 ** 20
_MIN_LIMIT, _MAX_LIMIT = 16 * MIB, 32 * MIB


def nbytes(shape, dtype) -> int:
  return math.prod(shape) * np.dtype(dtype).itemsize


def vmem_limit(window_bytes: int, scratch_bytes: int) -> int:
  """The scoped-VMEM limit of a kernel whose blocks (one buffer each) take
  ``window_bytes`` and whose scratch takes ``scratch_bytes``."""
  footprint = 2 * window_bytes + scratch_bytes
  limit = -(-(2 * footprint + 4 * MIB) // MIB) * MIB
  return int(min(max(limit, _MIN_LIMIT), _MAX_LIMIT))


def tpu_params(parallel_axes: int, *, window_bytes: int, scratch_bytes: int):
  """Mosaic settings: ``parallel_axes`` leading grid axes run in parallel,
  the last is sequential ("arbitrary"); the VMEM limit as above."""
  return pltpu.CompilerParams(
      dimension_semantics=("parallel",) * parallel_axes + ("arbitrary",),
      vmem_limit_bytes=vmem_limit(window_bytes, scratch_bytes))


def gpu_params(num_warps: int, num_stages: int):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def cost(*, flops: float, transcendentals: float, arrays) -> pl.CostEstimate:
  """A ``pl.CostEstimate``; ``arrays``: the call's inputs and outputs
  (anything with ``shape`` and ``dtype``), each read or written once."""
  moved = sum(nbytes(a.shape, a.dtype) for a in arrays)
  return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                         bytes_accessed=int(moved))


def block_bytes(block_shape, dtype) -> int:
  """Bytes of one buffer of a block (``None`` dimensions squeezed)."""
  return nbytes([1 if n is None else n for n in block_shape], dtype)
