"""Training benchmarks: sharded state memory, tokens/s and compile time.

- ``memory``: per-device bytes of parameters + optimizer state with FSDP
  over 1, 2, 4 and 8 devices, from the compiled memory analysis of the
  sharded initialisation (its outputs are the state), against total / N;
  and the train step's per-device argument and temporary bytes.
- ``speed``: for every causal mixer, a ``--n_layers`` x ``--d_model`` LM's
  train step on one device: compile time of the step, and tokens/s (median
  over ``--repeats`` steps; mixers are timed in rounds, one step each in
  turn, so that their ratios are measured side by side).

  python -m experiments.bench_training --out=benchmarks/RESULTS_training.md
  python -m experiments.bench_training --sections=speed --mixers=gla,mamba2
"""

from __future__ import annotations

import statistics
import sys
import time

from absl import app, flags
import jax
import numpy as np

from experiments.bench_utils import cpu_devices, write_section
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import BatchSource, PackedRows, stdlib_corpus
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig, Trainer
from lin_attn_jax.train.trainer import BATCH_KEYS

FLAGS = flags.FLAGS
flags.DEFINE_list("sections", ["memory", "speed"], "What to measure.")
flags.DEFINE_list("mixers", [], "Mixers to time (default: every causal one).")
flags.DEFINE_string("memory_mixer", "gla,gla,gla,softmax_attn",
                    "Layer mixers of the model of the memory section.")
flags.DEFINE_list("devices", ["1", "2", "4", "8"], "FSDP sizes (memory).")
flags.DEFINE_integer("d_model", 256, "Model width.")
flags.DEFINE_integer("n_layers", 4, "Blocks.")
flags.DEFINE_integer("n_heads", 4, "Heads.")
flags.DEFINE_integer("batch", 8, "Rows per step.")
flags.DEFINE_integer("seq_len", 256, "Tokens per row.")
flags.DEFINE_integer("repeats", 5, "Timed steps per mixer.")
flags.DEFINE_string("out", "", "Markdown file to write the tables into.")

_MiB = 2.0 ** 20


def model_config(mixer) -> LMConfig:
  return LMConfig(vocab_size=256, d_model=FLAGS.d_model,
                  n_layers=FLAGS.n_layers, n_heads=FLAGS.n_heads, mixer=mixer)


def train_config() -> TrainConfig:
  return TrainConfig(batch_size=FLAGS.batch, seq_len=FLAGS.seq_len,
                     steps=1000, warmup_steps=10)


def abstract_batch(trainer: Trainer) -> dict:
  shape = (trainer.config.batch_size, trainer.config.seq_len)
  dtypes = {"inputs": np.int32, "targets": np.int32, "weights": np.float32,
            "segment_ids": np.int32}
  return {k: jax.ShapeDtypeStruct(shape, dtypes[k],
                                  sharding=trainer.batch_shardings[k])
          for k in BATCH_KEYS}


