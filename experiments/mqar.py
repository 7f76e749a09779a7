r"""Multi-query associative recall (MQAR): recall against state size.

Trains a 2-layer ``LM`` of each mixer on MQAR (``lin_attn_jax.data.mqar``,
Zoology's task: key-value pairs, then the keys queried again; accuracy is
measured at the query positions only) for every setting ``(seq_len,
num_kv_pairs)``, model width, learning rate and seed of a preset. A cell
(mixer, width, setting) reports, over its seeds, the median and the spread
(minimum to maximum, and the quartiles in the cells file) of the best test
accuracy over the learning rates, against the mixer's state size
(``Mixer.state_size``, floats per layer and sequence; attention's KV cache
grows with the length, a recurrent state does not). ``short_conv`` pairs
every mixer that takes ``use_short_conv`` with a short convolution, as the
Based protocol does; each record says whether its mixer had one.

Presets (``PRESETS``; how each was sized is in its comment):

- ``paper``: Zoology's figure 2 (Arora et al. 2023, arXiv:2312.04927):
  vocabulary 8192; ``(64, 4), (128, 8), (256, 16)``; ``d_model`` 64 to 512;
  100k training and 3k test examples per setting, 64 epochs, batch 512
  (256 at length 256); AdamW with weight decay 0.1 and cosine decay;
  learning rates ``logspace(-4, -2, 4)``; Zoology's heads; a run stops once
  its test accuracy reaches 0.99. For a TPU or GPU.
- ``gpu_subset``: attention, GLA, Based, Mamba-2, DeltaNet and Gated
  DeltaNet with short convolutions at widths 64 and 128 on the three
  settings, 3 seeds, for one H200 within 6 minutes (``--workers=8``).
- ``cpu``: every mixer with short convolutions at length 64, 4 pairs, 3
  seeds, on a 2-core CPU in an hour (``--workers=2``).

``--config=NAME`` picks a preset; ``--config.<field>=VALUE`` changes any
field of it by its dotted name (``experiments/config_flags.py``): lists
comma-separated (``--config.d_models=64,128``), a setting as
``seq_len:num_kv_pairs`` (``--config.settings=64:4,128:8``), the mappings
by key (``--config.batch_size.128=64``, ``--config.heads.h3=-2``,
``--config.mixer_options.h3.d_state=16``).

Outputs in ``--out_dir``: ``mqar_<preset>.jsonl`` (one line per run, with
its seed, written as runs finish; a rerun skips the runs already there),
``mqar_<preset>_cells.jsonl`` (one line per cell: each seed's best
accuracy and learning rate, median, minimum, maximum, quartiles),
``mqar_<preset>.md`` (the table) and ``mqar_<preset>.png`` (accuracy
against state size, log scale, a line per mixer through its widths, the
median with minimum-maximum error bars, a panel per setting: the form of
the Based paper's Pareto figure; needs matplotlib, the ``analysis``
extra).

Run:
  python -m experiments.mqar --config=cpu --out_dir=benchmarks --workers=2
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 python -m experiments.mqar \\
      --config=gpu_subset --out_dir=benchmarks --workers=8
  python -m experiments.mqar --config=paper \\
      --config.mixers=softmax_attn,gla
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import config_flags, run_output
from experiments.grids import (append_results, children_cpu_seconds,
                               cost_line, cpu_seconds, read_results,
                               run_jobs)
from lin_attn_jax import sharding as shd
from lin_attn_jax.data import mqar
from lin_attn_jax.layers import MIXERS
from lin_attn_jax.models.lm import LM, LMConfig
from lin_attn_jax.train import TrainConfig, Trainer

# Every causal mixer of the zoo (Linformer and the encoder-only mixers,
# Agent Attention, Nystromformer and EfficientViT, are not causal: no recall
# task).
ALL_MIXERS = ("softmax_attn", "sliding_window_attn", "sparse_attn",
              "forgetting_attn", "stickbreaking_attn", "moba", "nsa",
              "path_attn", "linear_attn", "performer", "based", "retnet",
              "gla", "hgrn2", "mamba", "mamba2", "h3", "rg_lru", "deltanet",
              "gated_deltanet", "gdn2", "gated_deltaproduct", "kda", "mlstm",
              "rwkv6", "rwkv7", "gated_attn", "mla", "short_conv",
              "falcon_h1_parallel", "comba", "mamba3",
              "log_linear_mamba2", "mesa_net", "lightning_attn")


@dataclasses.dataclass(frozen=True)
class Preset:
  """A grid of MQAR runs and how each run trains."""

  # Token ids; keys come from [1, V / 2), values from [V / 2, V).
  vocab_size: int
  # (seq_len, num_kv_pairs) of every setting.
  settings: tuple[tuple[int, int], ...]
  # Model widths; each gives every mixer another state size.
  d_models: tuple[int, ...]
  # Peak learning rates; a (mixer, d_model, setting) reports the best.
  learning_rates: tuple[float, ...]
  # Mixers, names in layers.MIXERS.
  mixers: tuple[str, ...]
  # Training and test examples per setting (fixed sets, drawn once).
  num_train: int
  num_test: int
  # Passes over the training set (the cosine decay ends with the last).
  epochs: int
  # Rows per step, by seq_len (longer rows, smaller batches).
  batch_size: tuple[tuple[int, int], ...]
  # Test accuracy every this many steps; the run stops at early_stop.
  eval_every: int
  early_stop: float = 0.99
  # Blocks of the LM.
  n_layers: int = 2
  # Heads per mixer; mixers not named get default_heads. A negative entry
  # is a head width: -2 means heads of 2 channels.
  default_heads: int = 1
  heads: tuple[tuple[str, int], ...] = ()
  # The LM's MLP (LMConfig.mlp; "none": blocks of a mixer only).
  mlp: str = "swiglu"
  # Options per mixer name (layers.MIXERS keyword arguments).
  mixer_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
  # Optimizer: AdamW, decoupled weight decay, linear warmup over this
  # fraction of the steps, cosine decay to min_lr_ratio.
  weight_decay: float = 0.1
  warmup_fraction: float = 0.05
  min_lr_ratio: float = 0.0
  # MQAR: power law of the query gaps; filler tokens random (True) or 0.
  power_a: float = 0.01
  random_non_queries: bool = False
  # Seeds of a cell: seed, seed + 1, ..., seed + seeds - 1. Each draws its
  # own model init, training and test sets and batch order; the report
  # gives the median and the spread over them of the best accuracy over
  # the learning rates.
  seed: int = 0
  seeds: int = 3
  # Pair every mixer with a short convolution, as the Based protocol does:
  # use_short_conv=True for each mixer whose constructor takes it (kernel
  # size and bias through mixer_options, e.g. mixer_options.gla.conv_size).
  # DeltaNet, Gated DeltaNet, KDA, Mamba, Mamba-2 and RG-LRU always have
  # one; H3's shift SSM is one.
  short_conv: bool = False

  def __post_init__(self):
    for name in ("settings", "d_models", "learning_rates", "mixers",
                 "batch_size"):
      if not getattr(self, name):
        raise ValueError(f"{name} must not be empty")
    unknown = sorted(set(self.mixers) - set(MIXERS))
    if unknown:
      raise ValueError(f"unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
    if self.seeds < 1:
      raise ValueError(f"seeds must be >= 1, got {self.seeds}")
    # One order for the per-mixer entries, so that equal presets compare
    # equal.
    object.__setattr__(self, "heads", tuple(sorted(self.heads)))

  def to_dict(self) -> dict:
    """JSON-ready values; ``batch_size``, ``heads`` and ``mixer_options``
    as mappings (``{"64": 32}``, ``{"h3": -2}``, ``{"h3": {"d_state":
    8}}``), so that a dotted flag sets one entry."""
    values = config_flags.to_dict(self)
    values["batch_size"] = {str(t): rows for t, rows in self.batch_size}
    values["heads"] = dict(self.heads)
    values["mixer_options"] = {name: dict(kw)
                               for name, kw in self.mixer_options}
    return values

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "Preset":
    """The inverse of ``to_dict``."""
    values = dict(values)
    values["batch_size"] = tuple(sorted(
        (int(t), rows) for t, rows in dict(values["batch_size"]).items()))
    values["heads"] = tuple(sorted(dict(values["heads"]).items()))
    values["mixer_options"] = _options(**values["mixer_options"])
    return config_flags.from_dict(cls, values)

  def batch_size_for(self, seq_len: int) -> int:
    sizes = dict(self.batch_size)
    return sizes.get(seq_len, min(sizes.values()))

  def steps_for(self, seq_len: int) -> int:
    return self.epochs * (self.num_train // self.batch_size_for(seq_len))

  def heads_for(self, mixer: str, d_model: int) -> int:
    heads = dict(self.heads).get(mixer, self.default_heads)
    # A negative entry is a head width: -2 means heads of 2 channels (at
    # least one head).
    return max(1, d_model // -heads) if heads < 0 else heads

  def seed_list(self) -> tuple[int, ...]:
    return tuple(range(self.seed, self.seed + self.seeds))

  def options_for(self, mixer: str) -> dict:
    """The mixer's keyword arguments: its ``mixer_options``, and
    ``use_short_conv=True`` with ``short_conv`` where the mixer takes it
    and its options do not set it."""
    options = dict(dict(self.mixer_options).get(mixer, ()))
    if self.short_conv and "use_short_conv" in _parameters(mixer):
      options.setdefault("use_short_conv", True)
    return options

  def has_short_conv(self, mixer: str) -> bool:
    """Whether the mixer, built with ``options_for(mixer)``, runs a short
    convolution: its ``use_short_conv`` (given or default), else whether
    its constructor has a convolution that is always there."""
    parameters = _parameters(mixer)
    if "use_short_conv" in parameters:
      return bool(self.options_for(mixer).get(
          "use_short_conv", parameters["use_short_conv"].default))
    return any(name in parameters for name in ALWAYS_CONV)


# Constructor arguments of a convolution a mixer always runs: the short
# convolution of DeltaNet, Gated DeltaNet and KDA (conv_size), Mamba and
# Mamba-2 (d_conv), RG-LRU's temporal convolution (conv_width), H3's
# shift SSM (shift_size taps) and PaTH's convolution of its Householder
# directions (conv_size; none on q, k and v).
ALWAYS_CONV = ("conv_size", "d_conv", "conv_width", "shift_size")


def _parameters(mixer: str) -> Mapping[str, inspect.Parameter]:
  return inspect.signature(MIXERS[mixer].__init__).parameters


def _short_conv(mixer: str) -> dict:
  """``{"use_short_conv": True}`` where the mixer takes the option."""
  return {"use_short_conv": True} if (
      "use_short_conv" in _parameters(mixer)) else {}


def _options(**per_mixer) -> tuple:
  return tuple(sorted((name, tuple(sorted(kw.items())))
                      for name, kw in per_mixer.items()))


# The papers' learning-rate grids: Zoology's figure 2
# (zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py) and
# the Based paper's sweeps (.../arxiv24_based_figure2/configs.py).
ZOOLOGY_LEARNING_RATES = tuple(float(x) for x in np.logspace(-4, -2, 4))
BASED_LEARNING_RATES = tuple(float(x) for x in np.logspace(-3, -1.5, 4))

# Heads as Zoology's configs set them (paths under zoology/experiments/);
# a negative entry is a head width. Mixers not named have one head.
PAPER_HEADS = (
    # MHA(num_heads=1): iclr24_zoology_figure2/configs.py and
    # models_repo.py add_attention; SlidingAttn is one head
    # (arxiv24_based_figure2/configs.py).
    ("softmax_attn", 1), ("sliding_window_attn", 1),
    # Based(num_heads=1, num_key_value_heads=1): the same two files.
    ("based", 1),
    # GatedLinearAttention, DeltaNet, GatedDeltaNet (num_heads=2):
    # models_repo.py add_gla, add_delta_net, add_gated_delta_net. KDA, not
    # in Zoology, as Gated DeltaNet.
    ("gla", 2), ("deltanet", 2), ("gated_deltanet", 2), ("kda", 2),
    # Mamba-2's own: zoology/mixers/mamba2.py, expand 2 and headdim 64,
    # 2 d_model / 64 heads, a head per 32 channels of d_model. (Mamba-1
    # has no heads.)
    ("mamba2", -32),
    # H3(head_dim=2): iclr24_zoology_figure2/configs.py.
    ("h3", -2),
    # RWKV7Attention(head_dim=64): models_repo.py add_rwkv7; RWKV-6 alike.
    ("rwkv6", -64), ("rwkv7", -64),
    # Not in Zoology: the newer softmax-family mixers as its attention, one
    # head; Gated DeltaNet-2 and Gated DeltaProduct as Gated DeltaNet, two;
    # the mLSTM as GLA, two.
    ("forgetting_attn", 1), ("stickbreaking_attn", 1), ("moba", 1),
    ("nsa", 1), ("path_attn", 1), ("gdn2", 2), ("gated_deltaproduct", 2),
    ("mlstm", 2),
)

# MoBA and NSA at the presets' lengths (64 to 256) rather than at their
# references' (blocks of 64 to 512 tokens over thousands): blocks of 8 tokens, 8
# blocks at length 64 and 32 at 256. MoBA: each query attends to its own block
# and the 2 earlier blocks of largest gate (top_k 3, 24 keys). NSA: 4 selected
# blocks (the first, previous and current forced, one more chosen by the
# compressed branch's scores), the compressed branch over the block means, a
# window of 16 tokens (the cpu preset's sliding window). The other new mixers
# (FoX, stick-breaking, PaTH, Gated DeltaNet-2) run at their layers' defaults, a
# short convolution added by short_conv where the layer takes use_short_conv
# (FoX; Gated DeltaNet-2 has one by default, PaTH one on its Householder
# directions).
BLOCK_SPARSE_OPTIONS = dict(moba={"block_size": 8, "top_k": 3},
                            nsa={"block_size": 8, "block_counts": 4,
                                 "window_size": 16})

PRESETS = {
    # Zoology's figure 2 (Arora et al. 2023): vocabulary 8192, settings
    # (64, 4), (128, 8), (256, 16), widths 64 to 512, 100k training and 3k
    # test examples, 64 epochs, batch 512 (256 at length 256), Zoology's
    # learning rates, no MLP, 2 layers, Zoology's heads; H3 with d_state 64
    # (Zoology: the sequence length) and Based with feature_dim 8 paired
    # with a short convolution (Zoology's Hybrid of BaseConv and Based).
    # The Based paper's protocol is this grid with --config.short_conv=true
    # and its learning rates (docs/research.md).
    "paper": Preset(
        vocab_size=8192,
        settings=((64, 4), (128, 8), (256, 16)),
        d_models=(64, 128, 256, 512),
        learning_rates=ZOOLOGY_LEARNING_RATES,
        mixers=ALL_MIXERS,
        num_train=100_000, num_test=3_000, epochs=64,
        batch_size=((64, 512), (128, 512), (256, 256)),
        eval_every=200,
        mlp="none",
        heads=PAPER_HEADS,
        mixer_options=_options(
            sliding_window_attn={"window_size": 64},
            based={"feature_dim": 8, **_short_conv("based")},
            h3={"d_state": 64}, **BLOCK_SPARSE_OPTIONS)),
    # Six mixers of the Based paper's protocol (every mixer with a short
    # convolution, Zoology's heads) at widths 64 and 128 and the three
    # settings of figure 2, 3 seeds, on one H200 within 6 minutes:
    # vocabulary 256 (127 keys, 8 times the 16 pairs) instead of 8192,
    # whose key embeddings need the paper's tens of epochs; one learning
    # rate of the Based grid, 10^-2.5 (3e-3 took attention off the plateau
    # on the CPU, benchmarks/mqar_cpu.md); 500 steps of 128 rows.
    # Time, estimated, not measured on the GPU: one compiled step per
    # (mixer, width, length) job, 36 jobs, each compiling in 4 to 19 s on
    # one CPU core (measured, width 64, length 64; the GPU's compiles
    # counted at 25 s); 108 runs of at most 500 steps, 54k steps, at
    # 10 ms a step (these models are bound by kernel launches on a GPU) and
    # 3 to 4 processes' steps overlapping on the GPU. With --workers=8:
    # compiles 36 x 25 s / 8 = 115 s, steps 54k x 10 ms / 3.5 = 155 s,
    # start and evaluation 40 s: 310 s. experiments/gpu_checks.sh runs it.
    "gpu_subset": Preset(
        vocab_size=256,
        settings=((64, 4), (128, 8), (256, 16)),
        d_models=(64, 128),
        learning_rates=BASED_LEARNING_RATES[1:2],
        mixers=("softmax_attn", "gla", "based", "mamba2", "deltanet",
                "gated_deltanet"),
        num_train=64_000, num_test=512, epochs=1,
        batch_size=((64, 128), (128, 128), (256, 128)),
        eval_every=100,
        mlp="none",
        heads=PAPER_HEADS,
        short_conv=True,
        mixer_options=_options(based={"feature_dim": 8})),
    # The take-off of every mixer on a 2-core CPU in an hour
    # (benchmarks/mqar_cpu.md): vocabulary 64, length 64, 4 pairs, width 64,
    # short convolutions, Zoology's heads, 3 seeds, the Based grid's
    # 10^-2.5, at most 1500 steps of 32 rows. Width 64 is the narrowest at
    # which 2-layer, 1-head attention formed the recall circuit within 500
    # to 1000 steps at 3e-3 (width 32 stayed at the 1 / pairs plateau for
    # 1500 steps; at width 64, 1e-3 and 1e-2 did not leave it within 1000
    # steps); GLA with a short convolution leaves it by 1000 steps.
    # Time, from 30 steps timed per mixer on one loaded core (width 64,
    # 32 x 64 tokens; ms a step): attention 14, linear attention 20, Based
    # 22, sliding window 25, Mamba-2 37, HGRN2 41, RetNet 44, GLA 51,
    # DeltaNet 92, Mamba 104, H3 105, Gated DeltaNet 121, RWKV-6 167;
    # compiling 4 to 34 s a mixer. One step of all 13 mixers is 0.84 CPU
    # seconds, 2.5 with the 3 seeds, 1500 steps 3,800; with evaluation
    # (5%) and compiling, about 4,300 CPU seconds: 36 minutes with
    # --workers=2, less where early stopping ends the runs that solve it
    # (26 minutes, measured). The six added later (FoX, stick-breaking,
    # MoBA, NSA, PaTH, Gated DeltaNet-2; options in BLOCK_SPARSE_OPTIONS'
    # comment), CPU ms a step from their runs (seeds 1 and 2, evaluation
    # included): stick-breaking 20, MoBA 26, FoX 28, PaTH 45, NSA 69,
    # Gated DeltaNet-2 111; their 18 runs took 16 minutes with --workers=2.
    "cpu": Preset(
        vocab_size=64,
        settings=((64, 4),),
        d_models=(64,),
        learning_rates=BASED_LEARNING_RATES[1:2],
        mixers=("softmax_attn", "sliding_window_attn", "forgetting_attn",
                "stickbreaking_attn", "moba", "nsa", "path_attn",
                "linear_attn", "retnet", "gla", "based", "mamba", "mamba2",
                "deltanet", "gated_deltanet", "gdn2", "gated_deltaproduct",
                "mlstm", "rwkv6", "h3", "hgrn2", "comba", "mamba3",
                "log_linear_mamba2", "mesa_net"),
        num_train=48_000, num_test=512, epochs=1,
        batch_size=((64, 32),),
        eval_every=100,
        mlp="none",
        heads=PAPER_HEADS,
        short_conv=True,
        mixer_options=_options(sliding_window_attn={"window_size": 16},
                               based={"feature_dim": 8, "window_size": 16},
                               h3={"d_state": 8, "shift_size": 4},
                               hgrn2={"expand_ratio": 16},
                               **BLOCK_SPARSE_OPTIONS)),
}

FLAGS = flags.FLAGS
def define_flags() -> None:
  """The command's absl flags, defined when it runs (importing the module
  defines none, so that tests and other scripts can import it)."""
  flags.DEFINE_string("config", "cpu", "The grid to run, a preset: "
                      + ", ".join(PRESETS) + "; --config.<field>=VALUE "
                      "overrides a field by dotted name, e.g. "
                      "--config.mixers=gla,retnet, --config.d_models=64,128.")
  flags.DEFINE_string("out_dir", "benchmarks", "where the results go")
  flags.DEFINE_string("name", None, "file name stem (default mqar_<config>)")
  flags.DEFINE_integer("workers", 1, "processes training runs side by side "
                       "(on a CPU, one per core)")
  flags.DEFINE_bool("report_only", False,
                    "write the table and plot from the results file, train "
                    "nothing")


# The --config.<field>=VALUE arguments of the command line, by field path.
OVERRIDES: dict[str, str | None] = {}


@dataclasses.dataclass(frozen=True)
class Job:
  """Runs that share one compiled train step: one mixer, width, learning
  rate and sequence length, each setting of that length and each seed."""

  mixer: str
  d_model: int
  learning_rate: float
  seq_len: int
  pairs: tuple[int, ...]
  seeds: tuple[int, ...] = (0,)


def model_config(preset: Preset, mixer: str, d_model: int) -> LMConfig:
  options = preset.options_for(mixer)
  return LMConfig(vocab_size=preset.vocab_size, d_model=d_model,
                  n_layers=preset.n_layers,
                  n_heads=preset.heads_for(mixer, d_model), mixer=mixer,
                  mixer_options={mixer: options} if options else (),
                  mlp=preset.mlp)


def train_config(preset: Preset, seq_len: int, learning_rate: float,
                 seed: int | None = None):
  steps = preset.steps_for(seq_len)
  return TrainConfig(seed=preset.seed if seed is None else seed,
                     batch_size=preset.batch_size_for(seq_len),
                     seq_len=seq_len, steps=steps,
                     learning_rate=learning_rate,
                     warmup_steps=int(preset.warmup_fraction * steps),
                     min_lr_ratio=preset.min_lr_ratio,
                     weight_decay=preset.weight_decay)


def state_size(config: LMConfig, seq_len: int) -> int:
  """Floats of one layer's state (the first layer's mixer) at ``seq_len``."""
  model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  return model.blocks[0].mixer.state_size(seq_len)


def mqar_data(preset: Preset, seq_len: int, pairs: int,
              seed: int | None = None) -> mqar.MQARData:
  return mqar.train_test_split(
      preset.num_train, preset.num_test,
      seed=preset.seed if seed is None else seed,
      vocab_size=preset.vocab_size, seq_len=seq_len, num_kv_pairs=pairs,
      power_a=preset.power_a, random_non_queries=preset.random_non_queries)


def to_batch(inputs, targets) -> dict:
  """A ``Trainer`` batch: loss only at the queries (weight 0 where the
  target is ``IGNORE_INDEX``)."""
  queries = targets != mqar.IGNORE_INDEX
  return {"inputs": inputs, "targets": np.where(queries, targets, 0),
          "weights": queries.astype(np.float32),
          "segment_ids": np.ones_like(inputs)}


def query_accuracy_fn(trainer: Trainer):
  """A jitted ``(state, inputs, targets) -> (correct, queries)``: greedy
  predictions compared with the targets at the query positions."""

  def counts(params, rest, inputs, targets):
    with shd.use_rules(trainer.rules):
      model = nnx.merge(trainer.graphdef, params, rest)
      predictions = jnp.argmax(model(inputs), axis=-1)          # [B, T]
    queries = targets != mqar.IGNORE_INDEX
    return (jnp.sum((predictions == targets) & queries),
            jnp.sum(queries))

  jitted = jax.jit(counts)

  def accuracy_counts(state, inputs, targets):
    with jax.set_mesh(trainer.mesh):
      return jitted(state.params, state.rest, inputs, targets)

  return accuracy_counts


def test_accuracy(accuracy_counts, state, data: mqar.MQARData,
                  batch_size: int) -> float:
  """Accuracy over the test set, in batches of ``batch_size`` rows."""
  correct = total = 0
  for start in range(0, len(data.test_inputs), batch_size):
    c, n = accuracy_counts(state, data.test_inputs[start:start + batch_size],
                           data.test_targets[start:start + batch_size])
    correct, total = correct + int(c), total + int(n)
  return correct / max(total, 1)


def train_one(trainer: Trainer, accuracy_counts, data: mqar.MQARData,
              preset: Preset, state=None, seed: int | None = None) -> dict:
  """Trains ``state`` (default: ``trainer.init()``) on ``data``, batches in
  the order of ``seed``, until the steps run out or the test accuracy
  reaches ``preset.early_stop``; returns the run's record."""
  config = trainer.config
  rows = len(data.train_inputs)
  per_epoch = rows // config.batch_size
  rng = np.random.default_rng(preset.seed if seed is None else seed)
  state = trainer.init() if state is None else state
  accuracy, step, history = 0.0, 0, []
  while step < config.steps:
    if step % per_epoch == 0:
      order = rng.permutation(rows)
    pick = order[(step % per_epoch) * config.batch_size:
                 (step % per_epoch + 1) * config.batch_size]
    state, metrics = trainer.step(
        state, to_batch(data.train_inputs[pick], data.train_targets[pick]))
    step += 1
    if step % preset.eval_every == 0 or step == config.steps:
      accuracy = test_accuracy(accuracy_counts, state, data,
                               config.batch_size)
      history.append((step, round(float(metrics["loss"]), 4),
                      round(accuracy, 4)))
      if accuracy >= preset.early_stop:
        break
  return {"accuracy": accuracy, "steps": step, "history": history}


