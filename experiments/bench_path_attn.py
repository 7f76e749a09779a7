"""Forward+backward temp memory (and time) of PaTH attention's blockwise
form against its ``[T, T]`` definition, over the sequence length.

Each function is the gradient of ``sum(o)`` for q, k, v, w, beta and g,
jitted and compiled once per length; the memory is XLA's temp buffer size
from ``compile().memory_analysis()`` (exact, repeatable). The blockwise
form is also run, best of ``--repeats`` after one warm-up run (0: memory
only); the definition is compiled, not run, beyond ``--max_naive_length``
not even compiled.

Run:
  python -m experiments.bench_path_attn --lengths=2048,4096,8192
"""

from __future__ import annotations

import functools
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from lin_attn_jax.ops import registry

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["2048", "4096", "8192"], "Sequence lengths T.")
flags.DEFINE_integer("batch", 1, "Batch B.")
flags.DEFINE_integer("heads", 4, "Query heads H (key/value heads H / 2).")
flags.DEFINE_integer("dim", 64, "Head dimension K = V.")
flags.DEFINE_integer("chunk_size", 64, "Chunk size C of the blockwise form.")
flags.DEFINE_integer("max_naive_length", 4096,
                     "Longest T for the definition (its memory is O(T^2)).")
flags.DEFINE_integer("repeats", 0, "Timed runs of the blockwise form (best "
                     "kept); 0 for memory only.")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")

GRADS = ("q", "k", "v", "w", "beta", "g")


def gradient(form, inputs):
  """The compiled gradient of ``sum(o)`` and its arguments."""
  fixed = {n: x for n, x in inputs.items() if n not in GRADS}

  def loss(*diff):
    o, _ = form(**fixed, **dict(zip(GRADS, diff)))
    return jnp.sum(o.astype(jnp.float32))

  args = [inputs[n] for n in GRADS]
  grad = jax.grad(loss, argnums=tuple(range(len(GRADS))))
  return jax.jit(grad).lower(*args).compile(), args


def best_time(compiled, args, repeats):
  jax.block_until_ready(compiled(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    best = min(best, time.perf_counter() - start)
  return best


def main(argv):
  del argv
  spec = registry.get_spec("path_attn")
  chunk = functools.partial(spec.forms["chunk"], chunk_size=FLAGS.chunk_size)
  rows = []
  for length in (int(t) for t in FLAGS.lengths):
    dims = registry.Dims(FLAGS.batch, length, FLAGS.heads, FLAGS.dim,
                         FLAGS.dim)
    inputs = spec.make_inputs(jax.random.PRNGKey(0), dims, False)
    inputs["segment_ids"] = None
    compiled, args = gradient(chunk, inputs)
    temp = compiled.memory_analysis().temp_size_in_bytes
    seconds = (f"{best_time(compiled, args, FLAGS.repeats):.2f}"
               if FLAGS.repeats else "-")
    naive = "-"
    if length <= FLAGS.max_naive_length:
      compiled, _ = gradient(spec.forms["naive"], inputs)
      naive = f"{compiled.memory_analysis().temp_size_in_bytes / 2**20:.0f}"
    row = (f"| {length} | {temp / 2**20:.1f} | {temp / length / 2**10:.1f} | "
           f"{naive} | {seconds} |")
    rows.append(row)
    print(row, flush=True)
  header = [
      f"B={FLAGS.batch}, H={FLAGS.heads} (Hkv={FLAGS.heads // 2}), "
      f"K=V={FLAGS.dim}, float32, gate on, C={FLAGS.chunk_size}, "
      f"{jax.devices()[0].device_kind} ({os.cpu_count()} cores).", "",
      "| T | blockwise fwd+bwd temp (MiB) | per token (KiB) | "
      "definition fwd+bwd temp (MiB) | blockwise fwd+bwd (s) |",
      "|---|---|---|---|---|"]
  table = "\n".join(header + rows)
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
