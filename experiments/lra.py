r"""Long Range Arena: a mixer's test accuracy on ListOps and Pathfinder-32.

Trains a ``Classifier`` (``lin_attn_jax.models.encoder``: the mixers
non-causal, pooling, a linear head) of each mixer variant on each task of
a preset, on data generated here (``lin_attn_jax.data.lra``: ListOps from
the published grammar, Pathfinder from the published generator's
description, deterministic by seed), and reports the accuracy on the test
split beside the accuracies Tay et al. 2020 (https://arxiv.org/abs/2011.04006,
Table 1) published for the same models.

Variants (``VARIANTS``): a name of the grid, the layer it builds and the
options it fixes. ``linear_attn`` is Katharopoulos et al.'s (elu + 1, LRA's
"Linear Trans."), ``focused_linear_attn`` the same layer with FLatten
Transformer's focused map; Linformer projects the whole row (its
``max_len`` is the row's length).

Presets (``PRESETS``):

- ``lra``: the LRA protocol, from the paper's section 3 and the configs of
  its code (``lra_benchmarks/listops/configs/base_listops_config.py``,
  ``lra_benchmarks/image/configs/pathfinder32/transformer_base.py``).
  ListOps: expressions of up to 2,000 tokens, 6 layers, width 512, 8
  heads, MLP 2,048, class-token pooling, learned positions, batch 32, 5,000
  steps, 1,000 warmup steps, weight decay 0.1, 96,000 training and 2,000
  test examples. LRA's learning rate is ``0.05 * warmup * rsqrt_decay``
  (peak ``0.05 / sqrt(1000) = 1.6e-3``); here it is a 1.6e-3 peak with
  cosine decay. Pathfinder-32 (hard): 1,024 pixels, 1 layer, width 128, 4
  heads (LRA's query-key width is half the width; here it is the width),
  MLP 128, mean pooling, no learned positions, batch 512, 62,400 steps
  (200 epochs of 160,000 images), learning rate 1e-3 with cosine decay and
  312 warmup steps, no weight decay. No dropout (LRA: 0.1 / 0.2). For an
  accelerator.
- ``cpu``: a small grid that finishes within an hour on 2 cores
  (``--workers=2``): ListOps of up to 512 tokens (at least 128), 2 layers,
  width 32, 2 heads, MLP 64, mean pooling, batch 32, 400 steps;
  Pathfinder-32 hard (1,024 pixels) with the same model, batch 32, 400
  steps; learning rate 2e-3 with cosine decay; 12,800 ListOps and 6,400
  Pathfinder training examples (one and two epochs), 1,000 test examples
  each. The examples are generated once per grid (``--data_dir``, about
  ten minutes of one core, most of it Pathfinder's) and shared by the
  runs.

Outputs in ``--out_dir``: ``lra_<preset>.jsonl`` (a line per run, written
as runs finish; a rerun skips the runs already there), ``lra_<preset>.md``
(the table, with the command and the budgets) and ``lra_<preset>.png``
(ours against the paper's, a panel per task; matplotlib).

  python -m experiments.lra --config=cpu --out_dir=benchmarks --workers=2
  python -m experiments.lra --config=lra --config.mixers=softmax_attn,gla
  python -m experiments.lra --config=cpu --config.tasks=listops \\
      --config.mixers=gla --config.listops.steps=100
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from experiments import config_flags, run_output
from experiments.grids import (append_results, children_cpu_seconds,
                               cost_line, cpu_seconds, read_results,
                               run_jobs)
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import lra
from lin_attn_jax.data.tasks import ExampleRows
from lin_attn_jax.models.encoder import ClassifierConfig
from lin_attn_jax.train import TrainConfig, Trainer

TASKS = ("listops", "pathfinder32")
TASK_TITLES = {"listops": "ListOps", "pathfinder32": "Pathfinder-32"}
# Grid name -> (layer, options the variant fixes).
VARIANTS = {
    "softmax_attn": ("softmax_attn", {}),
    "linear_attn": ("linear_attn", {"feature_map": "elu_plus_one"}),
    "focused_linear_attn": ("linear_attn", {"feature_map": "focused"}),
    "performer": ("performer", {}),
    "linformer": ("linformer", {}),
    "retnet": ("retnet", {}),
    "gla": ("gla", {}),
    "mamba2": ("mamba2", {}),
}
# Tay et al. 2020, Table 1: (the paper's name, ListOps, Pathfinder) test
# accuracy in %. Papers with Code's copy of the table agrees for Linformer
# (35.70 / 76.34); the others are as quoted.
PUBLISHED = {
    "softmax_attn": ("Transformer", 36.37, 71.40),
    "linear_attn": ("Linear Trans.", 16.13, 75.30),
    "performer": ("Performer", 18.01, 77.05),
    "linformer": ("Linformer", 35.70, 76.34),
}


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """The model and the training of one task."""

  # Tokens per row: ListOps expressions have at most min(2000, seq_len + 1)
  # tokens (LRA's max_length) and at least a quarter of that; Pathfinder-32
  # images are 1024 pixels.
  seq_len: int
  n_layers: int
  d_model: int
  n_heads: int
  mlp_dim: int
  # "mean" or "cls" (ClassifierConfig.pooling).
  pooling: str
  # "learned" or "none" (EncoderConfig.positions).
  positions: str
  batch_size: int
  steps: int
  learning_rate: float
  warmup_steps: int
  weight_decay: float
  num_train: int
  num_test: int

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "TaskSettings":
    return config_flags.from_dict(cls, values)


@dataclasses.dataclass(frozen=True)
class Preset:
  """A grid: variants x tasks x seeds."""

  mixers: tuple[str, ...]
  listops: TaskSettings
  pathfinder32: TaskSettings
  tasks: tuple[str, ...] = TASKS
  seeds: tuple[int, ...] = (0,)
  # Pathfinder level: "easy", "intermediate" or "hard" (LRA's).
  level: str = "hard"
  # Shared by the tasks: the learning rate's floor (a fraction of the
  # peak) and the gradient clipping norm.
  min_lr_ratio: float = 0.0
  clip_norm: float = 1.0

  def __post_init__(self):
    unknown = sorted(set(self.mixers) - set(VARIANTS))
    if unknown:
      raise ValueError(f"unknown mixers {unknown}; variants: "
                       f"{', '.join(VARIANTS)}")
    bad = sorted(set(self.tasks) - set(TASKS))
    if bad:
      raise ValueError(f"unknown tasks {bad}; tasks: {', '.join(TASKS)}")
    if self.pathfinder32.seq_len != 32 * 32:
      raise ValueError("pathfinder32.seq_len must be 1024 (32 x 32 "
                       f"pixels), got {self.pathfinder32.seq_len}")
    if self.level not in lra.PATHFINDER_LEVELS:
      raise ValueError(f"level must be one of {tuple(lra.PATHFINDER_LEVELS)}"
                       f", got {self.level!r}")

  def settings(self, task: str) -> TaskSettings:
    return getattr(self, task)

  def to_dict(self) -> dict:
    return config_flags.to_dict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Preset":
    return config_flags.from_dict(cls, values)


CPU_TASK = TaskSettings(
    seq_len=512, n_layers=2, d_model=32, n_heads=2, mlp_dim=64,
    pooling="mean", positions="learned", batch_size=32, steps=400,
    learning_rate=2e-3, warmup_steps=40, weight_decay=0.01,
    num_train=12_800, num_test=1000)

PRESETS = {
    "lra": Preset(
        mixers=tuple(VARIANTS),
        listops=TaskSettings(
            seq_len=1999, n_layers=6, d_model=512, n_heads=8, mlp_dim=2048,
            pooling="cls", positions="learned", batch_size=32, steps=5000,
            learning_rate=0.05 / math.sqrt(1000), warmup_steps=1000,
            weight_decay=0.1, num_train=96_000, num_test=2000),
        pathfinder32=TaskSettings(
            seq_len=1024, n_layers=1, d_model=128, n_heads=4, mlp_dim=128,
            pooling="mean", positions="none", batch_size=512, steps=62_400,
            learning_rate=1e-3, warmup_steps=312, weight_decay=0.0,
            num_train=160_000, num_test=2000)),
    # Sized for 2 cores in an hour with --workers=2: 16 runs of 400 steps.
    "cpu": Preset(
        mixers=tuple(VARIANTS), listops=CPU_TASK,
        pathfinder32=dataclasses.replace(CPU_TASK, seq_len=1024,
                                         num_train=6400)),
}

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's absl flags, defined when it runs (importing the module
  defines none)."""
  flags.DEFINE_string("config", "cpu", "The grid to run, a preset: "
                      + ", ".join(PRESETS) + "; --config.<field>=VALUE "
                      "overrides a field by dotted name, e.g. "
                      "--config.mixers=gla,retnet, "
                      "--config.listops.steps=100.")
  flags.DEFINE_string("out_dir", "benchmarks", "where the results go")
  flags.DEFINE_string("name", None, "file name stem (default lra_<config>)")
  flags.DEFINE_integer("workers", 1, "processes training runs side by side "
                       "(on a CPU, one per core)")
  flags.DEFINE_string("data_dir", os.path.join(
      tempfile.gettempdir(), "lin_attn_jax_lra"), "where the generated "
      "examples are kept for the runs (and later calls) to share")
  flags.DEFINE_bool("report_only", False, "write the table and plot from the "
                    "results file, train nothing")


