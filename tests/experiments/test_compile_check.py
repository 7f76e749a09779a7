"""The deviceless compile check fails on a kernel that does not fit.

These run in the toolchain environments of ``make compile-check``
(``.venv-tpu`` with libtpu, ``.venv-cuda`` with jax-cuda12-plugin); in the
main (CPU) environment they skip. Each toolchain compiles one case with the
default blocks (it passes) and one with deliberately oversized blocks (it
fails, shown on one forward kernel): on GPU the per-channel outputs kernel
in float32 with 64-token chunks, 128 key columns per step and 4 warps
(its halving levels hold several float32 [64, 128] terms per thread)
spills registers; on TPU a delta-rule program holding 2048 x 2048 float32
state (16 MiB of scratch and two 16 MiB windows of entering states)
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
  assert names == {"delta_rule_forward", "delta_rule_states",
                   "delta_rule_backward"}


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
    from pallas_kernels.delta_rule import BlockSizes
    case = compile_kernels.Case("oversized", "delta_rule", "none", 2048, 2048,
                                length=128)
    blocks = BlockSizes("tpu", block_v=2048)
    expected = "vmem"
    forward_kernel = "_forward"
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
