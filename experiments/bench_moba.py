"""Forward + backward temp memory and time of ``chunk_moba`` against the
sequence length, beside the dense ``parallel_moba``.

The measured function is the gradient of ``sum(o * cotangent)`` with
respect to q, k and v (a forward and a backward pass). Each form is jitted
and compiled once per length; the memory is XLA's temp buffer size from
``compile().memory_analysis()``, the time the best of ``--repeats`` runs
after a warm-up run. The dense form is compiled, not run (its ``[T, T]``
arrays are the point). The rounds are those of ``chunk_moba``'s
selected-block pass: per tile of queries, the largest union over heads of
the blocks its queries selected (the pass's trip count), against the
``top_k - 1`` of a tile whose queries agree.

Run:
  python -m experiments.bench_moba --lengths=2048,4096,8192 \\
      --out=benchmarks/RESULTS_moba.md
"""

from __future__ import annotations

import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops import chunk_moba, parallel_moba
from lin_attn_jax.ops.moba import blocks
from lin_attn_jax.ops.moba.selection import select_blocks

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["2048", "4096", "8192"], "Sequence lengths T.")
flags.DEFINE_integer("batch", 1, "Batch B.")
flags.DEFINE_integer("heads", 4, "Query heads H.")
flags.DEFINE_integer("kv_heads", 2, "Key/value heads Hkv.")
flags.DEFINE_integer("dim", 64, "Head dimension K = V.")
flags.DEFINE_integer("block_size", 256, "MoBA block C (fla's default).")
flags.DEFINE_integer("top_k", 4, "Blocks per query (fla's default).")
flags.DEFINE_integer("chunk_size", 64, "Queries per tile of chunk_moba.")
flags.DEFINE_integer("repeats", 3, "Timed runs per measurement (best kept).")
flags.DEFINE_string("out", "", "Also write the markdown table to this file.")


def gradient_of(form):
  def loss(q, k, v, cotangent):
    o = form(q, k, v, block_size=FLAGS.block_size, top_k=FLAGS.top_k)
    return jnp.sum(o * cotangent)
  return jax.grad(loss, argnums=(0, 1, 2))


def compiled_temp(fn, args):
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, compiled.memory_analysis().temp_size_in_bytes


def best_time(compiled, args, repeats):
  jax.block_until_ready(compiled(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    best = min(best, time.perf_counter() - start)
  return best


def mean_rounds(q, k):
  """``(mean rounds per tile, mean past blocks per tile)`` of one
  document, from the blockwise form's own selection."""
  t, c = q.shape[1], FLAGS.chunk_size
  doc = jnp.zeros((q.shape[0], t), jnp.int32)
  first, doc_of = blocks.full_blocks(doc, FLAGS.block_size)
  means = jnp.mean(blocks.gather_blocks(k, first, FLAGS.block_size), axis=2)
  start = blocks.block_starts(jnp.arange(t)[None], 0, FLAGS.block_size)
  start = jnp.broadcast_to(start, doc.shape)
  picked = np.asarray(jax.jit(lambda q: select_blocks(
      q, means, first, doc_of, doc, start, top_k=FLAGS.top_k, chunk=c))(q))
  picked = picked.reshape(q.shape[0], t // c, c, q.shape[2], -1)
  rounds = [max(len(set(picked[b, n, :, h].ravel()) - {-1})
                for b in range(q.shape[0]) for h in range(q.shape[2]))
            for n in range(t // c)]
  past = [n * c // FLAGS.block_size for n in range(t // c)]
  return float(np.mean(rounds)), float(np.mean(past))


def main(argv):
  del argv
  rows = []
  blockwise = gradient_of(lambda *a, **kw: chunk_moba(
      *a, chunk_size=FLAGS.chunk_size, **kw))
  dense = gradient_of(parallel_moba)
  for length in (int(t) for t in FLAGS.lengths):
    b, h, hkv, d = FLAGS.batch, FLAGS.heads, FLAGS.kv_heads, FLAGS.dim
    keys = jax.random.split(jax.random.PRNGKey(length), 4)
    args = (jax.random.normal(keys[0], (b, length, h, d)),
            jax.random.normal(keys[1], (b, length, hkv, d)),
            jax.random.normal(keys[2], (b, length, hkv, d)),
            jax.random.normal(keys[3], (b, length, h, d)))
    compiled, m_chunk = compiled_temp(blockwise, args)
    t_chunk = best_time(compiled, args, FLAGS.repeats)
    _, m_dense = compiled_temp(dense, args)
    rounds, past = mean_rounds(args[0], args[1])
    rows.append((length, t_chunk, m_chunk, m_dense, rounds, past))
    print(f"T={length}: chunk {t_chunk:.3f}s, {m_chunk / 2**20:.1f} MiB; "
          f"dense {m_dense / 2**20:.0f} MiB; {rounds:.1f} rounds per tile",
          flush=True)

  mib = 2.0 ** 20
  lines = [
      f"B={FLAGS.batch}, H={FLAGS.heads}, Hkv={FLAGS.kv_heads}, "
      f"K=V={FLAGS.dim}, float32, block_size={FLAGS.block_size}, "
      f"top_k={FLAGS.top_k}, chunk_size={FLAGS.chunk_size}, "
      f"{jax.devices()[0].platform} ({os.cpu_count()} cores), forward + "
      f"backward, best of {FLAGS.repeats}.",
      "",
      "| T | chunk_moba: time (s) | chunk_moba: temp (MiB) | temp / T "
      "(KiB) | parallel_moba: temp (MiB) | rounds per tile | past blocks "
      "per tile |",
      "|---|---|---|---|---|---|---|",
  ]
  for length, t_chunk, m_chunk, m_dense, rounds, past in rows:
    lines.append(f"| {length} | {t_chunk:.3f} | {m_chunk / mib:.1f} | "
                 f"{m_chunk / length / 1024:.1f} | {m_dense / mib:.0f} | "
                 f"{rounds:.1f} | {past:.1f} |")
  table = "\n".join(lines)
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table + "\n")


if __name__ == "__main__":
  app.run(main)
