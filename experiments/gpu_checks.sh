#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go: the GPU's target config for
# deviceless compilation, the compiled-kernel tests, and the kernel
# benchmark (kernel vs XLA chunk form vs flash-linear-attention).
#
#   bash experiments/gpu_checks.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS]
#
# Each step has its own time limit and writes into OUTDIR as it goes, so a
# step that fails or runs out of time leaves the others' results. fla is
# timed when `torch` and `fla` import (pip install flash-linear-attention).
# BENCH_FLAGS is passed on to bench_kernels.py (e.g. "--ops=kda,gla
# --lengths=2048"): on an H200 each op and shape took about 25 s to compile
# (kernel and XLA, forward and forward+backward), and fla's first call of
# each op autotunes for about a minute.
set -u
out=${1:?usage: gpu_checks.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS]}
test_seconds=${2:-150}
bench_seconds=${3:-360}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# JAX and torch share the GPU in the benchmark's process.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}
PY=${PY:-python3}

nvidia-smi >"$out/nvidia_smi.txt" 2>&1
"$PY" -c 'import jax; print(jax.__version__, jax.devices())' \
  >"$out/versions.txt" 2>&1
"$PY" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|flax|torch |triton|fla)' \
  >>"$out/versions.txt"

echo "== target config"
timeout 60 "$PY" experiments/capture_gpu_target.py \
  --out="$out/gpu_target.txtpb" 2>&1 | tail -n 40

echo "== compiled kernel tests"
# The naive references are XLA programs: full float32 matmuls for them.
JAX_DEFAULT_MATMUL_PRECISION=highest timeout "$test_seconds" \
  "$PY" -m pytest -q -p no:cacheprovider --maxfail=5 --durations=5 \
  tests/test_kernels_gated_linear.py tests/test_kernels_delta_rule.py \
  -k Compiled 2>&1 | tee "$out/tests_compiled.txt" | tail -n 60

echo "== kernel benchmark"
timeout "$bench_seconds" "$PY" experiments/bench_kernels.py \
  --out="$out/kernels_gpu.md" --iters=10 --warmup=2 ${BENCH_FLAGS:-} 2>&1 \
  | tee "$out/bench_kernels.txt" | tail -n 60
echo "== done"