def run_job(preset: Preset, job: Job) -> list[dict]:
  """Every setting and seed of ``job``: one ``Trainer`` (one compiled
  step) for all; a seed's initial state comes from a ``Trainer`` of that
  seed (only its init is compiled)."""
  wall, cpu = time.perf_counter(), cpu_seconds()
  mesh = shd.make_mesh("fsdp=1", jax.devices()[:1])
  config = model_config(preset, job.mixer, job.d_model)
  trainer = Trainer(config, train_config(preset, job.seq_len,
                                         job.learning_rate, job.seeds[0]),
                    mesh=mesh, rules="dp")
  accuracy_counts = query_accuracy_fn(trainer)
  size = state_size(config, job.seq_len)
  records = []
  for seed in job.seeds:
    seeded = Trainer(config, train_config(preset, job.seq_len,
                                          job.learning_rate, seed),
                     mesh=mesh, rules="dp")
    for pairs in job.pairs:
      # The first run's times include building the trainer and compiling.
      result = train_one(trainer, accuracy_counts,
                         mqar_data(preset, job.seq_len, pairs, seed), preset,
                         state=seeded.init(), seed=seed)
      records.append({
          "mixer": job.mixer, "d_model": job.d_model,
          "n_heads": config.n_heads,
          "short_conv": preset.has_short_conv(job.mixer),
          "seq_len": job.seq_len, "num_kv_pairs": pairs,
          "learning_rate": job.learning_rate, "seed": seed,
          "state_size": size, **result,
          "wall_s": round(time.perf_counter() - wall, 2),
          "cpu_s": round(cpu_seconds() - cpu, 2)})
      wall, cpu = time.perf_counter(), cpu_seconds()
  return records


