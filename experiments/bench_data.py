"""Data throughput: tokenizing a corpus, and the loader against the train
step's consumption; writes ``benchmarks/RESULTS_data.md``.

  python -m experiments.bench_data --config.out=benchmarks/RESULTS_data.md

- **Tokenize**: ``experiments.tokenize`` of the standard library written as
  jsonl shards (``experiments.stdlib_jsonl``) into ArrayRecord shards, with
  bytes and with a byte-level BPE, in 1 and 2 worker processes: MB of jsonl
  read per second of wall time (starting the workers included).
- **Loader**: the batches of the ``tiny`` and ``small`` presets (their
  batch and sequence lengths) from the standard library as bytes and as
  BPE tokens: the time of one ``BatchSource.batch`` (packing the rows and
  ``model_inputs``), and batches per second through what ``fit`` reads
  (the grain iterator with its read-ahead thread, then
  ``global_batch_to_device``).
- **Consumption**: the ``tiny`` preset's train step on this CPU, timed in
  a loop that reads its batches as ``fit`` does (with the time it waits
  for the next batch); the ``small`` preset's step cannot run here, so its
  consumption is the fastest it could be: its model FLOPs per step
  (``lin_attn_jax.train.flops``) at 100% of the dense bfloat16 peak of the
  hosts it is meant for.

The loader is a bottleneck when it delivers fewer batches per second than
the step consumes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import statistics
import tempfile
import time

from absl import app, flags, logging
import jax
from flax import nnx

from experiments import config_flags, configs, stdlib_jsonl, tokenize
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import (BatchSource, PackedRows, array_record_corpus,
                               global_batch_to_device, stdlib_corpus)
from lin_attn_jax.data.pipeline import process_rows
from lin_attn_jax.models.lm import LM
from lin_attn_jax.ops.common import checks
from lin_attn_jax.train import Trainer, flops

# Hosts the small preset is meant for: (name, chips, dense bfloat16 peak
# FLOP/s per chip, the figures of lin_attn_jax.train.flops.PEAK_FLOPS).
SMALL_HOSTS = (("8 x H100 / H200", 8, 989e12), ("TPU v6e-8", 8, 918e12),
               ("TPU v5e-8", 8, 197e12), ("TPU v4-8 (4 chips)", 4, 275e12))


@dataclasses.dataclass(frozen=True)
class BenchDataConfig:
  """What to measure, how long, and where the results go."""

  # Where the jsonl shards, the BPE and the token shards go ("" : a
  # temporary directory, removed at the end).
  work_dir: str = ""
  # The markdown results file ("" prints it only).
  out: str = ""
  # The BPE's vocabulary.
  vocab_size: int = 1024
  # jsonl shards of the standard library (files the tokenize workers
  # share out).
  shards: int = 8
  # Batches timed per loader measurement.
  loader_batches: int = 40
  # Train steps timed (after the compiling one).
  train_steps: int = 20

  def __post_init__(self):
    for name in ("vocab_size", "shards", "loader_batches", "train_steps"):
      checks.positive_int(name, getattr(self, name))

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values) -> "BenchDataConfig":
    return config_flags.from_dict(cls, values)


PRESETS = {"default": BenchDataConfig()}


def time_tokenize(text_dir: str, out_dir: str, tokenizer: str,
                  workers: int) -> dict:
  """One ``experiments.tokenize`` run into a fresh ``out_dir``."""
  shutil.rmtree(out_dir, ignore_errors=True)
  config = tokenize.TokenizeConfig(
      data=f"jsonl:{text_dir}/*.jsonl", out_dir=out_dir, tokenizer=tokenizer,
      workers=workers)
  began = time.perf_counter()
  manifest = tokenize.tokenize(config)
  seconds = time.perf_counter() - began
  shards = manifest["shards"].values()
  read = sum(s["bytes_read"] for s in shards)
  tokens = sum(s["tokens"] for s in shards)
  working = sum(s["seconds"] for s in shards)
  return {"seconds": seconds, "mb_per_s": read / 1e6 / seconds,
          "tokens": tokens, "mb": read / 1e6,
          "worker_mb_per_s": read / 1e6 / working}


def time_loader(corpus, batch: int, seq_len: int, mesh, count: int) -> dict:
  """Milliseconds of one ``BatchSource.batch`` (median) and batches per
  second through the read-ahead iterator and the placement on ``mesh``."""
  positions = process_rows(mesh, batch)
  source = BatchSource(PackedRows(corpus, seq_len, seed=0), batch, positions)
  source.batch(0)
  times = []
  for step in range(count):
    began = time.perf_counter()
    source.batch(step)
    times.append(time.perf_counter() - began)
  batches = source.iterator(0, count)
  began = time.perf_counter()
  for _ in range(count):
    placed = global_batch_to_device(next(batches), positions, mesh, batch)
  jax.block_until_ready(placed)
  seconds = time.perf_counter() - began
  return {"batch_ms": statistics.median(times) * 1e3,
          "batches_per_s": count / seconds}


def time_training(experiment, corpus, steps: int) -> dict:
  """Median step time of ``experiment``'s trainer fed as ``fit`` feeds it,
  and the mean time each step waited for its batch."""
  trainer = Trainer(experiment.model, experiment.train,
                    mesh=shd.make_mesh(experiment.mesh),
                    rules=experiment.rules)
  config = trainer.config
  positions = process_rows(trainer.mesh, config.batch_size)
  source = BatchSource(PackedRows(corpus, config.seq_len, seed=0),
                       config.batch_size, positions)
  batches = source.iterator(0, steps + 1)
  state = trainer.init()
  waits, step_times = [], []
  for step in range(steps + 1):
    began = time.perf_counter()
    batch = global_batch_to_device(next(batches), positions, trainer.mesh,
                                   config.batch_size)
    ready = time.perf_counter()
    state, metrics = trainer.step(state, batch)
    float(metrics["loss"])
    if step:
      waits.append(ready - began)
      step_times.append(time.perf_counter() - ready)
  step = statistics.median(step_times)
  return {"step_ms": step * 1e3, "steps_per_s": 1 / step,
          "wait_ms": statistics.mean(waits) * 1e3}


def small_bound(experiment) -> list[tuple[str, float]]:
  """``(host, steps/s)``: the small preset's steps per second at 100% of
  each host's peak."""
  abstract = nnx.eval_shape(lambda: LM(experiment.model, rngs=nnx.Rngs(0)))
  per_step = (flops.flops_per_token(abstract, experiment.train.seq_len)
              * experiment.train.tokens_per_step)
  return [(name, chips * peak / per_step) for name, chips, peak in
          SMALL_HOSTS]


