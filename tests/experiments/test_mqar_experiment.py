"""experiments/mqar.py: a tiny attention LM learns MQAR (64 tokens, 4
pairs) to the early-stopping accuracy, and the report is written."""

from __future__ import annotations

import dataclasses

import numpy as np

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
