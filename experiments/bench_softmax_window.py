"""Forward time and temp memory of ``chunk_softmax_attn`` with and without a
sliding window, against the sequence length.

Each form is jitted and compiled once per length; the time is the best of
``--repeats`` runs after one warm-up run, and the memory is XLA's temp
buffer size from ``compile().memory_analysis()``. The dense
``parallel_softmax_attn`` is compiled (not run) for its memory only.

Run:
  python -m experiments.bench_softmax_window --lengths=2048,4096,8192,16384
"""

from __future__ import annotations

import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from lin_attn_jax.ops import chunk_softmax_attn, parallel_softmax_attn

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["2048", "4096", "8192", "16384"],
                  "Sequence lengths T.")
flags.DEFINE_integer("window", 512, "Window size w of the windowed form.")
flags.DEFINE_integer("batch", 1, "Batch B.")
flags.DEFINE_integer("heads", 4, "Query heads H (= key/value heads).")
flags.DEFINE_integer("dim", 64, "Head dimension K = V.")
flags.DEFINE_integer("block_size", 128, "Block size C of the chunk form.")
flags.DEFINE_integer("repeats", 3, "Timed runs per measurement (best kept).")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")


def measure(fn, args, repeats):
  """``(best seconds, temp bytes)`` of the jitted ``fn``."""
  compiled = jax.jit(fn).lower(*args).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  jax.block_until_ready(compiled(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    best = min(best, time.perf_counter() - start)
  return best, temp


def dense_temp(args):
  return (jax.jit(parallel_softmax_attn).lower(*args).compile()
          .memory_analysis().temp_size_in_bytes)


def main(argv):
  del argv
  rows = []
  for length in (int(t) for t in FLAGS.lengths):
    shape = (FLAGS.batch, length, FLAGS.heads, FLAGS.dim)
    keys = jax.random.split(jax.random.PRNGKey(length), 3)
    args = tuple(jax.random.normal(key, shape, jnp.float32) for key in keys)
    windowed = lambda q, k, v: chunk_softmax_attn(
        q, k, v, window_size=FLAGS.window, block_size=FLAGS.block_size)
    full = lambda q, k, v: chunk_softmax_attn(q, k, v,
                                              block_size=FLAGS.block_size)
    t_win, m_win = measure(windowed, args, FLAGS.repeats)
    t_full, m_full = measure(full, args, FLAGS.repeats)
    rows.append((length, t_win, t_full, m_win, m_full, dense_temp(args)))
    print(f"T={length}: window {t_win:.3f}s, full {t_full:.3f}s, "
          f"speed-up {t_full / t_win:.1f}x", flush=True)

  mib = 2.0 ** 20
  lines = [
      f"B={FLAGS.batch}, H={FLAGS.heads}, K=V={FLAGS.dim}, float32, "
      f"window w={FLAGS.window}, block C={FLAGS.block_size}, "
      f"{jax.devices()[0].platform} ({os.cpu_count()} cores), best of "
      f"{FLAGS.repeats}.",
      "",
      "| T | window: time (s) | full: time (s) | speed-up | window: temp "
      "(MiB) | window temp / T (KiB) | full: temp (MiB) | dense [T, T]: "
      "temp (MiB) |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for length, t_win, t_full, m_win, m_full, m_dense in rows:
    lines.append(f"| {length} | {t_win:.3f} | {t_full:.3f} | "
                 f"{t_full / t_win:.1f}x | {m_win / mib:.1f} | "
                 f"{m_win / length / 1024:.1f} | {m_full / mib:.1f} | "
                 f"{m_dense / mib:.0f} |")
  table = "\n".join(lines)
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
