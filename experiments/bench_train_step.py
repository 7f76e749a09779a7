"""Training-step time and compile time of the LM, for every causal mixer.

One training step is the forward, the backward and an optax AdamW update of
a small decoder LM (next-token cross-entropy over a byte vocabulary),
jitted with the parameters and optimizer state donated. For each shape,
every mixer's step is compiled first (the compile time is that of
``jit(step).lower(...).compile()``), then the mixers are timed in rounds,
one step each per round, so that all of them see the same load; a mixer's
time is its minimum over the rounds, beside the minimum of the process's
CPU time per step (all threads: a step that keeps one of two cores idle,
such as a sequential scan's, shows it here).

  python -m experiments.bench_train_step --out=benchmarks/RESULTS_train_step.md
  python -m experiments.bench_train_step --mixers=gla,h3 --shapes=2x4096

XLA:CPU maps each execution's scratch memory afresh and the kernel faults it
in on first touch, a cost proportional to the step's temp memory; run with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (as ``make`` does) for
transparent huge pages. A run with tunables set writes its own section.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import resource
import statistics
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.bench_utils import write_section
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.train.loss import cross_entropy_sums

FLAGS = flags.FLAGS
flags.DEFINE_list("mixers", [], "Mixers to time (default: every causal one).")
flags.DEFINE_list("shapes", ["16x256", "2x4096"], "Batch x length pairs.")
flags.DEFINE_integer("d_model", 64, "Model width.")
flags.DEFINE_integer("n_layers", 2, "Blocks.")
flags.DEFINE_integer("n_heads", 2, "Heads per mixer.")
flags.DEFINE_integer("vocab_size", 256, "Vocabulary (bytes).")
flags.DEFINE_integer("rounds", 5, "Timed steps per mixer (interleaved).")
flags.DEFINE_float("learning_rate", 1e-3, "AdamW learning rate.")
flags.DEFINE_string("out", "", "Markdown file to write the table into.")
flags.DEFINE_enum("xla_options", "default", ["default", "ynn"], "XLA options.")
# "ynn" hands reductions to YNNPACK again (lin_attn_jax turns that off on the
# jaxlib versions where it crashes; see lin_attn_jax/xla_workarounds.py).
COMPILER_OPTIONS = {
    "default": None,
    "ynn": {"xla_cpu_experimental_ynn_fusion_type":
            "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE,"
            "LIBRARY_FUSION_TYPE_REDUCE"},
}

# Mixers with a growing KV cache; every other one keeps a fixed-size state.
SOFTMAX_FAMILY = ("softmax_attn", "sliding_window_attn", "sparse_attn",
                  "linformer")


def cross_entropy(logits, targets):
  """Mean next-token cross-entropy; ``logits: [B, T, V]``, ``targets: [B, T]``."""
  loss_sum, count, _ = cross_entropy_sums(logits, targets,
                                          jnp.ones(targets.shape))
  return loss_sum / count


def make_train_step(graphdef, optimizer, compiler_options=None):
  """``step(params, opt_state, tokens [B, T + 1]) -> (params, opt_state,
  loss)``, jitted, with the parameters and optimizer state donated."""

  def loss_fn(params, tokens):
    model = nnx.merge(graphdef, params)
    return cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])

  @functools.partial(jax.jit, donate_argnums=(0, 1),
                     compiler_options=compiler_options)
  def train_step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step


class Runner:
  """One mixer's compiled step and its live state at one shape."""

  def __init__(self, name: str, batch: int, length: int):
    config = LMConfig(vocab_size=FLAGS.vocab_size, d_model=FLAGS.d_model,
                      n_layers=FLAGS.n_layers, n_heads=FLAGS.n_heads,
                      mixer=name)
    graphdef, self.params = nnx.split(LM(config, rngs=nnx.Rngs(0)))
    optimizer = optax.adamw(FLAGS.learning_rate)
    self.opt_state = optimizer.init(self.params)
    rng = np.random.default_rng(0)
    self.tokens = jnp.asarray(rng.integers(0, FLAGS.vocab_size,
                                           (batch, length + 1)), jnp.int32)
    step = make_train_step(graphdef, optimizer, COMPILER_OPTIONS[FLAGS.xla_options])
    start, start_cpu = time.perf_counter(), time.process_time()
    self.step = step.lower(self.params, self.opt_state, self.tokens).compile()
    self.compile_s = time.perf_counter() - start
    self.compile_cpu_s = time.process_time() - start_cpu
    self.times: list[float] = []
    self.cpu_times: list[float] = []
    self.faults: list[int] = []
    self.loss = float("nan")

  def run(self) -> None:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start, start_cpu = time.perf_counter(), time.process_time()
    self.params, self.opt_state, loss = self.step(self.params, self.opt_state,
                                                  self.tokens)
    jax.block_until_ready(loss)
    self.times.append(time.perf_counter() - start)
    self.cpu_times.append(time.process_time() - start_cpu)
    self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                       - faults)
    self.loss = float(loss)


