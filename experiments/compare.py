"""Trains several mixers on the same data and token budget and compares
them: held-out bits per byte, training tokens/s, recurrent state per layer,
decoding time per token; a table (markdown) and one plot of held-out bits
per byte against tokens, a line per mixer.

  python -m experiments.compare --out=benchmarks/RESULTS_compare.md \\
      --plot=benchmarks/compare.png
  python -m experiments.compare --mixers=gla,mamba2,softmax_attn --steps=100

Every mixer gets the same LM around it (``--n_layers`` blocks of that
mixer, ``--d_model``, SwiGLU MLPs, tied byte embeddings), the same batches
(the standard library's source, byte tokens) and the same held-out
batches. Training runs one mixer after the other; the speeds are then
measured side by side, in rounds (one train step of each mixer in turn,
then one decode of each), so that their ratios hold on a busy machine.

- tokens/s: training tokens per second of one step, the median over
  ``--repeats`` rounds;
- state floats per layer: the floats of one layer's decoding cache for one
  sequence at a context of ``--seq_len`` (the recurrent state; for softmax
  attention the key/value cache, which grows with the context; for a
  sliding window, the window's);
- decode ms/token: ``LM.generate`` of ``--decode_tokens`` new tokens minus
  that of one new token, per token, batch 1, after a prompt of
  ``--decode_prompt`` tokens (medians over the rounds).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import run_output
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (BatchSource, PackedRows,
                               stdlib_corpus)
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.train import TrainConfig, Trainer
from lin_attn_jax.train.loop import fit

FLAGS = flags.FLAGS
flags.DEFINE_list("mixers", ["gla", "retnet", "hgrn2", "linear_attn",
                             "mamba2", "gated_deltanet", "deltanet", "rwkv6",
                             "sliding_window_attn", "softmax_attn"],
                  "Mixers to train (names in lin_attn_jax.layers.MIXERS).")
flags.DEFINE_integer("d_model", 128, "Model width.")
flags.DEFINE_integer("n_layers", 2, "Blocks (all of the compared mixer).")
flags.DEFINE_integer("n_heads", 4, "Heads.")
flags.DEFINE_integer("batch_size", 16, "Rows per step.")
flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
flags.DEFINE_integer("steps", 200, "Steps per mixer (the token budget is "
                     "steps x batch_size x seq_len).")
flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
flags.DEFINE_integer("warmup_steps", 20, "Warmup steps.")
flags.DEFINE_integer("eval_every", 25, "Steps between held-out evaluations.")
flags.DEFINE_integer("eval_batches", 8, "Held-out batches per evaluation.")
flags.DEFINE_integer("window", 64, "sliding_window_attn window.")
flags.DEFINE_integer("chunk_size", 32, "Chunk size of the chunk forms.")
flags.DEFINE_integer("repeats", 5, "Rounds of the speed measurements.")
flags.DEFINE_integer("decode_prompt", 16, "Prompt tokens before decoding.")
flags.DEFINE_integer("decode_tokens", 33, "New tokens of the decode timing.")
flags.DEFINE_string("out", "", "Markdown file for the table (a section).")
flags.DEFINE_string("plot", "", "PNG of held-out bits per byte vs tokens.")
flags.DEFINE_string("curves", "", "JSON of every mixer's curves and figures "
                    "(default: --out with .json).")

CHUNKED = ("gla", "retnet", "hgrn2", "linear_attn", "based", "performer",
           "mamba2", "deltanet", "gated_deltanet", "kda", "rwkv6", "rwkv7")


def model_config(mixer: str) -> LMConfig:
  options = {}
  if mixer in CHUNKED:
    options[mixer] = {"chunk_size": FLAGS.chunk_size}
  if mixer == "sliding_window_attn":
    options[mixer] = {"window_size": FLAGS.window}
  return LMConfig(vocab_size=256, d_model=FLAGS.d_model,
                  n_layers=FLAGS.n_layers, n_heads=FLAGS.n_heads,
                  mixer=mixer, mixer_options=options)


def train_config() -> TrainConfig:
  return TrainConfig(batch_size=FLAGS.batch_size, seq_len=FLAGS.seq_len,
                     steps=FLAGS.steps, learning_rate=FLAGS.learning_rate,
                     warmup_steps=FLAGS.warmup_steps)


def state_floats(config: LMConfig) -> int:
  """Floats of one layer's decoding cache, one sequence, context seq_len."""
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  cache = jax.eval_shape(lambda: lm.blocks[0].mixer.init_mixer_cache(
      1, FLAGS.seq_len, jnp.float32))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(cache))