def jobs_of(preset: Preset) -> list[Job]:
  by_length: dict[int, list[int]] = {}
  for seq_len, pairs in preset.settings:
    by_length.setdefault(seq_len, []).append(pairs)
  return [Job(m, d, lr, t, tuple(p), preset.seed_list())
          for m in preset.mixers for d in preset.d_models
          for lr in preset.learning_rates for t, p in by_length.items()]


def run_key(record: dict) -> tuple:
  """What identifies a run: mixer, short convolution, width, setting,
  learning rate and seed."""
  return (record["mixer"], bool(record.get("short_conv", False)),
          record["d_model"], record["seq_len"], record["num_kv_pairs"],
          float(record["learning_rate"]), record.get("seed", 0))


def run_keys(preset: Preset, job: Job | None = None) -> set[tuple]:
  """The ``run_key`` of every run of ``job`` (default: of the preset)."""
  jobs = jobs_of(preset) if job is None else [job]
  return {(j.mixer, preset.has_short_conv(j.mixer), j.d_model, j.seq_len, p,
           float(j.learning_rate), s)
          for j in jobs for p in j.pairs for s in j.seeds}


def run_grid(preset: Preset, results_path: str, workers: int = 1,
             log=print) -> list[dict]:
  """Runs every job of ``preset`` whose runs are not all in
  ``results_path`` yet, appending a line per run; returns all records."""
  done = {run_key(r) for r in read_results(results_path)}
  todo = [job for job in jobs_of(preset)
          if not run_keys(preset, job) <= done]
  log(f"{len(todo)} jobs to run ({len(done)} runs already in "
      f"{results_path})")

  def save(records):
    new = [r for r in records if run_key(r) not in done]
    append_results(results_path, new)
    for record in new:
      log(f"{record['mixer']:>20s} d={record['d_model']:<4d} "
          f"T={record['seq_len']:<4d} P={record['num_kv_pairs']:<3d} "
          f"lr={record['learning_rate']:.1e} seed={record['seed']} "
          f"acc={record['accuracy']:.3f} steps={record['steps']} "
          f"({record['wall_s']:.0f} s)")

  run_jobs(run_job, [(preset, job) for job in todo], workers, save)
  return read_results(results_path)