# The --config.<field>=VALUE arguments of the command line, by field path.
OVERRIDES: dict[str, str | None] = {}


def datasets(preset: Preset, task: str, seed: int):
  """``(train, test)`` example sets of ``task``."""
  s = preset.settings(task)
  if task == "listops":
    longest = min(2000, s.seq_len + 1)
    grammar = dict(seq_len=s.seq_len, max_length=longest,
                   min_length=longest // 4)
    return (lra.ListOps(s.num_train, split="train", seed=seed, **grammar),
            lra.ListOps(s.num_test, split="test", seed=seed, **grammar))
  return tuple(lra.Pathfinder(n, split=split, seed=seed, resolution=32,
                              level=preset.level)
               for n, split in ((s.num_train, "train"),
                                (s.num_test, "test")))


class Materialized:
  """An example set held as arrays (``inputs``, ``segment_ids``,
  ``positions``, ``labels``), read as ``lra.ListOps`` is."""

  def __init__(self, arrays: Mapping[str, np.ndarray], num_classes: int,
               vocab_size: int, name: str):
    self.arrays = dict(arrays)
    self.num_classes, self.vocab_size = num_classes, vocab_size
    self.seq_len = self.arrays["inputs"].shape[1]
    self.key = (name,)

  def __len__(self) -> int:
    return len(self.arrays["labels"])

  def batch(self, indices) -> dict:
    at = np.asarray([int(i) for i in indices], np.int64)
    return {k: v[at].astype(np.int32) for k, v in self.arrays.items()}


def cache_path(preset: Preset, task: str, seed: int, split: str,
               data_dir: str) -> str:
  s = preset.settings(task)
  count = s.num_train if split == "train" else s.num_test
  level = f"_{preset.level}" if task == "pathfinder32" else ""
  return os.path.join(data_dir, f"{task}{level}_T{s.seq_len}_seed{seed}_"
                      f"{split}{count}.npz")


def materialize(dataset, path: str, chunk: int = 1024) -> Materialized:
  """``dataset`` generated once into ``path`` (uint8 arrays; read back on
  later calls): the runs of a grid share their examples instead of
  drawing them again (Pathfinder-32 costs tens of ms an image)."""
  if not os.path.exists(path):
    parts = [dataset.batch(range(i, min(i + chunk, len(dataset))))
             for i in range(0, len(dataset), chunk)]
    arrays = {k: np.concatenate([p[k] for p in parts]).astype(np.uint8)
              for k in parts[0]}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    np.savez(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)
  with np.load(path) as stored:
    arrays = {k: stored[k] for k in stored.files}
  return Materialized(arrays, dataset.num_classes, dataset.vocab_size,
                      os.path.basename(path))


def cached_datasets(preset: Preset, task: str, seed: int, data_dir: str):
  """``datasets`` generated once into ``data_dir`` (``materialize``)."""
  return tuple(materialize(d, cache_path(preset, task, seed, split,
                                         data_dir))
               for d, split in zip(datasets(preset, task, seed),
                                   ("train", "test")))


def model_config(preset: Preset, task: str, variant: str) -> ClassifierConfig:
  s = preset.settings(task)
  layer, options = VARIANTS[variant]
  if layer == "linformer":
    options = {**options, "max_len": s.seq_len + (s.pooling == "cls")}
  vocab = (lra.LISTOPS_VOCAB_SIZE if task == "listops"
           else lra.Pathfinder.vocab_size)
  classes = (lra.ListOps.num_classes if task == "listops"
             else lra.Pathfinder.num_classes)
  return ClassifierConfig(
      vocab_size=vocab, d_model=s.d_model, n_layers=s.n_layers,
      n_heads=s.n_heads, mixer=layer,
      mixer_options={layer: options} if options else (),
      mlp_dim=s.mlp_dim, num_classes=classes, pooling=s.pooling,
      positions=s.positions, max_len=s.seq_len)


def train_config(preset: Preset, task: str, seed: int) -> TrainConfig:
  s = preset.settings(task)
  return TrainConfig(seed=seed, batch_size=s.batch_size, seq_len=s.seq_len,
                     steps=s.steps, learning_rate=s.learning_rate,
                     warmup_steps=s.warmup_steps,
                     min_lr_ratio=preset.min_lr_ratio,
                     weight_decay=s.weight_decay, clip_norm=preset.clip_norm)


def measure_accuracy(trainer: Trainer, state, test, batch_size: int) -> float:
  """Accuracy over the whole batches of ``test`` (the last partial batch
  is left out: ``num_test`` is best a multiple of the batch)."""
  correct = count = 0.0
  rows = ExampleRows(test, seed=0)
  for start in range(0, len(test) - batch_size + 1, batch_size):
    sums = trainer.eval_sums(state, rows.batch(
        range(start, start + batch_size)))
    correct += float(sums["correct"])
    count += float(sums["tokens"])
  return correct / max(count, 1.0)


def run_one(preset: Preset, task: str, variant: str, seed: int,
            data_dir: str | None = None) -> dict:
  """Trains ``variant`` on ``task`` and measures it on the test split
  (the examples read from ``data_dir``'s cache when given)."""
  wall, cpu = time.perf_counter(), cpu_seconds()
  s = preset.settings(task)
  mesh = shd.make_mesh("fsdp=1", jax.devices()[:1])
  config = model_config(preset, task, variant)
  trainer = Trainer(config, train_config(preset, task, seed), mesh=mesh,
                    rules="dp")
  train, test = (datasets(preset, task, seed) if data_dir is None
                 else cached_datasets(preset, task, seed, data_dir))
  rows = ExampleRows(train, seed=seed)
  state = trainer.init()
  history, data_seconds = [], 0.0
  log_every = max(s.steps // 10, 1)
  for step in range(s.steps):
    began = time.perf_counter()
    batch = rows.batch(range(step * s.batch_size,
                             (step + 1) * s.batch_size))
    data_seconds += time.perf_counter() - began
    state, metrics = trainer.step(state, batch)
    if (step + 1) % log_every == 0 or step + 1 == s.steps:
      history.append((step + 1, round(float(metrics["loss"]), 4)))
  began = time.perf_counter()
  accuracy = measure_accuracy(trainer, state, test, s.batch_size)
  parameters = sum(int(np.prod(x.shape))
                   for x in jax.tree.leaves(state.params))
  return {"task": task, "mixer": variant, "seed": seed,
          "seq_len": s.seq_len, "d_model": s.d_model,
          "n_layers": s.n_layers, "steps": s.steps,
          "batch_size": s.batch_size, "parameters": parameters,
          "accuracy": round(accuracy, 4), "history": history,
          "data_s": round(data_seconds, 2),
          "test_s": round(time.perf_counter() - began, 2),
          "wall_s": round(time.perf_counter() - wall, 2),
          "cpu_s": round(cpu_seconds() - cpu, 2)}


def run_key(record: dict) -> tuple:
  return (record["task"], record["mixer"], record["seed"],
          record["seq_len"], record["d_model"], record["n_layers"],
          record["steps"], record["batch_size"])


def jobs_of(preset: Preset) -> list[tuple[str, str, int]]:
  return [(task, mixer, seed) for task in preset.tasks
          for mixer in preset.mixers for seed in preset.seeds]


def job_key(preset: Preset, job: tuple[str, str, int]) -> tuple:
  task, mixer, seed = job
  s = preset.settings(task)
  return (task, mixer, seed, s.seq_len, s.d_model, s.n_layers, s.steps,
          s.batch_size)


def run_grid(preset: Preset, results_path: str, workers: int = 1,
             log=print, data_dir: str | None = None) -> list[dict]:
  """Runs every job of ``preset`` not in ``results_path`` yet, appending a
  line per run; returns all records. With ``data_dir`` the examples of
  each (task, seed) are generated once, here, and the runs read them."""
  done = {run_key(r) for r in read_results(results_path)}
  todo = [job for job in jobs_of(preset) if job_key(preset, job) not in done]
  log(f"{len(todo)} runs to do ({len(done)} already in {results_path})")
  if data_dir is not None:
    for task, seed in dict.fromkeys((t, s) for t, _, s in todo):
      began = time.perf_counter()
      cached_datasets(preset, task, seed, data_dir)
      log(f"data: {task}, seed {seed}, in {data_dir} "
          f"({time.perf_counter() - began:.0f} s)")

  def save(record):
    append_results(results_path, [record])
    log(f"{record['task']:>12s} {record['mixer']:>20s} seed={record['seed']}"
        f" acc={record['accuracy']:.4f} loss={record['history'][-1][1]} "
        f"({record['wall_s']:.0f} s)")

  run_jobs(run_one, [(preset, *job, data_dir) for job in todo], workers,
           save)
  return read_results(results_path)


def cells(records: Sequence[dict]) -> dict[tuple, dict]:
  """``{(task, mixer): summary}``: the mean, minimum and maximum test
  accuracy over the seeds."""
  by_cell: dict[tuple, list[float]] = {}
  for r in records:
    by_cell.setdefault((r["task"], r["mixer"]), []).append(r["accuracy"])
  return {key: {"mean": float(np.mean(v)), "min": float(np.min(v)),
                "max": float(np.max(v)), "seeds": len(v)}
          for key, v in by_cell.items()}


def table(preset: Preset, records: Sequence[dict]) -> str:
  """Markdown: a row per variant; per task our test accuracy (%, mean
  over seeds, with the range when there are several) and the paper's."""
  summary = cells(records)
  tasks = [t for t in preset.tasks if any(k[0] == t for k in summary)]
  head = ("| mixer | " + " | ".join(
      f"{TASK_TITLES[t]} (here) | {TASK_TITLES[t]} (LRA paper)"
      for t in tasks) + " |")
  lines = [head, "|" + "---|" * (1 + 2 * len(tasks))]
  column = {"listops": 1, "pathfinder32": 2}
  for mixer in preset.mixers:
    if not any(k[1] == mixer for k in summary):
      continue
    published = PUBLISHED.get(mixer)
    parts = []
    for task in tasks:
      c = summary.get((task, mixer))
      ours = "" if c is None else f"{100 * c['mean']:.2f}" + (
          f" ({100 * c['min']:.1f}-{100 * c['max']:.1f}, {c['seeds']} seeds)"
          if c["seeds"] > 1 else "")
      theirs = ("" if published is None else
                f"{published[column[task]]:.2f} ({published[0]})")
      parts += [ours, theirs]
    lines.append(f"| {mixer} | " + " | ".join(parts) + " |")
  return "\n".join(lines)


def plot(preset: Preset, records: Sequence[dict], path: str) -> bool:
  """Test accuracy per variant, a panel per task: ours as bars, the
  paper's as markers; False without matplotlib."""
  plt = run_output.matplotlib_pyplot()
  if plt is None:
    return False
  summary = cells(records)
  tasks = [t for t in preset.tasks if any(k[0] == t for k in summary)]
  if not tasks:
    return False
  mixers = [m for m in preset.mixers if any(k[1] == m for k in summary)]
  fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4),
                           sharey=True, squeeze=False)
  column = {"listops": 1, "pathfinder32": 2}
  chance = {"listops": 10.0, "pathfinder32": 50.0}
  for i, task in enumerate(tasks):
    ax = axes[0, i]
    x = np.arange(len(mixers))
    ours = [100 * summary[(task, m)]["mean"] if (task, m) in summary
            else np.nan for m in mixers]
    ax.bar(x, ours, color="tab:blue", label="here")
    paper = [PUBLISHED[m][column[task]] if m in PUBLISHED else np.nan
             for m in mixers]
    ax.plot(x, paper, "D", color="tab:red", label="LRA paper")
    ax.axhline(chance[task], color="0.5", ls=":", lw=1, label="chance")
    ax.set_xticks(x, mixers, rotation=45, ha="right", fontsize=8)
    ax.set_title(TASK_TITLES[task])
    ax.grid(axis="y", alpha=0.3)
  axes[0, 0].set_ylabel("test accuracy (%)")
  axes[0, 0].set_ylim(0, 100)
  axes[0, -1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def header(preset_name: str, preset: Preset, records: Sequence[dict],
           command: str) -> str:
  """The title, command, settings, the budgets against the paper's, and
  the cost."""
  lra_preset = PRESETS["lra"]
  lines = [f"# Long Range Arena: ListOps and Pathfinder-32 (preset "
           f"`{preset_name}`)", "", "Command:", "", f"    {command}", ""]
  for task in preset.tasks:
    s, paper = preset.settings(task), lra_preset.settings(task)
    seen = s.steps * s.batch_size
    lines.append(
        f"- {TASK_TITLES[task]}: rows of {s.seq_len} tokens, {s.n_layers} "
        f"layer(s), width {s.d_model}, {s.n_heads} heads, MLP {s.mlp_dim}, "
        f"{s.pooling} pooling, positions {s.positions}; batch "
        f"{s.batch_size} x {s.steps} steps ({seen:,} examples), learning "
        f"rate {s.learning_rate:.3g} (cosine, {s.warmup_steps} warmup), "
        f"weight decay {s.weight_decay}; test accuracy on {s.num_test} "
        f"examples. The LRA protocol (`--config=lra`): rows of "
        f"{paper.seq_len}, {paper.n_layers} layer(s), width {paper.d_model}, "
        f"{paper.steps:,} steps of {paper.batch_size} "
        f"({paper.steps * paper.batch_size:,} examples, "
        f"{paper.steps * paper.batch_size / max(seen, 1):,.0f}x these).")
  lines += [
      "", "Pathfinder level: " + preset.level + ". The data are generated "
      "here (`lin_attn_jax.data.lra`), not LRA's files: the same grammar "
      "and generator settings, not the same examples. The paper's numbers "
      "are Tay et al. 2020, Table 1 (test accuracy, %); Papers with Code's "
      "copy of the table agrees for Linformer (35.70 / 76.34), the others "
      "are as quoted. This grid's budget is far smaller (above): its "
      "numbers are a smoke test of the encoders on these tasks, not a "
      "reproduction.", "",
      cost_line(records, "compiling and data generation included"), ""]
  return "\n".join(lines)


def write_report(preset_name: str, preset: Preset, records: list[dict],
                 stem: str, command: str) -> bool:
  """``<stem>.md`` and ``<stem>.png``; returns whether the plot was
  drawn."""
  with open(stem + ".md", "w") as f:
    f.write(header(preset_name, preset, records, command) + "\n"
            + table(preset, records) + "\n")
  return plot(preset, records, stem + ".png")


def main(argv):
  preset = config_flags.command_config(argv, PRESETS, FLAGS.config,
                                       OVERRIDES)
  stem = os.path.join(FLAGS.out_dir, FLAGS.name or f"lra_{FLAGS.config}")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  results_path = stem + ".jsonl"
  wall = time.perf_counter()
  if FLAGS.report_only:
    records = read_results(results_path)
  else:
    records = run_grid(preset, results_path, FLAGS.workers,
                       data_dir=FLAGS.data_dir)
  wanted = {job_key(preset, job) for job in jobs_of(preset)}
  records = [r for r in records if run_key(r) in wanted]
  command = " ".join(["python -m experiments.lra"] + sys.argv[1:])
  plotted = write_report(FLAGS.config, preset, records, stem, command)
  print(table(preset, records))
  print(f"{len(records)} runs; this call: {time.perf_counter() - wall:.0f} s "
        f"wall ({children_cpu_seconds():.0f} s CPU in "
        f"workers); table: {stem}.md; plot: "
        f"{stem + '.png' if plotted else 'none (no matplotlib)'}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
