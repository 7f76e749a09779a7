"""Checks every form of every op against its naive form and prints a table.

Outputs, final states and the gradients of every differentiable input (a
random linear functional of outputs and state), as relative RMS errors.
Exits non-zero if any error is over the op's tolerance.

  python experiments/verify_forms.py
  python experiments/verify_forms.py --ops=gla,simple_gla --length=500 \
      --dtype=bfloat16 --chunk_size=16 --strong_gates
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.specs import all_specs  # noqa: E402
from experiments.specs.base import Dims  # noqa: E402
from tests.form_checks import errors_against_reference, run_reference  # noqa: E402

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


def verify(spec, dims, dtype, chunk_size, strong, use_state, use_segments,
           seed):
  """Returns ``[(form, errors, ok)]`` for one op."""
  inputs = spec.make_inputs(jax.random.PRNGKey(seed), dims, strong)
  if not use_state:
    inputs["initial_state"] = None
  if not use_segments:
    inputs["segment_ids"] = None
  reference = functools.partial(spec.forms["naive"], output_final_state=True)
  low = dtype != jnp.float32
  expected = run_reference(reference, inputs, grad_args=spec.grad_args,
                           dtype=dtype, cotangent_seed=seed)
  rows = []
  for name, form in spec.forms.items():
    if name == "naive":
      continue
    kwargs = {"chunk_size": chunk_size} if name in spec.chunked else {}
    errors = errors_against_reference(
        functools.partial(form, output_final_state=True, **kwargs), reference,
        inputs, grad_args=spec.grad_args, dtype=dtype, cotangent_seed=seed,
        reference_result=expected)
    tol = spec.low_precision_tol if low else spec.tol
    grad_tol = spec.low_precision_tol if low else spec.grad_tol
    ok = all(err <= (grad_tol if key.startswith("d") else tol)
             for key, err in errors.items())
    rows.append((name, errors, ok))
  return rows


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
        f"initial_state={FLAGS.initial_state}, segment_ids={FLAGS.segment_ids}")
  print("relative RMS error (o: output, state: final state, dX: gradient)\n")
  print(f"| {'op':<24} | {'form':<10} | {'worst':>8} | ok | errors")
  print(f"|{'-' * 26}|{'-' * 12}|{'-' * 10}|----|-------")
  failures = 0
  for name in names:
    spec = specs[name]
    for form, errors, ok in verify(spec, dims, dtype, FLAGS.chunk_size,
                                   FLAGS.strong_gates, FLAGS.initial_state,
                                   FLAGS.segment_ids, FLAGS.seed):
      failures += not ok
      detail = " ".join(f"{k}={v:.1e}" for k, v in errors.items())
      print(f"| {name:<24} | {form:<10} | {max(errors.values()):8.1e} | "
            f"{'ok' if ok else 'NO'} | {detail}", flush=True)
  print(f"\n{failures} form(s) over tolerance")
  if failures:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