def cell_key(record: dict) -> tuple:
  """A cell of the report: ``(mixer, short_conv, d_model, seq_len,
  num_kv_pairs)``."""
  return run_key(record)[:5]


def best_over_learning_rates(records: Sequence[dict]) -> dict:
  """``{(mixer, short_conv, d_model, seq_len, pairs, seed): best record}``:
  per seed, the run of the learning rate with the best accuracy."""
  best: dict[tuple, dict] = {}
  for r in records:
    key = cell_key(r) + (r.get("seed", 0),)
    if key not in best or r["accuracy"] > best[key]["accuracy"]:
      best[key] = r
  return best


def cells(records: Sequence[dict]) -> dict[tuple, dict]:
  """``{cell_key: summary}``: over the seeds of a cell, the median, the
  minimum and maximum and the quartiles of the best accuracy over the
  learning rates, with each seed's accuracy and best learning rate."""
  by_cell: dict[tuple, list[dict]] = {}
  for key, r in sorted(best_over_learning_rates(records).items()):
    by_cell.setdefault(key[:5], []).append(r)
  summaries = {}
  for key, runs in by_cell.items():
    accuracy = np.array([r["accuracy"] for r in runs])
    q25, median, q75 = np.percentile(accuracy, [25, 50, 75])
    mixer, conv, d_model, seq_len, pairs = key
    summaries[key] = {
        "mixer": mixer, "short_conv": conv, "d_model": d_model,
        "n_heads": runs[0]["n_heads"], "seq_len": seq_len,
        "num_kv_pairs": pairs, "state_size": runs[0]["state_size"],
        "seeds": [r.get("seed", 0) for r in runs],
        "accuracies": [r["accuracy"] for r in runs],
        "learning_rates": [r["learning_rate"] for r in runs],
        "median": float(median), "min": float(accuracy.min()),
        "max": float(accuracy.max()), "q25": float(q25), "q75": float(q75)}
  return summaries


