#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go: the GPU's target config for
# deviceless compilation, the compiled-kernel tests, the gated-linear
# kernels stage by stage, and the kernel benchmark (kernel vs XLA chunk
# form vs flash-linear-attention).
#
#   bash experiments/gpu_checks.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS] [STAGES_SECONDS]
#
# Each step has its own time limit (0 skips it) and writes into OUTDIR as
# it goes, so a step that fails or runs out of time leaves the others'
# results. Wheels in .whl/ (e.g. flash-linear-attention and fla-core, for a
# machine without a package index) are installed first, into a folder put
# on PYTHONPATH. fla is timed when `torch` and `fla` import. BENCH_FLAGS is
# passed on to bench_kernels.py (e.g. "--ops=kda,gla --lengths=2048
# --fla_past_triton_guard"). On an H200: about 12 s of compiling per op
# and shape (kernel and XLA, forward and forward+backward), and fla's first
# call of each op autotunes for about a minute. The defaults (90 s of
# compiled tests, 330 s of benchmark) keep a run inside 8 minutes.
# MQAR_SECONDS (default 0: skipped) runs the `gpu_subset` MQAR grid
# (experiments/mqar.py, sized for 6 minutes of an H200) for at most that
# long, into OUTDIR/mqar_gpu_subset.{jsonl,md,png}, e.g.
#   MQAR_SECONDS=400 bash experiments/gpu_checks.sh OUTDIR 0 0
set -u
out=${1:?usage: gpu_checks.sh OUTDIR [TEST_SECONDS] [BENCH_SECONDS] [STAGES_SECONDS]}
test_seconds=${2:-90}
bench_seconds=${3:-330}
stages_seconds=${4:-0}
mkdir -p "$out"
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/gpu_checks_site .whl/*.whl \
    && export PYTHONPATH="/tmp/gpu_checks_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# JAX and torch share the GPU in the benchmark's process.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}

nvidia-smi >"$out/nvidia_smi.txt" 2>&1
"$PY" -c 'import jax; print(jax.__version__, jax.devices())' \
  >"$out/versions.txt" 2>&1
"$PY" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|flax|torch |triton|fla)' \
  >>"$out/versions.txt"
"$PY" -c 'import fla; print("fla", fla.__version__)' \
  >>"$out/versions.txt" 2>&1

echo "== target config"
timeout 60 "$PY" -m experiments.capture_gpu_target \
  --out="$out/gpu_target.txtpb" 2>&1 | tail -n 40

if [ "$test_seconds" != 0 ]; then
  echo "== compiled kernel tests"
  # The naive references are XLA programs: full float32 matmuls for them.
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "$test_seconds" \
    "$PY" -m pytest -q -p no:cacheprovider --maxfail=5 --durations=5 \
    tests/kernels/test_kernels_gated_linear.py tests/kernels/test_kernels_delta_rule.py \
    tests/kernels/test_forgetting_attn_kernel.py -k Compiled 2>&1 | tee "$out/tests_compiled.txt" | tail -n 30
fi

if [ "$stages_seconds" != 0 ]; then
  echo "== gated-linear kernels stage by stage"
  timeout "$stages_seconds" "$PY" -m experiments.bench_kernel_stages \
    --out="$out/stages.md" ${STAGES_FLAGS:-} 2>&1 \
    | tee "$out/stages.txt" | tail -n 20
fi

if [ "$bench_seconds" != 0 ]; then
  echo "== kernel benchmark"
  timeout "$bench_seconds" "$PY" -m experiments.bench_kernels \
    --out="$out/kernels_gpu.md" --iters=10 --warmup=2 ${BENCH_FLAGS:-} 2>&1 \
    | tee "$out/bench_kernels.txt" | tail -n 40
fi
if [ "${MQAR_SECONDS:-0}" != 0 ]; then
  echo "== MQAR gpu_subset"
  # Eight processes share the GPU: a tenth of its memory each.
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 timeout "$MQAR_SECONDS" \
    "$PY" -m experiments.mqar --config=gpu_subset --out_dir="$out" \
    --workers=8 2>&1 | tee "$out/mqar_gpu_subset.txt" | tail -n 30
  # The table and plot of the runs finished within the time limit.
  timeout 120 "$PY" -m experiments.mqar --config=gpu_subset \
    --out_dir="$out" --report_only 2>&1 | tail -n 5
fi
echo "== done"
