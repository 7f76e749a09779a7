"""experiments/mqar.py: a tiny attention LM learns MQAR (64 tokens, 4
pairs) to the early-stopping accuracy; seeds are aggregated into the
median and spread of the best accuracy over the learning rates; the
``short_conv`` option reaches the mixers that take ``use_short_conv``; the
presets are the papers' grids and take ``--config.<field>`` overrides, and
a bad one names its field."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import config_flags
from experiments import mqar as experiment
from lin_attn_jax.data.mqar import IGNORE_INDEX
from lin_attn_jax.layers import MIXERS, GLA
from lin_attn_jax.models.lm import LM

TINY = dataclasses.replace(
    experiment.PRESETS["cpu"], mixers=("softmax_attn",), d_models=(64,),
    learning_rates=(3e-3,), settings=((64, 4),), num_train=32_000,
    num_test=256, eval_every=100, seeds=1, heads=())


def test_batches_weigh_only_the_queries():
  data = experiment.mqar_data(TINY, 64, 4)
  batch = experiment.to_batch(data.train_inputs[:8], data.train_targets[:8])
  queries = data.train_targets[:8] != IGNORE_INDEX
  np.testing.assert_array_equal(batch["weights"], queries)
  assert batch["weights"].sum() == 8 * 4
  assert (batch["targets"][~queries] == 0).all()


@pytest.mark.slow
def test_attention_learns_mqar(tmp_path):
  records = experiment.run_grid(TINY, str(tmp_path / "runs.jsonl"))
  (record,) = records
  assert record["accuracy"] >= TINY.early_stop, record["history"]
  assert record["state_size"] == 2 * 64 * 64
  assert record["seed"] == 0 and record["short_conv"] is False
  table = experiment.table(TINY, records)
  assert "| softmax_attn | no | 64 | 1 | 8,192 |" in table
  # A second call finds the run done and trains nothing.
  assert experiment.run_grid(TINY, str(tmp_path / "runs.jsonl")) == records


def test_seeds_and_short_convolutions_end_to_end(tmp_path):
  """Two mixers, two seeds, 10 steps each: a record per run with its
  seed, a cell per mixer over both seeds, the report's files (the best
  over learning rates: test_cells_take_the_best_rate_per_seed_then_the_
  median)."""
  preset = dataclasses.replace(
      experiment.PRESETS["cpu"], mixers=("softmax_attn", "mamba2"),
      learning_rates=(1e-3,), num_train=320, num_test=64,
      eval_every=5, seeds=2, seed=4)
  path = str(tmp_path / "runs.jsonl")
  records = experiment.run_grid(preset, path, log=lambda _: None)
  assert len(records) == 2 * 2
  assert {experiment.run_key(r) for r in records} == experiment.run_keys(
      preset)
  assert {r["seed"] for r in records} == {4, 5}
  assert all(r["steps"] == 10 for r in records)
  assert {r["mixer"]: r["short_conv"] for r in records} == {
      "softmax_attn": False, "mamba2": True}
  # Mamba-2's heads are Zoology's: 2 d_model / 64.
  assert {r["mixer"]: r["n_heads"] for r in records} == {
      "softmax_attn": 1, "mamba2": 2}
  # Different seeds draw different data and initial weights.
  for mixer in preset.mixers:
    histories = {r["seed"]: r["history"] for r in records
                 if r["mixer"] == mixer and r["learning_rate"] == 1e-3}
    assert histories[4] != histories[5]
  summary = experiment.cells(records)
  assert set(summary) == {("softmax_attn", False, 64, 64, 4),
                          ("mamba2", True, 64, 64, 4)}
  for cell in summary.values():
    assert cell["seeds"] == [4, 5] and len(cell["accuracies"]) == 2
    assert cell["min"] <= cell["median"] <= cell["max"]
  table = experiment.table(preset, records)
  assert "| mamba2 | yes | 64 | 2 |" in table
  assert table.count(", 2) |") == 2
  has_matplotlib = importlib.util.find_spec("matplotlib") is not None
  plot_path = str(tmp_path / "plot.png")
  assert experiment.plot(preset, records, plot_path) == has_matplotlib
  assert os.path.exists(plot_path) == has_matplotlib


def _record(mixer, seed, learning_rate, accuracy, conv=False):
  return {"mixer": mixer, "short_conv": conv, "d_model": 64, "n_heads": 1,
          "seq_len": 64, "num_kv_pairs": 4, "learning_rate": learning_rate,
          "seed": seed, "state_size": 100, "accuracy": accuracy}


def test_cells_take_the_best_rate_per_seed_then_the_median():
  accuracies = {  # seed: {learning rate: accuracy}
      0: {1e-3: 0.25, 1e-2: 0.90},
      1: {1e-3: 0.60, 1e-2: 0.30},
      2: {1e-3: 0.26, 1e-2: 0.27},
      3: {1e-3: 1.00, 1e-2: 0.99}}
  records = [_record("gla", s, lr, a) for s, row in accuracies.items()
             for lr, a in row.items()]
  records.append(_record("gla", 0, 1e-3, 0.1, conv=True))
  summary = experiment.cells(records)
  assert set(summary) == {("gla", False, 64, 64, 4),
                          ("gla", True, 64, 64, 4)}
  cell = summary[("gla", False, 64, 64, 4)]
  assert cell["seeds"] == [0, 1, 2, 3]
  assert cell["accuracies"] == [0.90, 0.60, 0.27, 1.00]
  assert cell["learning_rates"] == [1e-2, 1e-3, 1e-2, 1e-3]
  assert cell["median"] == pytest.approx(0.75)
  assert (cell["min"], cell["max"]) == (0.27, 1.00)
  # Quartiles interpolate linearly between the sorted accuracies.
  assert cell["q25"] == pytest.approx(0.27 + 0.75 * (0.60 - 0.27))
  assert cell["q75"] == pytest.approx(0.925)
  assert summary[("gla", True, 64, 64, 4)]["accuracies"] == [0.1]
  preset = dataclasses.replace(TINY, mixers=("gla",))
  table = experiment.table(preset, records)
  assert "| gla | no | 64 | 1 | 100 | 0.750 (0.27-1.00, 4) |" in table
  assert "| gla | yes | 64 | 1 | 100 | 0.100 (0.10-0.10, 1) |" in table


class ToyConvGLA(GLA):
  """GLA that records its ``use_short_conv`` argument."""

  def __init__(self, d_model, n_heads, *, use_short_conv: bool = False,
               conv_size: int = 4, **kw):
    super().__init__(d_model, n_heads, **kw)
    self.use_short_conv = use_short_conv
    self.conv_size = conv_size


def test_short_conv_reaches_the_mixers_that_take_it(monkeypatch):
  monkeypatch.setitem(MIXERS, "toy_conv_gla", ToyConvGLA)
  on = dataclasses.replace(TINY, mixers=("toy_conv_gla", "softmax_attn"),
                           short_conv=True)
  off = dataclasses.replace(on, short_conv=False)
  assert on.options_for("toy_conv_gla") == {"use_short_conv": True}
  assert on.options_for("softmax_attn") == {}
  assert off.options_for("toy_conv_gla") == {}
  assert (on.has_short_conv("toy_conv_gla"), off.has_short_conv(
      "toy_conv_gla"), on.has_short_conv("softmax_attn")) == (
          True, False, False)
  # An explicit option wins over the preset's switch.
  explicit = dataclasses.replace(on, mixer_options=experiment._options(
      toy_conv_gla={"use_short_conv": False, "conv_size": 3}))
  assert explicit.options_for("toy_conv_gla") == {"use_short_conv": False,
                                                  "conv_size": 3}
  assert not explicit.has_short_conv("toy_conv_gla")
  for preset, wanted, size in ((on, True, 4), (off, False, 4),
                               (explicit, False, 3)):
    config = experiment.model_config(preset, "toy_conv_gla", 64)
    model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
    mixer = model.blocks[0].mixer
    assert (mixer.use_short_conv, mixer.conv_size) == (wanted, size)


def test_short_conv_of_the_library_mixers():
  """Every mixer that takes ``use_short_conv`` gets it (more parameters:
  the convolution's taps); the mixers with a built-in convolution count
  as having one; softmax attention has none."""
  preset = dataclasses.replace(experiment.PRESETS["cpu"], mixers=("gla",))
  for name, cls in MIXERS.items():
    takes = "use_short_conv" in inspect.signature(cls.__init__).parameters
    if takes:
      on = dataclasses.replace(preset, mixers=(name,), mixer_options=())
      off = dataclasses.replace(on, mixer_options=experiment._options(
          **{name: {"use_short_conv": False}}))
      counts = []
      for p in (on, off):
        config = experiment.model_config(p, name, 64)
        model = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
        counts.append(sum(x.size for x in jax.tree.leaves(nnx.state(
            model, nnx.Param))))
      assert counts[0] > counts[1], name
      assert on.has_short_conv(name) and not off.has_short_conv(name)
  for name in ("deltanet", "gated_deltanet", "kda", "mamba", "mamba2",
               "rg_lru", "h3", "path_attn"):
    assert preset.has_short_conv(name), name
  for name in ("softmax_attn", "stickbreaking_attn", "moba", "nsa"):
    assert not preset.has_short_conv(name), name


def test_presets_are_the_papers_grids():
  paper, gpu, cpu = (experiment.PRESETS[n]
                     for n in ("paper", "gpu_subset", "cpu"))
  np.testing.assert_allclose(paper.learning_rates,
                             np.logspace(-4, -2, 4))
  np.testing.assert_allclose(experiment.BASED_LEARNING_RATES,
                             np.logspace(-3, -1.5, 4))
  assert paper.settings == gpu.settings == ((64, 4), (128, 8), (256, 16))
  assert paper.d_models == (64, 128, 256, 512)
  assert paper.steps_for(64) == 64 * (100_000 // 512)
  assert gpu.mixers == ("softmax_attn", "gla", "based", "mamba2",
                        "deltanet", "gated_deltanet")
  assert gpu.d_models == (64, 128) and gpu.short_conv and gpu.seeds >= 3
  assert set(gpu.learning_rates) <= set(experiment.BASED_LEARNING_RATES)
  assert cpu.settings == ((64, 4),) and cpu.short_conv and cpu.seeds >= 3
  # Every causal mixer has a row (Linformer and the encoder-only mixers
  # are not causal).
  assert set(MIXERS) - set(experiment.ALL_MIXERS) == {
      name for name, cls in MIXERS.items() if not cls.causal}
  assert "linformer" not in experiment.ALL_MIXERS
  assert paper.mixers == experiment.ALL_MIXERS
  new = ("forgetting_attn", "stickbreaking_attn", "moba", "nsa", "path_attn",
         "gdn2")
  assert set(new) <= set(cpu.mixers)
  for preset in (paper, cpu):
    # Several blocks at the shortest length, more than MoBA or NSA select.
    moba, nsa = preset.options_for("moba"), preset.options_for("nsa")
    assert 64 // moba["block_size"] > moba["top_k"] > 1
    assert 64 // nsa["block_size"] > nsa["block_counts"] > 3
    assert nsa["window_size"] < 64
    assert [preset.heads_for(m, 64) for m in new] == [1, 1, 1, 1, 1, 2]
  for preset in (paper, gpu, cpu):
    heads = {m: preset.heads_for(m, 64) for m in preset.mixers}
    assert heads["softmax_attn"] == 1
    assert all(heads[m] == 2 for m in ("gla", "deltanet", "gated_deltanet")
               if m in heads)
    assert preset.heads_for("mamba2", 128) == 4
    assert preset.heads_for("h3", 64) == 32
    # Every run of the preset has a job, and every job builds an LM.
    assert experiment.run_keys(preset) == {
        key for job in experiment.jobs_of(preset)
        for key in experiment.run_keys(preset, job)}
    for mixer in preset.mixers:
      config = experiment.model_config(preset, mixer, preset.d_models[0])
      nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))


def test_presets_take_dotted_overrides():
  for name, preset in experiment.PRESETS.items():
    assert experiment.Preset.from_dict(preset.to_dict()) == preset, name
    assert json.loads(json.dumps(preset.to_dict())) == preset.to_dict()
    lines = config_flags.describe(preset)
    again = dict(line[len("--config."):].split("=", 1) for line in lines)
    assert config_flags.apply_overrides(preset, again) == preset, name
  cpu = experiment.PRESETS["cpu"]
  assert "--config.settings=64:4" in config_flags.describe(cpu)
  preset = config_flags.from_preset(experiment.PRESETS, "cpu", {
      "mixers": "gla", "d_models": "64,128", "learning_rates": "1e-3,3e-3",
      "settings": "64:4,128:8", "batch_size.128": "16", "heads.gla": "1",
      "mixer_options.h3.d_state": "16", "seeds": "5", "short_conv": "false"})
  assert preset == dataclasses.replace(
      cpu, mixers=("gla",), d_models=(64, 128), learning_rates=(1e-3, 3e-3),
      settings=((64, 4), (128, 8)), batch_size=((64, 32), (128, 16)),
      heads=tuple(sorted(dict(cpu.heads, gla=1).items())), seeds=5,
      short_conv=False,
      mixer_options=tuple(sorted(
          dict(cpu.mixer_options, h3=(("d_state", 16), ("shift_size", 4))
               ).items())))
  assert preset.batch_size_for(128) == 16 and preset.heads_for("gla", 64) == 1
  assert preset.seed_list() == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("overrides, field, words", [
    ({"settings": "64:4,128"}, "settings", "must be 2 values joined by ':'"),
    ({"d_models": "64,x"}, "d_models", "'x' is not an int"),
    ({"mixers": "gla,nope"}, "mixers", "unknown mixer(s) ['nope']"),
    ({"mixers": ""}, "mixers", "unknown mixer(s) ['']"),
    ({"d_model": "64"}, "d_model", "Preset has no field 'd_model'"),
    ({"seeds": "0"}, "seeds", "seeds must be >= 1, got 0"),
])
def test_bad_overrides_name_the_field(overrides, field, words):
  with pytest.raises(config_flags.FlagError) as caught:
    config_flags.from_preset(experiment.PRESETS, "paper", overrides)
  assert str(caught.value).startswith(f"--config.{field}: ")
  assert words in str(caught.value)
  with pytest.raises(config_flags.FlagError, match="^--config: unknown "
                     "preset 'gpu'; presets: paper, gpu_subset, cpu$"):
    config_flags.from_preset(experiment.PRESETS, "gpu", {})