def _time_shape(names, batch, length):
  runners = {}
  for name in names:
    runners[name] = Runner(name, batch, length)
    print(f"  B={batch} T={length} {name}: compiled in "
          f"{runners[name].compile_s:.1f} s ({runners[name].compile_cpu_s:.1f}"
          " s CPU)", flush=True)
  for name in names:
    runners[name].run()                  # the first run is not timed
    runners[name].times.clear()
    runners[name].cpu_times.clear()
    runners[name].faults.clear()
  for _ in range(FLAGS.rounds):
    for name in names:
      runners[name].run()
  return runners


def main(argv):
  del argv
  names = FLAGS.mixers or [n for n, cls in MIXERS.items() if cls.causal]
  shapes = [tuple(int(x) for x in s.split("x")) for s in FLAGS.shapes]
  results = {}
  for batch, length in shapes:
    results[batch, length] = _time_shape(names, batch, length)
  recurrent = [n for n in names if n not in SOFTMAX_FAMILY]
  header = "| mixer |" + "".join(
      f" B={b}, T={t}: step (ms) | / softmax_attn | CPU (ms) |"
      " compile (s) | page faults / step |" for b, t in shapes)
  lines = [header, "|---|" + "---|---|---|---|---|" * len(shapes)]
  for name in names:
    row = f"| {name} |"
    for shape in shapes:
      r = results[shape]
      best = min(r[name].times)
      base = (f"{best / min(r['softmax_attn'].times):.2f}"
              if "softmax_attn" in r else "")
      row += (f" {best * 1e3:.0f} | {base} | "
              f"{min(r[name].cpu_times) * 1e3:.0f} | {r[name].compile_s:.1f} "
              f"({r[name].compile_cpu_s:.1f}) | "
              f"{statistics.median(r[name].faults):.0f} |")
    lines.append(row)
  for shape in shapes:
    r = results[shape]
    rec = {n: min(r[n].times) for n in recurrent}
    cpu = {n: min(r[n].cpu_times) for n in recurrent}
    if rec:
      fastest = min(rec, key=rec.get)
      slowest = max(rec, key=rec.get)
      slowest_cpu = max(cpu, key=cpu.get)
      lines.append(
          f"\nB={shape[0]}, T={shape[1]}: slowest recurrent mixer {slowest} "
          f"is {rec[slowest] / rec[fastest]:.2f}x the fastest, {fastest}; "
          f"in CPU time, {slowest_cpu} is "
          f"{cpu[slowest_cpu] / cpu[fastest]:.2f}x {fastest}.")
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  cmd = (f"GLIBC_TUNABLES={tunables} " if tunables else "") + (
      "python " + " ".join(sys.argv))
  text = [f"Command: `{cmd}`", "",
          f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
          f"jax {jax.__version__}, backend {jax.default_backend()}; "
          f"LM d_model={FLAGS.d_model}, {FLAGS.n_layers} layers, "
          f"{FLAGS.n_heads} heads, vocab {FLAGS.vocab_size}, AdamW; "
          f"minimum of {FLAGS.rounds} steps after compilation, mixers "
          f"interleaved. CPU: the process's CPU seconds (every thread, user "
          f"and system) during a step, minimum over the timed steps; the "
          f"step's wall time times the cores it kept busy. Compile: wall "
          f"seconds of lowering and compiling the step (CPU seconds of the "
          f"process in brackets). Page faults: "
          f"the process's minor faults during a step, median over the "
          f"timed steps. glibc malloc "
          f"tunables: {tunables or 'none'} (see the notes below the "
          f"tables).", "", *lines]
  print("\n".join(text))
  if FLAGS.out:
    key = "train_step_" + "_".join(FLAGS.shapes)
    if tunables:
      key += "_" + re.sub(r"\W+", "_", tunables).strip("_")
    write_section(FLAGS.out, key, text)


if __name__ == "__main__":
  app.run(main)
