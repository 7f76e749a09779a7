"""Forward + backward temp memory of forgetting attention against the
sequence length: the blockwise ``chunk_forgetting_attn`` (full causal and
with a window) against the ``[T, T]`` reference ``parallel_forgetting_attn``.

Each is the gradient of ``sum(o * cotangent)`` with respect to q, k, v and
the log forget gates, jitted and compiled (not run) once per length; the
memory is XLA's temp buffer size from ``compile().memory_analysis()``
(inputs and outputs not included).

Run:
  python -m experiments.bench_forgetting_attn --lengths=2048,4096,8192 \
      --out=benchmarks/RESULTS_forgetting_attn.md
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from lin_attn_jax.ops import chunk_forgetting_attn, parallel_forgetting_attn

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["2048", "4096", "8192"], "Sequence lengths T.")
flags.DEFINE_integer("window", 512, "Window size w of the windowed form.")
flags.DEFINE_integer("batch", 1, "Batch B.")
flags.DEFINE_integer("heads", 4, "Query heads H.")
flags.DEFINE_integer("kv_heads", 2, "Key/value heads Hkv.")
flags.DEFINE_integer("dim", 64, "Head dimension K = V.")
flags.DEFINE_integer("block_size", 128, "Block size C of the blockwise form.")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")


def temp_bytes(form, length):
  """XLA's temp bytes of ``form``'s forward + backward at length T."""
  b, h, hkv, d = FLAGS.batch, FLAGS.heads, FLAGS.kv_heads, FLAGS.dim
  shapes = [(b, length, h, d), (b, length, hkv, d), (b, length, hkv, d),
            (b, length, h)]
  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
  cotangent = jax.ShapeDtypeStruct((b, length, h, d), jnp.float32)

  def loss(q, k, v, g, co):
    return jnp.sum(form(q, k, v, g) * co)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  return grad.lower(*args, cotangent).compile().memory_analysis(
  ).temp_size_in_bytes


def main(argv):
  del argv
  forms = {
      "blockwise": lambda q, k, v, g: chunk_forgetting_attn(
          q, k, v, g, block_size=FLAGS.block_size),
      "blockwise, window": lambda q, k, v, g: chunk_forgetting_attn(
          q, k, v, g, window_size=FLAGS.window, block_size=FLAGS.block_size),
      "reference [T, T]": parallel_forgetting_attn,
  }
  rows = []
  for length in (int(t) for t in FLAGS.lengths):
    temps = {name: temp_bytes(form, length) for name, form in forms.items()}
    rows.append((length, temps))
    print(f"T={length}: " + ", ".join(f"{n} {m / 2**20:.1f} MiB"
                                      for n, m in temps.items()), flush=True)

  mib = 2.0 ** 20
  names = list(forms)
  lines = [
      f"Forward + backward (gradients of q, k, v, g), B={FLAGS.batch}, "
      f"H={FLAGS.heads}, Hkv={FLAGS.kv_heads}, K=V={FLAGS.dim}, float32, "
      f"block C={FLAGS.block_size}, window w={FLAGS.window}; XLA temp "
      f"bytes, {jax.devices()[0].platform} ({os.cpu_count()} cores).",
      "",
      "| T | " + " | ".join(f"{n}: temp (MiB)" for n in names)
      + " | blockwise temp / T (KiB) |",
      "|---|" + "---|" * (len(names) + 1),
  ]
  for length, temps in rows:
    lines.append(f"| {length} | "
                 + " | ".join(f"{temps[n] / mib:.1f}" for n in names)
                 + f" | {temps['blockwise'] / length / 1024:.1f} |")
  table = "\n".join(lines)
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