def memory_section() -> list[str]:
  mixer = tuple(FLAGS.memory_mixer.split(","))
  layers = FLAGS.n_layers
  if layers % len(mixer):
    raise ValueError(f"--memory_mixer has {len(mixer)} names, which does not "
                     f"divide --n_layers {layers}")
  lines = [
      "### Per-device bytes of the train state with FSDP",
      "",
      f"Model: {layers} layers of `{','.join(mixer)}`, d_model "
      f"{FLAGS.d_model}, {FLAGS.n_heads} heads, byte vocabulary; AdamW "
      f"(two moments per parameter); batch {FLAGS.batch} x "
      f"{FLAGS.seq_len}. `state` is the per-device output of the compiled "
      "sharded initialisation (parameters + optimizer state); `step args` "
      "and `step temp` are the compiled train step's per-device arguments "
      "(state + batch) and temporaries.",
      "",
      "| devices | state MiB | total / N MiB | state / (total / N) | step args "
      "MiB | step temp MiB |",
      "|---|---|---|---|---|---|",
  ]
  total = None
  for count in [int(d) for d in FLAGS.devices]:
    mesh = shd.make_mesh(f"fsdp={count}", jax.devices()[:count])
    trainer = Trainer(model_config(mixer), train_config(), mesh=mesh,
                      rules="fsdp")
    init = jax.jit(trainer._init_fn,  # pylint: disable=protected-access
                   out_shardings=trainer.state_shardings)
    with jax.set_mesh(mesh), shd.use_rules(trainer.rules):
      state_bytes = init.lower().compile().memory_analysis(
      ).output_size_in_bytes
      step = trainer._step.lower(  # pylint: disable=protected-access
          trainer.abstract_state, abstract_batch(trainer)).compile()
    analysis = step.memory_analysis()
    if total is None:
      total = sum(leaf.size * leaf.dtype.itemsize
                  for leaf in jax.tree.leaves(trainer.abstract_state))
    ideal = total / count
    lines.append(
        f"| {count} | {state_bytes / _MiB:.3f} | {ideal / _MiB:.3f} | "
        f"{state_bytes / ideal:.3f} | "
        f"{analysis.argument_size_in_bytes / _MiB:.3f} | "
        f"{analysis.temp_size_in_bytes / _MiB:.3f} |")
    print(lines[-1], flush=True)
  return lines


def speed_section() -> list[str]:
  names = FLAGS.mixers or [n for n, cls in MIXERS.items() if cls.causal]
  rows = PackedRows(stdlib_corpus("train"), FLAGS.seq_len, seed=0)
  source = BatchSource(rows, FLAGS.batch)
  mesh = shd.make_mesh("fsdp=1", jax.devices()[:1])
  runs = {}
  for name in names:
    trainer = Trainer(model_config(name), train_config(), mesh=mesh,
                      rules="dp")
    state = trainer.init()
    batch = trainer.place_batch(source.batch(0))
    began = time.perf_counter()
    with jax.set_mesh(mesh):
      compiled = trainer._step.lower(  # pylint: disable=protected-access
          trainer.abstract_state, abstract_batch(trainer)).compile()
    compile_s = time.perf_counter() - began
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    runs[name] = {"step": compiled, "state": state, "batch": batch,
                  "compile": compile_s, "times": []}
    print(f"{name}: compiled in {compile_s:.1f} s", flush=True)
  for _ in range(FLAGS.repeats):
    for name, run in runs.items():
      began = time.perf_counter()
      run["state"], metrics = run["step"](run["state"], run["batch"])
      jax.block_until_ready(metrics)
      run["times"].append(time.perf_counter() - began)
  tokens = FLAGS.batch * FLAGS.seq_len
  lines = [
      "### Train step on one CPU device, every causal mixer",
      "",
      f"{FLAGS.n_layers} layers, d_model {FLAGS.d_model}, {FLAGS.n_heads} "
      f"heads, byte vocabulary, batch {FLAGS.batch} x {FLAGS.seq_len}, "
      "float32, AdamW. Step time is the median of "
      f"{FLAGS.repeats} steps, the mixers timed in rounds.",
      "",
      "| mixer | compile s | step ms | tokens/s |",
      "|---|---|---|---|",
  ]
  for name, run in runs.items():
    median = statistics.median(run["times"])
    lines.append(f"| {name} | {run['compile']:.1f} | {median * 1e3:.0f} | "
                 f"{tokens / median:,.0f} |")
  return lines


def main(argv):
  del argv
  cpu_devices(8)
  command = "python -m experiments.bench_training " + " ".join(
      a for a in sys.argv[1:])
  sections = {"memory": memory_section, "speed": speed_section}
  for name in FLAGS.sections:
    lines = [f"Command: `{command.strip()}`", "", *sections[name]()]
    print("\n".join(lines))
    if FLAGS.out:
      write_section(FLAGS.out, f"training-{name}", lines)


if __name__ == "__main__":
  app.run(main)