def with_vocab(experiment, vocab_size: int):
  return dataclasses.replace(experiment, model=dataclasses.replace(
      experiment.model, vocab_size=vocab_size))


def measure(config: BenchDataConfig, work_dir: str, say) -> dict:
  text = os.path.join(work_dir, "text")
  stdlib_jsonl.prepare(stdlib_jsonl.StdlibJsonlConfig(
      out_dir=text, shards=config.shards, vocab_size=config.vocab_size),
      say=say)
  jsonl = os.path.join(text, stdlib_jsonl.JSONL_DIR)
  bpe = os.path.join(text, stdlib_jsonl.TOKENIZER_DIR)
  results = {"tokenize": [], "loader": [], "training": [], "small": [],
             "load": [os.getloadavg()[0]]}
  for name, tokenizer in (("bytes", "bytes"), ("BPE", bpe)):
    for workers in (1, 2):
      out = os.path.join(work_dir, f"tokens-{name}-{workers}")
      row = {"tokenizer": name, "workers": workers,
             **time_tokenize(jsonl, out, tokenizer, workers)}
      say(f"tokenize {name}, {workers} workers: {row['mb_per_s']:.2f} MB/s")
      results["tokenize"].append(row)
  corpora = {
      "bytes": stdlib_corpus("train"),
      "BPE": array_record_corpus(
          os.path.join(work_dir, "tokens-BPE-2", "*.array_record"),
          dtype="uint16", vocab_size=config.vocab_size)}
  mesh = shd.make_mesh("fsdp=-1")
  for preset in ("tiny", "small"):
    train = configs.get(preset).train
    for name, corpus in corpora.items():
      row = {"preset": preset, "batch": train.batch_size,
             "seq_len": train.seq_len, "data": name,
             **time_loader(corpus, train.batch_size, train.seq_len, mesh,
                           config.loader_batches)}
      say(f"loader {preset} {name}: {row['batches_per_s']:.0f} batches/s")
      results["loader"].append(row)
  tiny = configs.get("tiny")
  for name, vocab in (("bytes", 256), ("BPE", config.vocab_size)):
    row = {"data": name, "vocab_size": vocab,
           **time_training(with_vocab(tiny, vocab), corpora[name],
                           config.train_steps)}
    say(f"tiny train step {name}: {row['steps_per_s']:.2f} steps/s")
    results["training"].append(row)
  small = configs.get("small")
  for name, vocab in (("bytes", 256), ("BPE", config.vocab_size)):
    results["small"].append({"data": name, "vocab_size": vocab,
                             "hosts": small_bound(with_vocab(small, vocab))})
  results["load"].append(os.getloadavg()[0])
  return results


