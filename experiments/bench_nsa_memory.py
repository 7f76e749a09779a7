"""Temp memory of native sparse attention's forward + backward against T.

``jax.grad`` of ``sum(o * cotangent)`` with respect to q, k, v and the three
gates, for the blockwise ``chunk_nsa`` and the dense ``parallel_nsa``, each
jitted and compiled (not run) once per length; the memory is XLA's temp
buffer size from ``compile().memory_analysis()``. fla's defaults: blocks of
64, 16 selected, a window of 512.

Run:
  python -m experiments.bench_nsa_memory --lengths=2048,4096,8192
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from lin_attn_jax.ops import chunk_nsa, parallel_nsa

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["2048", "4096", "8192"], "Sequence lengths T.")
flags.DEFINE_integer("batch", 1, "Batch B.")
flags.DEFINE_integer("heads", 4, "Query heads H.")
flags.DEFINE_integer("heads_kv", 1, "Key/value heads Hkv.")
flags.DEFINE_integer("dim", 64, "Head dimension K = V.")
flags.DEFINE_integer("block_size", 64, "Block size l.")
flags.DEFINE_integer("block_counts", 16, "Selected blocks n.")
flags.DEFINE_integer("window", 512, "Window size w.")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")


def grad_temp(form, length):
  """Temp bytes of the compiled gradient of ``form`` at ``length``."""
  b, h, hkv, d = FLAGS.batch, FLAGS.heads, FLAGS.heads_kv, FLAGS.dim
  shapes = [(b, length, h, d), (b, length, hkv, d), (b, length, hkv, d)]
  shapes += [(b, length, h)] * 3
  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
  cotangent = jax.ShapeDtypeStruct((b, length, h, d), jnp.float32)
  options = dict(block_size=FLAGS.block_size,
                 block_counts=FLAGS.block_counts, window_size=FLAGS.window)

  def loss(args, cotangent):
    return jnp.sum(form(*args, **options) * cotangent)

  compiled = jax.jit(jax.grad(loss)).lower(args, cotangent).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def main(argv):
  del argv
  mib = 2.0 ** 20
  lines = [
      f"B={FLAGS.batch}, H={FLAGS.heads}, Hkv={FLAGS.heads_kv}, "
      f"K=V={FLAGS.dim}, float32, l={FLAGS.block_size}, "
      f"n={FLAGS.block_counts}, w={FLAGS.window}, forward + backward, "
      f"{jax.devices()[0].platform} ({os.cpu_count()} cores), compiled "
      f"only.",
      "",
      "| T | chunk_nsa: temp (MiB) | chunk temp / T (KiB) | parallel_nsa: "
      "temp (MiB) | parallel temp / T^2 (B) |",
      "|---|---|---|---|---|",
  ]
  for length in (int(t) for t in FLAGS.lengths):
    chunk = grad_temp(chunk_nsa, length)
    dense = grad_temp(parallel_nsa, length)
    lines.append(f"| {length} | {chunk / mib:.1f} | "
                 f"{chunk / length / 1024:.1f} | {dense / mib:.0f} | "
                 f"{dense / length ** 2:.1f} |")
    print(lines[-1], flush=True)
  table = "\n".join(lines)
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