def parameter_count(config: LMConfig) -> int:
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in
             jax.tree.leaves(nnx.state(lm, nnx.Param)))


def timed(fn) -> float:
  began = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - began


def main(argv):
  del argv
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  unknown = sorted(set(FLAGS.mixers) - set(MIXERS))
  if unknown:
    raise app.UsageError(f"--mixers: unknown {unknown}; known: "
                         f"{sorted(MIXERS)}")
  mesh = shd.make_mesh("fsdp=1", jax.devices()[:1])
  train_rows = PackedRows(stdlib_corpus("train"), FLAGS.seq_len, seed=0)
  held_rows = PackedRows(stdlib_corpus("heldout"), FLAGS.seq_len, seed=0)
  tokens_per_step = FLAGS.batch_size * FLAGS.seq_len
  runs = {}
  for name in FLAGS.mixers:
    config = model_config(name)
    trainer = Trainer(config, train_config(), mesh=mesh, rules="dp")
    began = time.perf_counter()
    result = fit(trainer, train_rows, heldout_rows=held_rows,
                 eval_every=FLAGS.eval_every,
                 eval_batches=FLAGS.eval_batches, eval_at_start=True,
                 log=lambda line: None)
    evals = [(r["step"] * tokens_per_step, r["eval_bits_per_token"])
             for r in result.history if "eval_bits_per_token" in r]
    runs[name] = {"trainer": trainer, "state": result.state,
                  "curve": evals, "train_seconds": time.perf_counter() - began,
                  "first_step_seconds": next(
                      r["seconds"] for r in result.history if "loss" in r),
                  "step_times": [], "decode_times": []}
    print(f"{name}: held-out {evals[0][1]:.3f} -> {evals[-1][1]:.3f} bits/"
          f"byte after {FLAGS.steps} steps ({runs[name]['train_seconds']:.0f}"
          " s)", flush=True)

  source = BatchSource(train_rows, FLAGS.batch_size)
  prompt = jnp.asarray(np.frombuffer(b"def __init__(self", np.uint8)
                       [:FLAGS.decode_prompt][None], jnp.int32)
  for run in runs.values():
    run["batch"] = run["trainer"].place_batch(source.batch(FLAGS.steps))
    with jax.set_mesh(mesh):
      lm = run["trainer"].model(run["state"])
      for n in (1, FLAGS.decode_tokens):
        jax.block_until_ready(lm.generate(prompt, n))
  for _ in range(FLAGS.repeats):
    for run in runs.values():
      trainer = run["trainer"]

      def step(run=run, trainer=trainer):
        run["state"], metrics = trainer.step(run["state"], run["batch"])
        return metrics

      run["step_times"].append(timed(step))
    for run in runs.values():
      with jax.set_mesh(mesh):
        # The train steps donate the state: the model is merged anew.
        lm = run["trainer"].model(run["state"])
        many = timed(lambda lm=lm: lm.generate(prompt, FLAGS.decode_tokens))
        one = timed(lambda lm=lm: lm.generate(prompt, 1))
      run["decode_times"].append((many - one) / (FLAGS.decode_tokens - 1))

  rows = []
  for name, run in runs.items():
    config = model_config(name)
    rows.append({
        "mixer": name,
        "bits_per_byte": run["curve"][-1][1],
        "start_bits_per_byte": run["curve"][0][1],
        "tokens_per_second": tokens_per_step / statistics.median(
            run["step_times"]),
        "state_floats_per_layer": state_floats(config),
        "decode_ms_per_token": 1e3 * statistics.median(run["decode_times"]),
        "parameters": parameter_count(config),
        "train_seconds": run["train_seconds"],
        "first_step_seconds": run["first_step_seconds"],
        "step_seconds": run["step_times"],
        "decode_seconds_per_token": run["decode_times"],
        "curve": run["curve"],
    })
  rows.sort(key=lambda r: r["bits_per_byte"])
  command = "python -m experiments.compare " + " ".join(sys.argv[1:])
  budget = FLAGS.steps * tokens_per_step
  lines = table_lines(rows, command)
  print("\n".join(lines), flush=True)
  if FLAGS.out:
    from experiments.bench_utils import write_section
    write_section(FLAGS.out, "compare", lines + (
        ["", f"![held-out bits per byte against tokens]"
             f"({os.path.basename(FLAGS.plot)})"] if FLAGS.plot else []))
  curves = FLAGS.curves or (os.path.splitext(FLAGS.out)[0] + ".json"
                            if FLAGS.out else "")
  if curves:
    with open(curves, "w") as f:
      json.dump({"command": command, "rows": rows}, f, indent=1)
  if FLAGS.plot:
    draw(rows, FLAGS.plot, budget)


