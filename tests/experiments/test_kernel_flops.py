"""The kernels' matmul flops, counted from their bodies, against the chunk
algorithm's count and against their own ``cost_estimate``s.

Tracing only (no kernel runs): every ``pallas_call`` of an op's forward and
backward program, its body's ``dot_general``s times the loops' trip counts
and the grid (``experiments.compile_kernels.body_flops``).
"""

from __future__ import annotations

import pytest

from experiments import compile_kernels as ck

SHAPE = dict(batch=1, heads=2, length=512, width=128)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("op", ["simple_gla", "gla"])
def test_gated_linear_flops_are_the_chunk_algorithms(backend, op):
  """At most 1.3x the chunk algorithm's count, forward and backward; on TPU
  exactly it."""
  rows = ck.kernel_grids(backend, ops=[op], **SHAPE)
  counted = sum(r[5] for r in rows)
  gate = dict((o, g) for o, _, g in ck.GRID_OPS)[op]
  chunk = ck.kernel_chunk(backend, gate, SHAPE["width"], SHAPE["length"])
  algorithm = ck.gated_linear_flops(SHAPE["length"], SHAPE["heads"],
                                    SHAPE["batch"], SHAPE["width"],
                                    SHAPE["width"], chunk)
  assert counted <= 1.3 * algorithm, (counted, algorithm)
  if backend == "tpu":
    assert counted == algorithm


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_delta_rule_flops_are_the_chunk_algorithms(backend, op):
  """The chunk-parallel delta-rule kernels: at most 1.3x the chunk
  algorithm's count at their own chunk (the WY kernel's grid gives it).
  The excess is the inverse: on TPU forward substitution over whole rows
  of the chunk on bfloat16 parts, on GPU the doubling formula's full
  ``[C, C]`` products."""
  rows = ck.kernel_grids(backend, ops=[op], **SHAPE)
  counted = sum(r[5] for r in rows)
  chunks = [r[2][-1] for r in rows if r[1].endswith("_wy")]
  assert chunks, [r[1] for r in rows]
  chunk = SHAPE["length"] // chunks[0]
  algorithm = ck.delta_rule_flops(SHAPE["length"], SHAPE["heads"],
                                  SHAPE["batch"], SHAPE["width"],
                                  SHAPE["width"], chunk)
  assert algorithm <= counted <= 1.3 * algorithm, (counted, algorithm,
                                                   chunk)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("op", ["simple_gla", "gla", "gated_delta_rule",
                                "kda"])
def test_cost_estimates_count_the_bodies(backend, op):
  """Each kernel's ``cost_estimate`` holds at least the matmul flops its
  body runs, and at most half as many again: a per-channel decay's pairs
  inside a 16-token row block are multiply-adds outside the matmuls,
  which the GPU estimates count (a third of KDA's 32-token ``dv``). A
  product counted three times for a single pass (3xTF32 for TF32) would
  break it."""
  for _, name, _, _, _, counted, cost, _ in ck.kernel_grids(
      backend, ops=[op], **SHAPE):
    assert counted <= cost <= 1.5 * counted, (name, counted, cost)