def table(preset: Preset, records: Sequence[dict]) -> str:
  """Markdown: a row per (mixer, short convolution, d_model); per setting,
  the median over seeds of the best accuracy over the learning rates, the
  minimum and maximum over seeds, and the number of seeds."""
  summary = cells(records)
  settings = [s for s in preset.settings
              if any(k[3:] == s for k in summary)]
  head = ("| mixer | short conv | d_model | heads | state size "
          "(floats/layer) | "
          + " | ".join(f"T={t}, P={p}" for t, p in settings) + " |")
  lines = [head, "|" + "---|" * (5 + len(settings))]
  rows = sorted({k[:3] for k in summary},
                key=lambda k: (preset.mixers.index(k[0])
                               if k[0] in preset.mixers else len(MIXERS),
                               k[1], k[2]))
  for mixer, conv, d in rows:
    row = [summary.get((mixer, conv, d) + s) for s in settings]
    sizes = sorted({c["state_size"] for c in row if c})
    heads = next(c["n_heads"] for c in row if c)
    lines.append(
        f"| {mixer} | {'yes' if conv else 'no'} | {d} | {heads} | "
        + ", ".join(f"{s:,}" for s in sizes) + " | "
        + " | ".join("" if c is None else
                     f"{c['median']:.3f} ({c['min']:.2f}-{c['max']:.2f}, "
                     f"{len(c['seeds'])})" for c in row) + " |")
  return "\n".join(lines)


