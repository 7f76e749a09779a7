"""Pallas kernels against the XLA chunk forms, and on a CUDA GPU against
flash-linear-attention's Triton kernels.

For each op (gated-linear core: ``simple_gla``, a scalar decay per head,
``gla``, a decay per key channel; delta-rule core: ``delta_rule``,
``gated_delta_rule``, ``kda``, with L2-normalised q and k and beta =
sigmoid) and each shape, it times the forward pass and forward+backward
(gradients of every input for a random cotangent) of

- ``impl="pallas"`` (the Mosaic kernel on TPU, the Triton kernel on GPU;
  for the delta-rule ops the sweep over chunks, its WY terms in XLA),
- ``impl="xla"`` (the chunk form in XLA),
- on a CUDA GPU with ``torch`` and ``fla`` importable: ``fla.ops``'s
  ``chunk_<op>`` of the same name on the same shapes and dtype,

and reports time ratios (``> 1``: the kernel is faster). Times are the
median of ``--iters`` runs after ``--warmup`` runs, on compiled functions.

Without a TPU or GPU it runs a smoke comparison instead: tiny shapes, the
kernel in interpret mode against the XLA form, for agreement of the outputs
and gradients. Interpret-mode times say nothing about kernel speed and are
not reported as such.

Run:
  python -m experiments.bench_kernels                       # TPU / GPU
  python -m experiments.bench_kernels --lengths=2048,8192 --batch=8 \
      --heads=16 --dims=128 --dtype=bfloat16 --out=benchmarks/kernels.md
  python -m experiments.bench_kernels --smoke               # any machine
"""

from __future__ import annotations

import importlib
import itertools
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench_utils import median_time
from lin_attn_jax import ops

FLAGS = flags.FLAGS
flags.DEFINE_list("ops", ["simple_gla", "gla", "delta_rule",
                          "gated_delta_rule", "kda"], "Ops to time.")
flags.DEFINE_list("lengths", ["2048", "8192"], "Sequence lengths T.")
flags.DEFINE_list("heads", ["16"], "Head counts H.")
flags.DEFINE_list("dims", ["128"], "Head dimensions K = V.")
flags.DEFINE_integer("batch", 8, "Batch B.")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"],
                  "Dtype of q, k, v.")
flags.DEFINE_integer("warmup", 3, "Untimed runs before timing.")
flags.DEFINE_integer("iters", 20, "Timed runs; the median is reported.")
flags.DEFINE_bool("smoke", False, "Tiny shapes; interpret mode on CPU.")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")
flags.DEFINE_bool("fla_past_triton_guard", False,
                  "Time fla's gated backward (simple_gla, gated_delta_rule) "
                  "on Hopper with Triton 3.4-3.7.0, which fla refuses (its "
                  "issue #640: that Triton can miscompile chunk_bwd_dqkwg); "
                  "the table then also compares fla's gradients with XLA's.")

_DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
# op -> (chunk form, gate: None, "scalar" per head or "channel" per key).
_OPS = {
    "simple_gla": (ops.chunk_simple_gla, "scalar"),
    "gla": (ops.chunk_gla, "channel"),
    "delta_rule": (ops.chunk_delta_rule, None),
    "gated_delta_rule": (ops.chunk_gated_delta_rule, "scalar"),
    "kda": (ops.chunk_kda, "channel"),
}
_DELTA_RULE = ("delta_rule", "gated_delta_rule", "kda")


