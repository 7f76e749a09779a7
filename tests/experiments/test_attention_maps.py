"""experiments.attention_maps end to end on fresh tiny models: the per-layer
matrices are those of the LM's own layers, the report and the figures are
written, and the sparsity of a softmax model follows its matrices."""

from __future__ import annotations

import json
import os

import numpy as np
from flax import nnx

from experiments import attention_maps
from lin_attn_jax.analysis import row_sparsity
from lin_attn_jax.models.checkpoints import save_params
from lin_attn_jax.models.lm import LM, LMConfig


def tiny_model_dir(root, mixer):
  config = LMConfig(vocab_size=256, d_model=16, n_layers=2, n_heads=2,
                    mixer=mixer)
  path = os.path.join(root, mixer)
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config.to_dict(), f)
  save_params(os.path.join(path, "params"), LM(config, rngs=nnx.Rngs(3)))
  return path


def test_layer_matrices_reproduce_the_model(tmp_path):
  path = tiny_model_dir(str(tmp_path), "softmax_attn")
  model, _ = attention_maps.load_model(path)
  tokens = attention_maps.heldout_windows(16, 2, seed=0)
  assert tokens.shape == (2, 16)
  matrices = attention_maps.layer_matrices(model, tokens)
  assert len(matrices) == 2 and matrices[0].shape == (2, 2, 16, 16)
  np.testing.assert_allclose(matrices[1].sum(-1), 1.0, atol=1e-5)
  # Layer 1's matrix depends on layer 0's output: the two differ.
  assert np.max(np.abs(matrices[1] - matrices[0])) > 1e-3


def test_report_and_figures(tmp_path):
  paths = [tiny_model_dir(str(tmp_path), m) for m in ("softmax_attn", "gla")]
  out_dir = str(tmp_path / "out")
  config = attention_maps.Maps(workdirs=tuple(paths), seq_len=16, windows=2,
                               min_keys=4, out_dir=out_dir)
  results = attention_maps.run(config, "cmd")
  softmax = results[0]
  expected = np.nanmean(row_sparsity(softmax["matrices"][0], min_keys=4),
                        axis=(0, 2))
  np.testing.assert_allclose(softmax["layers"][0]["measured"], expected)
  assert np.all((expected > 0) & (expected <= 1))
  report = open(os.path.join(out_dir, "table.md")).read()
  assert "| softmax_attn | 1 | softmax_attn | 1 |" in report
  assert "| gla | 0 | gla | 0 |" in report
  for name in ("maps_softmax_attn.png", "maps_gla.png", "sparsity.png"):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0