def plot(preset: Preset, records: Sequence[dict], path: str) -> bool:
  """Accuracy against state size (log scale), a panel per setting, a line
  per mixer through its widths: the median over seeds, error bars from
  the minimum to the maximum; False without matplotlib."""
  plt = run_output.matplotlib_pyplot()
  if plt is None:
    return False
  import matplotlib.ticker
  summary = cells(records)
  settings = [s for s in preset.settings if any(k[3:] == s for k in summary)]
  if not settings:
    return False
  fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 4),
                           sharey=True, squeeze=False)
  colors = plt.get_cmap("tab20")
  lines = sorted({k[:2] for k in summary},
                 key=lambda k: (preset.mixers.index(k[0])
                                if k[0] in preset.mixers else len(MIXERS),
                                k[1]))
  for i, (t, p) in enumerate(settings):
    ax = axes[0, i]
    for j, (mixer, conv) in enumerate(lines):
      points = sorted((c["state_size"], c["median"], c["min"], c["max"])
                      for k, c in summary.items()
                      if k[:2] == (mixer, conv) and k[3:] == (t, p))
      if points:
        x, y, low, high = (np.array(v) for v in zip(*points))
        # The dark shades of tab20 first, then the light ones.
        ax.errorbar(x, y, yerr=[y - low, high - y], fmt="o-",
                    color=colors((2 * j + j // 10) % 20), ms=4, capsize=2,
                    label=mixer + (" + conv" if conv else ""))
    ax.axhline(1 / p, color="0.5", ls=":", lw=1,
               label="1 / pairs" if i == len(settings) - 1 else None)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"seq_len {t}, {p} pairs")
    ax.set_xlabel("state size (floats per layer)")
    ax.grid(alpha=0.3)
  axes[0, 0].set_ylabel("MQAR accuracy (median over seeds, min-max)")
  axes[0, 0].set_ylim(-0.02, 1.02)
  axes[0, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def header(preset_name: str, preset: Preset, records: Sequence[dict],
           command: str) -> str:
  """The report's title, command, settings and cost (CPU seconds summed over
  the runs, compiling included, whichever calls ran them)."""
  lengths = sorted({t for t, _ in preset.settings})
  batches = ", ".join(f"{preset.batch_size_for(t)} rows x {t} tokens for "
                      f"at most {preset.steps_for(t)} steps" for t in lengths)
  return "\n".join([
      f"# MQAR: recall against state size (preset `{preset_name}`)", "",
      "Command:", "", f"    {command}", "",
      f"Vocabulary {preset.vocab_size}; {preset.n_layers} layers, MLP "
      f"{preset.mlp!r}; short convolutions "
      f"{'on' if preset.short_conv else 'off'} (where a mixer takes "
      f"`use_short_conv`); learning rates "
      f"{[float(f'{lr:.3g}') for lr in preset.learning_rates]}; seeds "
      f"{list(preset.seed_list())}; {batches} (cosine decay, warmup "
      f"{preset.warmup_fraction:.0%}, weight decay {preset.weight_decay}), "
      f"test accuracy every {preset.eval_every} steps, stop at "
      f"{preset.early_stop}. A cell is the median over seeds of the best "
      f"test accuracy over the learning rates on {preset.num_test} "
      "examples, then (minimum-maximum over seeds, number of seeds); state "
      "size is `Mixer.state_size` (floats per layer; attention's KV cache "
      "at the sequence length).", "",
      cost_line(records), ""])


def main(argv):
  preset = config_flags.command_config(argv, PRESETS, FLAGS.config,
                                          OVERRIDES)
  stem = os.path.join(FLAGS.out_dir, FLAGS.name or f"mqar_{FLAGS.config}")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  results_path = stem + ".jsonl"
  wall, cpu = time.perf_counter(), cpu_seconds()
  if FLAGS.report_only:
    records = read_results(results_path)
  else:
    records = run_grid(preset, results_path, FLAGS.workers)
  cpu_total = cpu_seconds() - cpu + children_cpu_seconds()
  wanted = run_keys(preset)
  records = [r for r in records if run_key(r) in wanted]
  command = " ".join(["python -m experiments.mqar"] + sys.argv[1:])
  with open(stem + ".md", "w") as f:
    f.write(header(FLAGS.config, preset, records, command) + "\n"
            + table(preset, records) + "\n")
  with open(stem + "_cells.jsonl", "w") as f:
    for summary in cells(records).values():
      f.write(json.dumps(summary) + "\n")
  plotted = plot(preset, records, stem + ".png")
  print(table(preset, records))
  print(f"{len(records)} runs; this call: {time.perf_counter() - wall:.0f} s "
        f"wall, {cpu_total:.0f} s CPU; cells: {stem}_cells.jsonl; plot: "
        f"{stem + '.png' if plotted else 'none (no matplotlib)'}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=config_flags.flags_parser(OVERRIDES))
