"""Checks every form of every op against its naive form and prints a table.

Outputs, final states and the gradients of every differentiable input (a
random linear functional of outputs and state), as relative RMS errors, by
``lin_attn_jax.testing.check_forms`` on the ops of
``lin_attn_jax.ops.registry``. Exits non-zero if any error is over the op's
tolerance.

  python -m experiments.verify_forms
  python -m experiments.verify_forms --ops=gla,simple_gla --length=500 \
      --dtype=bfloat16 --chunk_size=16 --strong_gates
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m experiments.verify_forms --ops=gla --length=256 \
      --context_parallel=2,4
"""

from __future__ import annotations

import sys

from absl import app, flags
import jax.numpy as jnp

from lin_attn_jax import testing
from lin_attn_jax.ops.registry import Dims, all_specs

FLAGS = flags.FLAGS
flags.DEFINE_list("ops", [], "Ops to check (default: all).")
flags.DEFINE_integer("batch", 2, "B.")
flags.DEFINE_integer("length", 200, "T (a length that is not a multiple of "
                     "the chunk size checks the padding).")
flags.DEFINE_integer("heads", 2, "H.")
flags.DEFINE_integer("dim_k", 32, "K (key / state size).")
flags.DEFINE_integer("dim_v", 48, "V (value / head size).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                  "Input dtype of the checked forms (the reference is float32).")
flags.DEFINE_integer("chunk_size", 64, "Chunk size of the chunk forms.")
flags.DEFINE_boolean("strong_gates", True, "Use strong log-decays "
                     "(log_sigmoid(x) / 0.05) instead of gentle ones.")
flags.DEFINE_boolean("initial_state", True, "Pass an initial state.")
flags.DEFINE_boolean("segment_ids", True, "Pack several documents per row.")
flags.DEFINE_integer("seed", 0, "PRNG seed of the inputs.")
flags.DEFINE_list("context_parallel", [], "Sequence-axis sizes to also run "
                  "the forms that split a sequence at (needs that many "
                  "devices; the length must split into whole chunks).")


def verify(spec, dims, dtype, chunk_size, strong, use_state, use_segments,
           seed, context_parallel=()):
  """Returns ``[(form, errors, ok)]`` for one op."""
  if context_parallel and not spec.context_parallel:
    context_parallel = ()
  try:
    errors = testing.check_forms(
        spec, dims=dims, strong=strong, initial_state=use_state,
        segment_ids=use_segments, chunk_size=chunk_size, dtype=dtype,
        context_parallel=context_parallel, seed=seed)
    failures = {}
  except testing.FormMismatch as mismatch:
    errors, failures = mismatch.errors, mismatch.failures
  return [(name, errs, name not in failures) for name, errs in errors.items()]


def main(argv):
  del argv
  specs = all_specs()
  names = FLAGS.ops or list(specs)
  unknown = [n for n in names if n not in specs]
  if unknown:
    raise app.UsageError(f"unknown ops {unknown}; known: {sorted(specs)}")
  dims = Dims(FLAGS.batch, FLAGS.length, FLAGS.heads, FLAGS.dim_k, FLAGS.dim_v)
  dtype = jnp.dtype(FLAGS.dtype)
  print(f"# forms vs naive: {dims}, dtype={dtype.name}, "
        f"chunk_size={FLAGS.chunk_size}, strong_gates={FLAGS.strong_gates}, "
        f"initial_state={FLAGS.initial_state}, segment_ids={FLAGS.segment_ids}"
        f", context_parallel={FLAGS.context_parallel}")
  print("relative RMS error (o: output, state: final state, dX: gradient)\n")
  print(f"| {'op':<24} | {'form':<18} | {'worst':>8} | ok | errors")
  print(f"|{'-' * 26}|{'-' * 20}|{'-' * 10}|----|-------")
  failures = 0
  for name in names:
    spec = specs[name]
    for form, errors, ok in verify(spec, dims, dtype, FLAGS.chunk_size,
                                   FLAGS.strong_gates, FLAGS.initial_state,
                                   FLAGS.segment_ids, FLAGS.seed,
                                   [int(p) for p in FLAGS.context_parallel]):
      failures += not ok
      detail = " ".join(f"{k}={v:.1e}" for k, v in errors.items())
      print(f"| {name:<24} | {form:<18} | {max(errors.values()):8.1e} | "
            f"{'ok' if ok else 'NO'} | {detail}", flush=True)
  print(f"\n{failures} form(s) over tolerance")
  if failures:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