def table_lines(rows, command: str) -> list[str]:
  """The markdown of the results (the settings are the flags')."""
  tokens_per_step = FLAGS.batch_size * FLAGS.seq_len
  budget = FLAGS.steps * tokens_per_step
  lines = [
      f"Command: `{command.strip()}`",
      "",
      f"{FLAGS.n_layers} layers of one mixer, d_model {FLAGS.d_model}, "
      f"{FLAGS.n_heads} heads, SwiGLU MLPs, byte tokens; {FLAGS.steps} steps "
      f"of {FLAGS.batch_size} x {FLAGS.seq_len} tokens ({budget / 1e3:.0f}k "
      f"tokens) on the standard library's source, AdamW, peak learning rate "
      f"{FLAGS.learning_rate}; held-out bits per byte on "
      f"{FLAGS.eval_batches * tokens_per_step / 1e3:.0f}k held-out tokens. "
      "One CPU device; tokens/s and decode times are medians of "
      f"{FLAGS.repeats} rounds, the mixers timed in turn. State floats: one "
      "layer's decoding cache for one sequence at a context of "
      f"{FLAGS.seq_len} tokens.",
      "",
      "| mixer | held-out bits/byte | at step 0 | train tokens/s | state "
      "floats per layer | decode ms/token | parameters |",
      "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    decode = r["decode_ms_per_token"]
    lines.append(
        f"| {r['mixer']} | {r['bits_per_byte']:.3f} | "
        f"{r['start_bits_per_byte']:.2f} | {r['tokens_per_second']:,.0f} | "
        f"{r['state_floats_per_layer']:,} | "
        f"{f'{decode:.2f}' if decode > 0 else '—'} | {r['parameters']:,} |")
  if any(r["decode_ms_per_token"] <= 0 for r in rows):
    lines += ["", f"—: decoding {FLAGS.decode_tokens} tokens did not time "
              "longer than decoding one (the difference was within the "
              "timing noise)."]
  return lines


def draw(rows, path: str, budget: int) -> None:
  plt = run_output.matplotlib_pyplot()
  if plt is None:
    print("no plot: matplotlib is missing (pip install -e '.[analysis]')")
    return
  fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
  for r in rows:
    x, y = zip(*r["curve"])
    ax.plot(x, y, marker=".", label=f"{r['mixer']} ({y[-1]:.2f})")
  ax.set_xlabel("training tokens")
  ax.set_ylabel("held-out bits per byte")
  ax.set_ylim(top=min(max(r["curve"][1][1] for r in rows) + 0.3, 9))
  ax.set_title(f"{FLAGS.n_layers} x d_model {FLAGS.d_model}, "
               f"{budget / 1e3:.0f}k tokens of Python source", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


if __name__ == "__main__":
  app.run(main)
