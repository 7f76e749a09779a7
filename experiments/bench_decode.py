"""Decoding time per token against the context length, for every mixer.

For each mixer, a small LM prefills a random context of each length (in
pieces of --prefill_piece tokens, with the chunk forms) and then decodes
--steps tokens greedily with the step forms, inside one compiled
``lax.scan``. The two context lengths are timed alternately, so their ratio
is measured side by side. A recurrent mixer's step costs the same at any
context (its cache is a fixed-size state); full softmax attention's grows
with the number of cached keys. The cache size is exact (bytes of its
arrays).

  python -m experiments.bench_decode --out=benchmarks/RESULTS.md
  python -m experiments.bench_decode --mixers=gla,softmax_attn \
      --contexts=512,8192

``--checkpoints`` times HuggingFace-format checkpoints instead (each LM as
``convert.load_pretrained`` builds it, its mixers and MLPs as they are),
e.g. the tiny hybrids of ``tests/fixtures/hf``:

  python -m experiments.bench_decode --contexts=512,1024,2048,4096,8192 \
      --checkpoints=tests/fixtures/hf/qwen3_next_hybrid,... \
      --out=benchmarks/RESULTS_hybrids.md
"""

from __future__ import annotations

import functools
import os
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.bench_utils import write_section
from lin_attn_jax import convert
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models import LM, LMConfig

FLAGS = flags.FLAGS
flags.DEFINE_list("mixers", [], "Mixers to time (default: every causal one).")
flags.DEFINE_list("contexts", ["512", "8192"], "Context lengths.")
flags.DEFINE_list("checkpoints", [], "HuggingFace-format checkpoint "
                  "directories to time instead of --mixers.")
flags.DEFINE_integer("d_model", 256, "Model width.")
flags.DEFINE_integer("n_layers", 2, "Blocks.")
flags.DEFINE_integer("n_heads", 4, "Heads per mixer.")
flags.DEFINE_integer("batch", 1, "Rows decoded together.")
flags.DEFINE_integer("steps", 64, "Decoded tokens per timed run.")
flags.DEFINE_integer("prefill_piece", 512, "Tokens per prefill call.")
flags.DEFINE_integer("repeats", 5, "Timed runs per context (alternating).")
flags.DEFINE_string("out", "", "Markdown file to write the table into.")


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _model(name: str) -> LM:
  """The LM of a checkpoint directory, or a small LM of the mixer
  ``name``."""
  if os.path.isdir(name):
    return convert.load_pretrained(name)[0]
  config = LMConfig(vocab_size=256, d_model=FLAGS.d_model,
                    n_layers=FLAGS.n_layers, n_heads=FLAGS.n_heads,
                    mixer=name)
  return LM(config, rngs=nnx.Rngs(0))


def _prepare(name: str, contexts):
  """Returns (decode fn, {context: (state, cache, token)})."""
  lm = _model(name)
  vocab = lm.config.vocab_size
  graphdef, state = nnx.split(lm)

  @jax.jit
  def prefill(state, cache, tokens):
    logits, cache = nnx.merge(graphdef, state)(tokens, cache=cache)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  @functools.partial(jax.jit, static_argnames="steps")
  def decode(state, cache, token, steps):
    model = nnx.merge(graphdef, state)

    def step(carry, _):
      token, cache = carry
      logits, cache = model(token[:, None], cache=cache)
      return (jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache), ()

    (token, _), _ = jax.lax.scan(step, (token, cache), None, length=steps)
    return token

  rng = np.random.default_rng(0)
  inputs = {}
  for context in contexts:
    cache = lm.init_cache(FLAGS.batch, context + FLAGS.steps + 1)
    piece = min(FLAGS.prefill_piece, context)
    if context % piece:
      raise ValueError(f"context {context} is not a multiple of "
                       f"--prefill_piece={piece}")
    tokens = jnp.asarray(rng.integers(0, vocab, (FLAGS.batch, context)),
                         jnp.int32)
    for start in range(0, context, piece):
      token, cache = prefill(state, cache, tokens[:, start:start + piece])
    inputs[context] = (state, cache, token)
  return decode, inputs


def main(argv):
  del argv
  contexts = [int(c) for c in FLAGS.contexts]
  names = (FLAGS.checkpoints or FLAGS.mixers
           or [n for n in MIXERS if MIXERS[n].causal])
  source = (f"--checkpoints={','.join(names)}" if FLAGS.checkpoints else
            f"--mixers={','.join(names)} --d_model={FLAGS.d_model} "
            f"--n_layers={FLAGS.n_layers} --n_heads={FLAGS.n_heads}")
  kind = "checkpoint" if FLAGS.checkpoints else "mixer"
  head = (f"| {kind} | " + " | ".join(f"ms/token @{c}" for c in contexts)
          + f" | ratio {contexts[-1]}/{contexts[0]} | "
          + " | ".join(f"cache MiB @{c}" for c in contexts) + " |")
  lines = [
      f"Command: `python -m experiments.bench_decode {source} "
      f"--contexts={','.join(FLAGS.contexts)} --batch={FLAGS.batch} "
      f"--steps={FLAGS.steps} --repeats={FLAGS.repeats}`",
      f"Device: {jax.devices()[0].device_kind}, {os.cpu_count()} cores; "
      f"median of {FLAGS.repeats} alternating runs of {FLAGS.steps} greedy "
      "decoding steps in one compiled scan, float32.",
      "", head, "|" + "---|" * (2 * len(contexts) + 2)]
  print("\n".join(lines[-2:]), flush=True)
  for name in names:
    decode, inputs = _prepare(name, contexts)
    for args in inputs.values():
      jax.block_until_ready(decode(*args, steps=FLAGS.steps))
    times = {c: [] for c in contexts}
    for _ in range(FLAGS.repeats):
      for c in contexts:
        start = time.perf_counter()
        jax.block_until_ready(decode(*inputs[c], steps=FLAGS.steps))
        times[c].append((time.perf_counter() - start) / FLAGS.steps)
    per_token = {c: statistics.median(times[c]) * 1e3 for c in contexts}
    mib = {c: _nbytes(inputs[c][1]) / 2 ** 20 for c in contexts}
    label = os.path.basename(os.path.normpath(name))
    row = (f"| {label} | " + " | ".join(f"{per_token[c]:.3f}" for c in contexts)
           + f" | {per_token[contexts[-1]] / per_token[contexts[0]]:.2f}x | "
           + " | ".join(f"{mib[c]:.2f}" for c in contexts) + " |")
    lines.append(row)
    print(row, flush=True)
  if FLAGS.out:
    title = (f"bench_decode checkpoints B={FLAGS.batch}" if FLAGS.checkpoints
             else f"bench_decode d_model={FLAGS.d_model} "
             f"n_layers={FLAGS.n_layers} B={FLAGS.batch}")
    write_section(FLAGS.out, title, lines)


if __name__ == "__main__":
  app.run(main)
