"""experiments/lra.py: the cpu preset's grid runs end to end on a stub of
one tiny job (2 steps), a rerun skips it, the report holds our accuracy
beside the paper's; the presets cover the variants the grid promises, and
a bad override names its field."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from experiments import config_flags
from experiments import lra as experiment
from lin_attn_jax.feature_maps import FEATURE_MAPS
from lin_attn_jax.layers import MIXERS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CPU = experiment.PRESETS["cpu"]
STUB = dataclasses.replace(
    CPU, mixers=("linear_attn",), tasks=("listops",),
    listops=dataclasses.replace(CPU.listops, seq_len=32, steps=2,
                                batch_size=4, warmup_steps=1, num_train=8,
                                num_test=8))


def test_cpu_preset_stub_runs_end_to_end(tmp_path):
  results = str(tmp_path / "lra_stub.jsonl")
  records = experiment.run_grid(STUB, results, log=lambda _: None,
                                data_dir=str(tmp_path / "data"))
  (record,) = records
  assert (record["task"], record["mixer"], record["steps"]) == (
      "listops", "linear_attn", 2)
  assert 0 <= record["accuracy"] <= 1 and len(record["history"]) == 2
  assert sorted(os.listdir(tmp_path / "data")) == [
      "listops_T32_seed0_test8.npz", "listops_T32_seed0_train8.npz"]
  assert experiment.run_grid(STUB, results, log=lambda _: None) == records
  train, _ = experiment.datasets(STUB, "listops", 0)
  cached, _ = experiment.cached_datasets(STUB, "listops", 0,
                                         str(tmp_path / "data"))
  fresh, stored = train.batch([3, 5]), cached.batch([3, 5])
  for key in ("inputs", "segment_ids", "labels"):
    assert (fresh[key] == stored[key]).all()
  stem = str(tmp_path / "lra_stub")
  plotted = experiment.write_report("cpu", STUB, records, stem, "cmd")
  text = open(stem + ".md").read()
  assert "| linear_attn | " in text and "16.13 (Linear Trans.)" in text
  assert "5,000 steps of 32" in text
  assert plotted == os.path.exists(stem + ".png")


def test_presets_cover_the_grid():
  for name in ("softmax_attn", "linear_attn", "performer", "linformer",
               "retnet", "gla", "mamba2", "focused_linear_attn"):
    assert name in CPU.mixers
  assert "focused" in FEATURE_MAPS
  assert CPU.tasks == ("listops", "pathfinder32")
  assert CPU.pathfinder32.seq_len == 1024 and CPU.listops.seq_len <= 512
  paper = experiment.PRESETS["lra"]
  assert (paper.listops.n_layers, paper.listops.d_model,
          paper.listops.steps, paper.listops.batch_size) == (6, 512, 5000,
                                                             32)
  for variant in CPU.mixers:
    layer, _ = experiment.VARIANTS[variant]
    assert layer in MIXERS
    for task in CPU.tasks:
      config = experiment.model_config(CPU, task, variant)
      assert config.num_classes == (10 if task == "listops" else 2)
  linformer = experiment.model_config(paper, "listops", "linformer")
  assert linformer.options_for("linformer")["max_len"] == 2000


def test_bad_override_names_the_field():
  with pytest.raises(config_flags.FlagError, match="config.mixers"):
    config_flags.from_preset(experiment.PRESETS, "cpu",
                             {"mixers": "nope"})
  done = subprocess.run(
      [sys.executable, "-m", "experiments.lra", "--config=cpu",
       "--config.pathfinder32.seq_len=64"], capture_output=True, text=True,
      timeout=300, cwd=ROOT)
  assert done.returncode == 2 and "must be 1024" in done.stderr
