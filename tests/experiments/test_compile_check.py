"""The deviceless compile check fails on a kernel that does not fit.

These run in the toolchain environments of ``make compile-check``
(``.venv-tpu`` with libtpu, ``.venv-cuda`` with jax-cuda12-plugin); in the
main (CPU) environment they skip. Each toolchain compiles one case with the
default blocks (it passes) and one with deliberately oversized blocks (it
fails, shown on one forward kernel): on GPU the per-channel outputs kernel
in float32 with 64-token chunks, 128 key columns per step and 4 warps
(its halving levels hold several float32 [64, 128] terms per thread)
spills registers; on TPU the gated-linear outputs kernel with 2048 x 2048
float32 state blocks (16 MiB windows of entering states, double-buffered)
overflows VMEM.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import pytest

from experiments import compile_kernels, compile_targets

TOOLCHAIN = ("tpu" if importlib.util.find_spec("libtpu") else
             "cuda" if importlib.util.find_spec("jax_cuda12_plugin") else None)

pytestmark = pytest.mark.skipif(
    TOOLCHAIN is None, reason="needs libtpu or jax-cuda12-plugin (make "
    "compile-check runs these in their own environments)")


@pytest.fixture(scope="module")
def dump_dir():
  path = tempfile.mkdtemp(prefix="compile_check_")
  os.environ.update(compile_targets.environment(TOOLCHAIN, path))
  return path


def _target():
  return "v5e" if TOOLCHAIN == "tpu" else "sm_90"


def test_default_blocks_pass(dump_dir):
  case = compile_kernels.CASES_BY_NAME["delta_rule_test"]
  result = compile_kernels.check(case, "float32", _target(), dump_dir)
  assert result["ok"], result["error"]
  names = {k["kernel"] for k in result["kernels"]}
  # The kernels the op runs for float32 inputs: the chunk-parallel ones on
  # TPU, the sweep over the chunk terms on GPU.
  expected = ({"delta_rule_tpu_wy", "delta_rule_tpu_sweep",
               "gated_linear_tpu_outputs", "gated_linear_tpu_dv",
               "delta_rule_tpu_sweep_grads", "gated_linear_tpu_grads",
               "delta_rule_tpu_wy_grads"} if TOOLCHAIN == "tpu" else
              {"delta_rule_forward", "delta_rule_states",
               "delta_rule_backward"})
  assert names == expected


def test_oversized_blocks_fail(dump_dir):
  if TOOLCHAIN == "cuda":
    from pallas_kernels.gated_linear import BlockSizes
    case = compile_kernels.Case("oversized", "gated_linear", "channel", 128,
                                128)
    blocks = BlockSizes("gpu", chunk=64, chunk_block=128, num_warps=4,
                        num_stages=1, per_channel=True)
    expected = "register spills"
    forward_kernel = "_outputs"
  else:
    from pallas_kernels.gated_linear import BlockSizes
    case = compile_kernels.Case("oversized", "gated_linear", "scalar", 2048,
                                2048, length=256)
    blocks = BlockSizes("tpu", chunk=128, block_k=2048, block_v=2048,
                        backward_block_k=2048, backward_block_v=2048)
    expected = "vmem"
    forward_kernel = "_outputs"
  backend = "gpu" if TOOLCHAIN == "cuda" else "tpu"
  # One forward kernel is enough to fail (and quicker than all of them).
  forward = [k for k in compile_kernels.kernels(case, "float32", backend,
                                                blocks)
             if k.name.endswith(forward_kernel)]
  assert len(forward) == 1
  result = compile_kernels.check(case, "float32", _target(), dump_dir,
                                 traced=forward)
  assert not result["ok"]
  assert expected in result["error"].lower(), result["error"]