def markdown(results: dict, command: str) -> str:
  cpu = platform.processor() or platform.machine()
  start, end = results["load"]
  lines = [
      "# Results: data throughput", "",
      f"Command: `{command}`", "",
      f"Measured on {os.cpu_count()} CPU cores ({cpu}), shared with other "
      f"work (load average {start:.1f} at the start, {end:.1f} at the end): "
      "read the ratios, not "
      "the absolute figures. The corpus is the Python standard library "
      "(about 31 MB of source); the BPE is a byte-level BPE trained on its "
      "training split (`experiments.stdlib_jsonl`).", "",
      "## Tokenize (`experiments.tokenize`, jsonl to ArrayRecord)", "",
      "`MB/s`: jsonl read per second of wall time, starting the worker "
      "processes (about 2 s of imports each) included. `per worker`: per "
      "second a worker spends on its shards (reading, tokenizing, "
      "writing). One worker lets the `tokenizers` library use its threads; "
      "several tokenize in one thread each.", "",
      "| tokenizer | workers | MB of jsonl | tokens | wall s | MB/s | "
      "per worker MB/s |",
      "|---|---|---|---|---|---|---|"]
  for r in results["tokenize"]:
    lines.append(f"| {r['tokenizer']} | {r['workers']} | {r['mb']:.1f} | "
                 f"{r['tokens'] / 1e6:.1f}M | {r['seconds']:.1f} | "
                 f"{r['mb_per_s']:.2f} | {r['worker_mb_per_s']:.2f} |")
  lines += [
      "", "## The loader against the train step", "",
      "`batch()`: one `BatchSource.batch` (packing and `model_inputs`), "
      "median. `loader`: batches per second through the read-ahead iterator "
      "and `global_batch_to_device`, as `fit` reads them. `step`: the train "
      "step's consumption: measured on this CPU for `tiny`; for `small` "
      "(which cannot run here) the fastest host it is meant for at 100% of "
      "its bfloat16 peak, an upper bound.", "",
      "| preset | batch x length | data | batch() ms | loader batches/s | "
      "step steps/s | loader / step |",
      "|---|---|---|---|---|---|---|"]
  consumption = {("tiny", r["data"]): (r["steps_per_s"], "this CPU")
                 for r in results["training"]}
  for r in results["small"]:
    host, rate = max(r["hosts"], key=lambda h: h[1])
    consumption[("small", r["data"])] = (rate, f"{host}, 100% peak")
  verdicts = []
  for r in results["loader"]:
    rate, where = consumption[(r["preset"], r["data"])]
    ratio = r["batches_per_s"] / rate
    verdicts.append(ratio)
    lines.append(f"| {r['preset']} | {r['batch']} x {r['seq_len']} | "
                 f"{r['data']} | {r['batch_ms']:.2f} | "
                 f"{r['batches_per_s']:.0f} | {rate:.1f} ({where}) | "
                 f"{ratio:.1f} |")
  lines += ["", "The tiny preset's steps on this CPU, fed as `fit` feeds "
            "them:", "",
            "| data | vocabulary | step ms | steps/s | wait for the batch "
            "ms |", "|---|---|---|---|---|"]
  for r in results["training"]:
    lines.append(f"| {r['data']} | {r['vocab_size']} | {r['step_ms']:.0f} | "
                 f"{r['steps_per_s']:.2f} | {r['wait_ms']:.2f} |")
  lines += ["", "The small preset's steps per second at 100% of each "
            "host's peak (model FLOPs per step from `train/flops.py`):", "",
            "| data | vocabulary | " + " | ".join(
                h[0] for h in SMALL_HOSTS) + " |",
            "|---|---|" + "---|" * len(SMALL_HOSTS)]
  for r in results["small"]:
    lines.append(f"| {r['data']} | {r['vocab_size']} | " + " | ".join(
        f"{rate:.1f}" for _, rate in r["hosts"]) + " |")
  worst = min(verdicts)
  lines += ["", (f"The loader delivers at least {worst:.1f} times the "
                 "batches the step consumes in every row: it is not the "
                 "bottleneck." if worst >= 1 else
                 f"The loader falls short of the step in a row (ratio "
                 f"{worst:.2f}): it is the bottleneck there."), ""]
  return "\n".join(lines)


FLAGS = flags.FLAGS
OVERRIDES: dict = {}


def main(argv):
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  config = config_flags.command_config(argv, PRESETS, "default", OVERRIDES)
  work_dir = config.work_dir or tempfile.mkdtemp(prefix="bench_data-")
  try:
    results = measure(config, work_dir, print)
  finally:
    if not config.work_dir:
      shutil.rmtree(work_dir, ignore_errors=True)
  command = ("GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
             "python -m experiments.bench_data") + "".join(
      f" --config.{k}={v}" for k, v in sorted(OVERRIDES.items())
      if k not in ("work_dir",))
  text = markdown(results, command)
  print(text)
  if config.out:
    with open(config.out, "w") as f:
      f.write(text)


if __name__ == "__main__":
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