def make_inputs(op, b, t, h, d, dtype, seed=0):
  """``(inputs by name, do)``: q, k, v ``[B, T, H, D]`` in ``dtype``, g and
  beta float32."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 6)
  q, k, v = (jax.random.normal(key, (b, t, h, d), dtype) for key in keys[:3])
  inputs = {"q": q, "k": k, "v": v}
  gate = _OPS[op][1]
  if gate is not None:
    gate_shape = (b, t, h) if gate == "scalar" else (b, t, h, d)
    # GLA-style gates: log-sigmoid of a logit, divided by 16 as in the paper.
    inputs["g"] = jax.nn.log_sigmoid(
        jax.random.normal(keys[3], gate_shape)) / 16.0
  if op in _DELTA_RULE:
    inputs["beta"] = jax.nn.sigmoid(jax.random.normal(keys[4], (b, t, h)))
  do = jax.random.normal(keys[5], (b, t, h, d), dtype)
  return inputs, do


def jax_functions(op, impl):
  """``(forward(inputs), forward_backward(inputs, do))``, both jitted."""
  chunk = _OPS[op][0]
  options = {"use_qk_l2norm": True} if op in _DELTA_RULE else {}

  def forward(inputs):
    return chunk(**inputs, impl=impl, **options)[0]

  def forward_backward(inputs, do):
    o, vjp = jax.vjp(forward, inputs)
    return o, vjp(do)

  return jax.jit(forward), jax.jit(forward_backward)


def fla_timer():
  """``(run, "timed")`` or ``(None, why not)``; ``run(op, inputs, do, backward,
  warmup, iters)`` times fla's kernel of ``op`` like ``median_time`` (wall
  clock to a synchronised device) and returns ``(median seconds, output as
  numpy, or with ``backward`` the gradients by input name)``."""
  try:
    import torch
    import fla  # noqa: F401
  except ImportError as error:
    return None, f"torch/fla not importable ({error})"
  if not torch.cuda.is_available():
    return None, "torch sees no CUDA device"
  torch_dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
  note = "timed"
  if FLAGS.fla_past_triton_guard:
    from fla.ops.common import chunk_o
    if not chunk_o.TRITON_ABOVE_3_7_1:
      chunk_o.TRITON_ABOVE_3_7_1 = True
      note = ("timed; its Hopper guard for Triton < 3.7.1 bypassed (fla "
              "issue #640), gradients compared with XLA's")

  def run(op, inputs, do, backward, warmup, iters):
    kernel = getattr(importlib.import_module(f"fla.ops.{op}"), f"chunk_{op}")
    options = {"use_qk_l2norm_in_kernel": True} if op in _DELTA_RULE else {}
    dtype = torch_dtypes[FLAGS.dtype]
    leaves = {}
    for name, x in inputs.items():
      x = torch.from_numpy(np.asarray(x, np.float32)).cuda()
      x = x.to(dtype) if name in ("q", "k", "v") else x
      leaves[name] = x.requires_grad_(backward)
    do = torch.from_numpy(np.asarray(do, np.float32)).cuda().to(dtype)

    def step():
      o, _ = kernel(**leaves, output_final_state=False, **options)
      if backward:
        for x in leaves.values():
          x.grad = None
        o.backward(do)
      return o

    for _ in range(warmup):
      step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
      start = time.perf_counter()
      step()
      torch.cuda.synchronize()
      times.append(time.perf_counter() - start)
    if backward:
      return statistics.median(times), {
          name: x.grad.float().cpu().numpy() for name, x in leaves.items()
          if x.grad is not None}
    with torch.no_grad():
      o = step()
    return statistics.median(times), o.float().cpu().numpy()

  return run, note


def _compiled(jitted, args):
  """``(compiled, seconds to lower and compile)`` of a jitted function."""
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


def _error_text(error):
  """One line for a table: the error's type and first line."""
  return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def _time_impl(op, impl, inputs, do):
  """Times, compile times and results of one implementation, or the error
  that stopped it (a kernel that fails on this device is a row, not a crash
  of the whole run)."""
  forward, forward_backward = jax_functions(op, impl)
  try:
    fwd, fwd_compile = _compiled(forward, (inputs,))
    print(f"{op} {impl}: forward compiled in {fwd_compile:.1f} s", flush=True)
    bwd, bwd_compile = _compiled(forward_backward, (inputs, do))
    print(f"{op} {impl}: forward+backward compiled in {bwd_compile:.1f} s",
          flush=True)
    result = {
        "fwd": median_time(fwd, (inputs,), FLAGS.iters, FLAGS.warmup),
        "fwd+bwd": median_time(bwd, (inputs, do), FLAGS.iters,
                               FLAGS.warmup),
        "compile": fwd_compile + bwd_compile,
        "values": jax.device_get(bwd(inputs, do)),
    }
  except Exception as error:  # noqa: BLE001 (reported in the table)
    print(f"{op} {impl}: {_error_text(error)}", flush=True)
    return {"error": _error_text(error)}
  return result


