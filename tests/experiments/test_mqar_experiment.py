"""experiments/mqar.py: a tiny attention LM learns MQAR (64 tokens, 4
pairs) to the early-stopping accuracy, and the report is written; the
presets take ``--config.<field>`` overrides and a bad one names its
field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments import config_flags
from experiments import mqar as experiment
from lin_attn_jax.data.mqar import IGNORE_INDEX

TINY = dataclasses.replace(
    experiment.PRESETS["cpu"], mixers=("softmax_attn",), d_models=(64,),
    learning_rates=(3e-3,), settings=((64, 4),), num_train=32_000,
    num_test=256, eval_every=100)


def test_batches_weigh_only_the_queries():
  data = experiment.mqar_data(TINY, 64, 4)
  batch = experiment.to_batch(data.train_inputs[:8], data.train_targets[:8])
  queries = data.train_targets[:8] != IGNORE_INDEX
  np.testing.assert_array_equal(batch["weights"], queries)
  assert batch["weights"].sum() == 8 * 4
  assert (batch["targets"][~queries] == 0).all()


def test_attention_learns_mqar(tmp_path):
  records = experiment.run_grid(TINY, str(tmp_path / "runs.jsonl"))
  (record,) = records
  assert record["accuracy"] >= TINY.early_stop, record["history"]
  assert record["state_size"] == 2 * 64 * 64
  table = experiment.table(TINY, records)
  assert "| softmax_attn | 64 | 1 | 8,192 |" in table
  # A second call finds the run done and trains nothing.
  assert experiment.run_grid(TINY, str(tmp_path / "runs.jsonl")) == records


def test_presets_take_dotted_overrides():
  for name, preset in experiment.PRESETS.items():
    assert experiment.Preset.from_dict(preset.to_dict()) == preset, name
    lines = config_flags.describe(preset)
    again = dict(line[len("--config."):].split("=", 1) for line in lines)
    assert config_flags.apply_overrides(preset, again) == preset, name
  cpu = experiment.PRESETS["cpu"]
  assert "--config.settings=64:4,64:8,64:16" in config_flags.describe(cpu)
  preset = config_flags.from_preset(experiment.PRESETS, "cpu", {
      "mixers": "gla", "d_models": "64,128", "learning_rates": "1e-3,3e-3",
      "settings": "64:4,128:8", "batch_size.128": "16", "heads.gla": "2",
      "mixer_options.h3.d_state": "16"})
  assert preset == dataclasses.replace(
      cpu, mixers=("gla",), d_models=(64, 128), learning_rates=(1e-3, 3e-3),
      settings=((64, 4), (128, 8)), batch_size=((64, 32), (128, 16)),
      heads=(("gla", 2), ("h3", -2)),
      mixer_options=tuple(sorted(
          dict(cpu.mixer_options, h3=(("d_state", 16), ("shift_size", 4))
               ).items())))
  assert preset.batch_size_for(128) == 16 and preset.heads_for("gla", 64) == 2


@pytest.mark.parametrize("overrides, field, words", [
    ({"settings": "64:4,128"}, "settings", "must be 2 values joined by ':'"),
    ({"d_models": "64,x"}, "d_models", "'x' is not an int"),
    ({"mixers": "gla,nope"}, "mixers", "unknown mixer(s) ['nope']"),
    ({"mixers": ""}, "mixers", "unknown mixer(s) ['']"),
    ({"d_model": "64"}, "d_model", "Preset has no field 'd_model'"),
])
def test_bad_overrides_name_the_field(overrides, field, words):
  with pytest.raises(config_flags.FlagError) as caught:
    config_flags.from_preset(experiment.PRESETS, "paper", overrides)
  assert str(caught.value).startswith(f"--config.{field}: ")
  assert words in str(caught.value)
  with pytest.raises(config_flags.FlagError, match="^--config: unknown "
                     "preset 'gpu'; presets: paper, cpu$"):
    config_flags.from_preset(experiment.PRESETS, "gpu", {})
