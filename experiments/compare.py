"""Trains several mixers on the same data and token budget and compares
them: held-out bits per byte, training tokens/s, recurrent state per layer,
decoding time per token; a table (markdown) and one plot of held-out bits
per byte against tokens, a line per mixer.

  python -m experiments.compare --out=benchmarks/RESULTS_compare.md \\
      --plot=benchmarks/compare.png
  python -m experiments.compare --config.mixers=gla,mamba2,softmax_attn \\
      --config.train.steps=100
  python -m experiments.compare --config=quick \\
      --out=benchmarks/RESULTS_compare.md --plot=benchmarks/compare.png

``--config=NAME`` picks a preset of ``PRESETS`` (a ``Comparison``);
``--config.<field>=VALUE`` changes any field of it by its dotted name
(``experiments/config_flags.py``): ``--config.model.d_model=64``,
``--config.train.steps=120``, ``--config.mixers=gla,retnet``. The other
flags say where the results go.

Every mixer gets the same LM around it (``config.model`` with the mixer in
every block: ``n_layers``, ``d_model``, SwiGLU MLPs, tied byte embeddings),
the same batches (the standard library's source, byte tokens) and the same
held-out batches. Training runs one mixer after the other; the speeds are
then measured side by side, in rounds (one train step of each mixer in
turn, then one decode of each), so that their ratios hold on a busy
machine.

- tokens/s: training tokens per second of one step, the median over
  ``config.repeats`` rounds;
- state floats per layer: the floats of one layer's decoding cache for one
  sequence at a context of ``config.train.seq_len`` (the recurrent state;
  for softmax attention the key/value cache, which grows with the context;
  for a sliding window, the window's);
- decode ms/token: ``LM.generate`` of ``config.decode_tokens`` new tokens
  minus that of one new token, per token, batch 1, after a prompt of
  ``config.decode_prompt`` tokens (medians over the rounds).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Mapping

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import config_flags, run_output
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (BatchSource, PackedRows,
                               stdlib_corpus)
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.ops.common import checks
from lin_attn_jax.train import TrainConfig, Trainer
from lin_attn_jax.train.loop import fit

# Mixers whose chunk form takes Comparison.chunk_size.
CHUNKED = ("gla", "retnet", "hgrn2", "linear_attn", "based", "performer",
           "mamba2", "deltanet", "gated_deltanet", "kda", "rwkv6", "rwkv7")


@dataclasses.dataclass(frozen=True)
class Comparison:
  """The mixers to compare, the LM and the training run each one gets, and
  how the speeds are measured."""

  # The LM around every compared mixer; its mixer is each of mixers in
  # turn, with that mixer's entry of mixer_options (if any) plus chunk_size
  # or window below.
  model: LMConfig
  # Batch, steps and optimizer of every mixer's run (the token budget is
  # steps x batch_size x seq_len).
  train: TrainConfig
  # Mixers to train, names in lin_attn_jax.layers.MIXERS.
  mixers: tuple[str, ...]
  # Chunk size of the chunk forms (the mixers of CHUNKED).
  chunk_size: int = 32
  # Window of sliding_window_attn.
  window: int = 64
  # Held-out evaluation every this many steps (0: only at the start and
  # the end) ...
  eval_every: int = 25
  # ... over this many fixed held-out batches.
  eval_batches: int = 8
  # Rounds of the speed measurements.
  repeats: int = 5
  # Prompt tokens before decoding.
  decode_prompt: int = 16
  # New tokens of the decode timing (at least 2: one is subtracted).
  decode_tokens: int = 33

  def __post_init__(self):
    if not self.mixers:
      raise ValueError("mixers must name at least one mixer")
    unknown = sorted(set(self.mixers) - set(MIXERS))
    if unknown:
      raise ValueError(f"unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
    for name in ("chunk_size", "window", "eval_batches", "repeats",
                 "decode_prompt"):
      checks.positive_int(name, getattr(self, name))
    if not isinstance(self.eval_every, int) or self.eval_every < 0:
      raise ValueError(f"eval_every must be an int >= 0, got "
                       f"{self.eval_every!r}")
    if not isinstance(self.decode_tokens, int) or self.decode_tokens < 2:
      raise ValueError(f"decode_tokens must be an int >= 2, got "
                       f"{self.decode_tokens!r}")

  def model_config(self, mixer: str) -> LMConfig:
    """``model`` with ``mixer`` in every block."""
    options = self.model.options_for(mixer)
    if mixer in CHUNKED:
      options["chunk_size"] = self.chunk_size
    if mixer == "sliding_window_attn":
      options["window_size"] = self.window
    return dataclasses.replace(
        self.model, mixer=mixer,
        mixer_options={mixer: options} if options else {})

  @property
  def tokens_per_step(self) -> int:
    return self.train.batch_size * self.train.seq_len

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Comparison":
    return config_flags.from_dict(cls, values)


DEFAULT = Comparison(
    model=LMConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4),
    train=TrainConfig(batch_size=16, seq_len=128, steps=200,
                      learning_rate=3e-3, warmup_steps=20),
    mixers=("gla", "retnet", "hgrn2", "linear_attn", "mamba2",
            "gated_deltanet", "deltanet", "rwkv6", "sliding_window_attn",
            "softmax_attn"))

PRESETS = {
    # Ten mixers, d_model 128, 200 steps.
    "default": DEFAULT,
    # The run of benchmarks/RESULTS_compare.md: eight mixers, d_model 64,
    # 120 steps (246k tokens), a held-out evaluation every 20 steps.
    "quick": dataclasses.replace(
        DEFAULT, model=dataclasses.replace(DEFAULT.model, d_model=64),
        train=dataclasses.replace(DEFAULT.train, steps=120),
        mixers=("gla", "retnet", "hgrn2", "mamba2", "gated_deltanet",
                "rwkv6", "sliding_window_attn", "softmax_attn"),
        eval_every=20, eval_batches=4),
}

FLAGS = flags.FLAGS
def define_flags() -> None:
  """The command's absl flags, defined when it runs (importing the module
  defines none, so that tests and other scripts can import it)."""
  flags.DEFINE_string("config", "default", "Preset: " + ", ".join(PRESETS)
                      + "; --config.<field>=VALUE overrides a field by dotted "
                      "name, e.g. --config.model.d_model=64, "
                      "--config.train.steps=120, --config.mixers=gla,retnet.")
  flags.DEFINE_string("out", "", "Markdown file for the table (a section).")
  flags.DEFINE_string("plot", "", "PNG of held-out bits per byte vs tokens.")
  flags.DEFINE_string("curves", "", "JSON of every mixer's curves and figures "
                      "(default: --out with .json).")


# The --config.<field>=VALUE arguments of the command line, by field path.
OVERRIDES: dict[str, str | None] = {}


def state_floats(config: LMConfig, seq_len: int) -> int:
  """Floats of one layer's decoding cache, one sequence, context
  ``seq_len``."""
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  cache = jax.eval_shape(lambda: lm.blocks[0].mixer.init_mixer_cache(
      1, seq_len, jnp.float32))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(cache))


def parameter_count(config: LMConfig) -> int:
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  return sum(math.prod(x.shape) for x in
             jax.tree.leaves(nnx.state(lm, nnx.Param)))


def timed(fn) -> float:
  began = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - began


def train_all(config: Comparison, mesh, train_rows, held_rows) -> dict:
  """Trains every mixer of ``config`` in turn: ``{mixer: run}``, each run
  with its trainer, final state, held-out curve and training times."""
  runs = {}
  for name in config.mixers:
    trainer = Trainer(config.model_config(name), config.train, mesh=mesh,
                      rules="dp")
    began = time.perf_counter()
    result = fit(trainer, train_rows, heldout_rows=held_rows,
                 eval_every=config.eval_every,
                 eval_batches=config.eval_batches, eval_at_start=True,
                 log=lambda line: None)
    evals = [(r["step"] * config.tokens_per_step, r["eval_bits_per_token"])
             for r in result.history if "eval_bits_per_token" in r]
    runs[name] = {"trainer": trainer, "state": result.state,
                  "curve": evals, "train_seconds": time.perf_counter() - began,
                  "first_step_seconds": next(
                      r["seconds"] for r in result.history if "loss" in r),
                  "step_times": [], "decode_times": []}
    print(f"{name}: held-out {evals[0][1]:.3f} -> {evals[-1][1]:.3f} bits/"
          f"byte after {config.train.steps} steps "
          f"({runs[name]['train_seconds']:.0f} s)", flush=True)
  return runs


def measure_speeds(config: Comparison, mesh, runs: dict, train_rows) -> None:
  """Appends to every run its train-step and per-token decode times, in
  ``config.repeats`` rounds that time the mixers in turn."""
  source = BatchSource(train_rows, config.train.batch_size)
  prompt = jnp.asarray(np.frombuffer(b"def __init__(self", np.uint8)
                       [:config.decode_prompt][None], jnp.int32)
  for run in runs.values():
    run["batch"] = run["trainer"].place_batch(
        source.batch(config.train.steps))
    with jax.set_mesh(mesh):
      lm = run["trainer"].model(run["state"])
      for n in (1, config.decode_tokens):
        jax.block_until_ready(lm.generate(prompt, n))
  for _ in range(config.repeats):
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
        many = timed(lambda lm=lm: lm.generate(prompt, config.decode_tokens))
        one = timed(lambda lm=lm: lm.generate(prompt, 1))
      run["decode_times"].append((many - one) / (config.decode_tokens - 1))


def result_rows(config: Comparison, runs: dict) -> list[dict]:
  """A row of figures per mixer, best held-out bits per byte first."""
  rows = []
  for name, run in runs.items():
    model = config.model_config(name)
    rows.append({
        "mixer": name,
        "bits_per_byte": run["curve"][-1][1],
        "start_bits_per_byte": run["curve"][0][1],
        "tokens_per_second": config.tokens_per_step / statistics.median(
            run["step_times"]),
        "state_floats_per_layer": state_floats(model, config.train.seq_len),
        "decode_ms_per_token": 1e3 * statistics.median(run["decode_times"]),
        "parameters": parameter_count(model),
        "train_seconds": run["train_seconds"],
        "first_step_seconds": run["first_step_seconds"],
        "step_seconds": run["step_times"],
        "decode_seconds_per_token": run["decode_times"],
        "curve": run["curve"],
    })
  rows.sort(key=lambda r: r["bits_per_byte"])
  return rows


def compare(config: Comparison) -> list[dict]:
  """Trains and times every mixer of ``config``: the rows of the table."""
  mesh = shd.make_mesh("fsdp=1", jax.devices()[:1])
  seq_len = config.train.seq_len
  train_rows = PackedRows(stdlib_corpus("train"), seq_len, seed=0)
  held_rows = PackedRows(stdlib_corpus("heldout"), seq_len, seed=0)
  runs = train_all(config, mesh, train_rows, held_rows)
  measure_speeds(config, mesh, runs, train_rows)
  return result_rows(config, runs)


def write_results(config: Comparison, rows: list[dict], command: str) -> None:
  """Prints the table and writes ``--out``, ``--curves`` and ``--plot``."""
  lines = table_lines(config, rows, command)
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
    draw(config, rows, FLAGS.plot)


def main(argv):
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  config = config_flags.command_config(argv, PRESETS, FLAGS.config,
                                          OVERRIDES)
  rows = compare(config)
  write_results(config, rows,
                "python -m experiments.compare " + " ".join(sys.argv[1:]))


def table_lines(config: Comparison, rows, command: str) -> list[str]:
  """The markdown of the results (the settings are ``config``'s)."""
  model, train = config.model, config.train
  tokens_per_step = config.tokens_per_step
  budget = train.steps * tokens_per_step
  lines = [
      f"Command: `{command.strip()}`",
      "",
      f"{model.n_layers} layers of one mixer, d_model {model.d_model}, "
      f"{model.n_heads} heads, SwiGLU MLPs, byte tokens; {train.steps} steps "
      f"of {train.batch_size} x {train.seq_len} tokens ({budget / 1e3:.0f}k "
      f"tokens) on the standard library's source, AdamW, peak learning rate "
      f"{train.learning_rate}; held-out bits per byte on "
      f"{config.eval_batches * tokens_per_step / 1e3:.0f}k held-out tokens. "
      "One CPU device; tokens/s and decode times are medians of "
      f"{config.repeats} rounds, the mixers timed in turn. State floats: one "
      "layer's decoding cache for one sequence at a context of "
      f"{train.seq_len} tokens.",
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
    lines += ["", f"—: decoding {config.decode_tokens} tokens did not time "
              "longer than decoding one (the difference was within the "
              "timing noise)."]
  return lines


def draw(config: Comparison, rows, path: str) -> None:
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
  budget = config.train.steps * config.tokens_per_step
  ax.set_title(f"{config.model.n_layers} x d_model {config.model.d_model}, "
               f"{budget / 1e3:.0f}k tokens of Python source", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