def _table(rows, platform, fla_note):
  ms = lambda s: f"{1e3 * s:.2f}"  # noqa: E731
  lines = [
      f"{jax.devices()[0].device_kind} ({platform}), jax {jax.__version__}, "
      f"B={FLAGS.batch}, {FLAGS.dtype}, median of {FLAGS.iters} runs after "
      f"{FLAGS.warmup}; ratios are other / kernel (> 1: the kernel is "
      f"faster). fla: {fla_note}. Agreement: largest elementwise difference "
      "relative to the largest XLA value, of the output and of every "
      "gradient (kernel vs XLA), of the output (fla vs XLA; and of the "
      "gradients where fla's guard was bypassed).",
      "",
      "| op | T | H | K=V | kernel fwd (ms) | kernel fwd+bwd (ms) | "
      "XLA fwd (ms) | XLA fwd+bwd (ms) | XLA / kernel fwd | "
      "XLA / kernel fwd+bwd | fla fwd (ms) | fla fwd+bwd (ms) | "
      "fla / kernel fwd+bwd | compile kernel / XLA (s) | kernel vs XLA o, "
      "grads | fla vs XLA o |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    kernel, xla = r["pallas"], r["xla"]
    cells = [r["op"], str(r["T"]), str(r["H"]), str(r["D"])]
    get = lambda res, key: ms(res[key]) if key in res else "-"  # noqa: E731
    ratio = lambda a, b, key: (  # noqa: E731
        f"{a[key] / b[key]:.2f}" if key in a and key in b else "-")
    cells += [get(kernel, "fwd"), get(kernel, "fwd+bwd"), get(xla, "fwd"),
              get(xla, "fwd+bwd"), ratio(xla, kernel, "fwd"),
              ratio(xla, kernel, "fwd+bwd"), get(r["fla"], "fwd"),
              get(r["fla"], "fwd+bwd"), ratio(r["fla"], kernel, "fwd+bwd")]
    cells.append(f"{kernel['compile']:.1f} / {xla['compile']:.1f}"
                 if "compile" in kernel and "compile" in xla else "-")
    cells.append(r.get("agree", "-"))
    cells.append(r.get("fla agree", "-"))
    lines.append("| " + " | ".join(cells) + " |")
  errors = [f"- {r['op']} T={r['T']} {impl}: {r[impl]['error']}"
            for r in rows for impl in ("pallas", "xla", "fla")
            if "error" in r[impl]]
  if errors:
    lines += ["", "Errors:", ""] + errors
  return lines


def benchmark():
  """Kernel and XLA form for every shape first, then fla's kernels (their
  first call autotunes, about a minute each), rewriting the table (and
  ``--out``) after every step, so a run cut short keeps what it measured."""
  platform = jax.devices()[0].platform
  fla_run, fla_note = (fla_timer() if platform == "gpu"
                       else (None, "not a CUDA GPU"))
  dtype = _DTYPES[FLAGS.dtype]
  rows, outputs, lines = [], [], []

  def report(row):
    nonlocal lines
    print(row, flush=True)
    lines = _table(rows, platform, fla_note)
    if FLAGS.out:
      with open(FLAGS.out, "w") as f:
        f.write("\n".join(lines) + "\n")

  shapes = [(op, int(t), int(h), int(d)) for op, t, h, d in itertools.product(
      FLAGS.ops, FLAGS.lengths, FLAGS.heads, FLAGS.dims)]
  for op, t, h, d in shapes:
    inputs, do = make_inputs(op, FLAGS.batch, t, h, d, dtype)
    row = {"op": op, "T": t, "H": h, "D": d, "fla": {}}
    for impl in ("pallas", "xla"):
      row[impl] = _time_impl(op, impl, inputs, do)
    kernel_values = row["pallas"].pop("values", None)
    xla_values = row["xla"].pop("values", None)
    if kernel_values is not None and xla_values is not None:
      diffs = [_rel_diff(a, b) for a, b in zip(jax.tree.leaves(kernel_values),
                                               jax.tree.leaves(xla_values))]
      row["agree"] = f"{diffs[0]:.1e}, {max(diffs[1:]):.1e}"
    outputs.append(None if xla_values is None
                   else (xla_values[0], xla_values[1][0]))
    rows.append(row)
    report(row)
  if fla_run is None:
    return lines
  for (op, t, h, d), row, xla in zip(shapes, rows, outputs):
    inputs, do = make_inputs(op, FLAGS.batch, t, h, d, dtype)
    try:
      # The backward first: fla refuses some ops' backward on some Triton
      # versions, and a refusal then costs no autotuning.
      bwd, fla_grads = fla_run(op, inputs, do, True, FLAGS.warmup,
                               FLAGS.iters)
      fwd, o = fla_run(op, inputs, do, False, FLAGS.warmup, FLAGS.iters)
      row["fla"] = {"fwd": fwd, "fwd+bwd": bwd}
      if xla is not None:
        xla_o, xla_grads = xla
        agree = f"{_rel_diff(o, xla_o):.1e}"
        if FLAGS.fla_past_triton_guard:
          diffs = [_rel_diff(fla_grads[name], xla_grads[name])
                   for name in fla_grads if name in xla_grads]
          agree += f", {max(diffs):.1e}"
        row["fla agree"] = agree
    except Exception as error:  # noqa: BLE001 (reported in the table)
      row["fla"] = {"error": _error_text(error)}
    report(row)
  return lines


def smoke():
  """Interpret-mode kernel against the XLA form on tiny shapes."""
  lines = [
      f"Smoke run on {jax.devices()[0].platform}: no TPU or GPU, so the "
      "kernels run in interpret mode; this checks that the benchmark's "
      "functions run and agree, not how fast the kernels are.",
      "",
      "| op | B, T, H, K=V | dtype | max rel. diff o | max rel. diff grads |",
      "|---|---|---|---|---|"]
  for op in FLAGS.ops:
    # T = 150: several chunks of the default sizes (64 tokens).
    b, t, h, d = 1, 150, 2, 32
    inputs, do = make_inputs(op, b, t, h, d, _DTYPES[FLAGS.dtype])
    results = {}
    for impl in ("pallas", "xla"):
      _, forward_backward = jax_functions(op, impl)
      results[impl] = jax.block_until_ready(forward_backward(inputs, do))
    diffs = [_rel_diff(a, b) for a, b in zip(
        jax.tree.leaves(results["pallas"]), jax.tree.leaves(results["xla"]))]
    lines.append(f"| {op} | {b}, {t}, {h}, {d} | {FLAGS.dtype} | "
                 f"{diffs[0]:.1e} | {max(diffs[1:]):.1e} |")
    print(lines[-1], flush=True)
  return lines


def _rel_diff(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main(argv):
  del argv
  accelerator = jax.devices()[0].platform in ("tpu", "gpu")
  if not accelerator and not FLAGS.smoke:
    print("No TPU or GPU: kernel timings need one. Running the smoke "
          "comparison (--smoke) instead.")
  lines = benchmark() if accelerator and not FLAGS.smoke else smoke()
  print("\n".join(lines))
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
