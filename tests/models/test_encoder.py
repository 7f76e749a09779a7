"""Encoders: bidirectional blocks, pooling that ignores padding, the
classifier and the ViT trained on 1 and 8 devices alike, the masked LM's
loss falling on the standard-library corpus, BERT's masking."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax import sharding as shd
from lin_attn_jax.data import BatchSource, PackedRows, stdlib_corpus
from lin_attn_jax.data.tasks import (ExampleRows, MaskedRows,
                                     SyntheticClassification, mask_tokens)
from lin_attn_jax.models.encoder import (Classifier, ClassifierConfig,
                                         Encoder, EncoderConfig, MLMConfig,
                                         ViT, ViTConfig, sincos_2d)
from lin_attn_jax.train import TrainConfig, Trainer

FAST = {"xla_backend_optimization_level": 0}
SMALL = dict(d_model=16, n_heads=2, mixer_options={
    "gla": {"chunk_size": 8}, "mamba2": {"chunk_size": 8}})


@pytest.mark.parametrize("mixer", ["gla", "softmax_attn", "mamba2"])
def test_encoder_is_bidirectional(mixer):
  """Changing the last token changes the first token's output; a causal
  LM of the same blocks leaves it alone (the check can fail)."""
  config = EncoderConfig(vocab_size=16, n_layers=1, mixer=mixer, **SMALL)
  encoder = Encoder(config, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, 16)
  changed = tokens.at[0, -1].set((tokens[0, -1] + 1) % 16)
  run = nnx.jit(lambda m, t: m(t))
  first, second = run(encoder, tokens), run(encoder, changed)
  assert float(jnp.max(jnp.abs(first[0, 0] - second[0, 0]))) > 1e-4


def test_mixer_without_non_causal_form_is_refused():
  with pytest.raises(ValueError, match="'deltanet' has no non-causal form"):
    EncoderConfig(mixer=("gla", "deltanet"), n_layers=2)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_does_not_change_pooled_output(pooling):
  config = ClassifierConfig(vocab_size=16, n_layers=2,
                            mixer=("gla", "softmax_attn"), num_classes=3,
                            pooling=pooling, **SMALL)
  model = Classifier(config, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(2), (2, 9), 1, 16)
  padded = jnp.concatenate(
      [tokens, jax.random.randint(jax.random.key(3), (2, 6), 0, 16)], axis=1)
  segments = jnp.concatenate([jnp.ones((2, 9), jnp.int32),
                              jnp.zeros((2, 6), jnp.int32)], axis=1)
  run = nnx.jit(lambda m, t, s: m(t, segment_ids=s))
  short = run(model, tokens, jnp.ones((2, 9), jnp.int32))
  long = run(model, padded, segments)
  np.testing.assert_allclose(long, short, atol=2e-5, rtol=2e-5)
  # Without the segment ids the padding is read: the check can fail.
  unmasked = run(model, padded, jnp.ones((2, 15), jnp.int32))
  assert float(jnp.max(jnp.abs(unmasked - short))) > 1e-4


def test_sincos_2d_codes_rows_and_columns():
  table = sincos_2d(4, 8)                                       # [16, 8]
  assert table.shape == (16, 8)
  # Patches of one row share the first half; of one column the second.
  np.testing.assert_array_equal(table[0, :4], table[3, :4])
  np.testing.assert_array_equal(table[0, 4:], table[12, 4:])
  assert not np.allclose(table[0, :4], table[4, :4])


def test_mask_tokens_follows_bert():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 100, (64, 512)).astype(np.int32)
  segments = np.ones_like(tokens)
  segments[:, 400:] = 0
  out = mask_tokens(tokens, segments, rng, vocab_size=100, mask_id=100)
  chosen = out["weights"] > 0
  assert not chosen[:, 400:].any()
  assert abs(chosen[:, :400].mean() - 0.15) < 0.01
  np.testing.assert_array_equal(out["targets"], tokens)
  np.testing.assert_array_equal(out["inputs"][~chosen], tokens[~chosen])
  masked = (out["inputs"] == 100)[chosen].mean()
  kept = (out["inputs"] == tokens)[chosen].mean()
  assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1 - 0.01) < 0.02


def _classify_setup():
  model = ClassifierConfig(vocab_size=16, n_layers=2,
                           mixer=("gla", "softmax_attn"), num_classes=4,
                           **SMALL)
  rows = ExampleRows(SyntheticClassification(64, seq_len=16), seed=0)
  return model, rows


def _vit_setup():
  model = ViTConfig(n_layers=1, mixer="mamba2", image_size=8, patch_size=2,
                    num_classes=4, positions="learned", **SMALL)
  rows = ExampleRows(SyntheticClassification(64, seq_len=64), images=True)
  return model, rows


SETUPS = {"classify": _classify_setup, "vit": _vit_setup}
RULES = {"fsdp=1": "fsdp", "data=8": "dp", "fsdp=8": "fsdp"}


@functools.cache
def _trained(setup: str, spec: str, steps: int = 3):
  model, rows = SETUPS[setup]()
  train = TrainConfig(batch_size=8, seq_len=rows.row_len, steps=steps,
                      warmup_steps=1, learning_rate=1e-2)
  devices = 1 if spec == "fsdp=1" else 8
  trainer = Trainer(model, train, mesh=shd.make_mesh(
      spec, jax.devices()[:devices]), rules=RULES[spec],
      compiler_options=FAST)
  state = trainer.init()
  source = BatchSource(rows, train.batch_size)
  losses = []
  for step in range(steps):
    state, metrics = trainer.step(state, source.batch(step))
    losses.append(float(metrics["loss"]))
  return np.array(losses), jax.device_get(state.params), trainer, state


def check_8_devices_equal_1(setup: str, spec: str):
  """Losses and parameters after three steps on ``spec`` (8 devices)
  equal one device's."""
  losses, params, _, _ = _trained(setup, "fsdp=1")
  assert np.all(np.isfinite(losses))
  other, other_params, trainer, state = _trained(setup, spec)
  np.testing.assert_allclose(other, losses, rtol=1e-5, err_msg=spec)
  for a, b in zip(jax.tree.leaves(other_params), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=spec)
  sums = trainer.eval_sums(state, BatchSource(
      SETUPS[setup]()[1], 8).batch(0))
  assert float(sums["tokens"]) == 8 and 0 <= float(sums["correct"]) <= 8


# The ViT in the slow suite (with the data-parallel runs below).
@pytest.mark.parametrize("setup", [
    "classify", pytest.param("vit", marks=pytest.mark.slow)])
def test_classifier_and_vit_train_alike_on_1_and_8_devices(setup):
  check_8_devices_equal_1(setup, "fsdp=8")


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["classify", "vit"])
def test_classifier_and_vit_data_parallel_equal_1_device(setup):
  check_8_devices_equal_1(setup, "data=8")


def test_vit_checks_its_images():
  model = ViT(ViTConfig(n_layers=1, mixer="gla", image_size=8, patch_size=2,
                        **SMALL), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\(H, W, C\) = \(8, 8, 1\)"):
    model(jnp.zeros((1, 8, 4, 1)))


def test_masked_lm_loss_falls_on_the_stdlib_corpus():
  model = MLMConfig(vocab_size=256, n_layers=2, mixer="gla", max_len=32,
                    **SMALL)
  train = TrainConfig(batch_size=8, seq_len=32, steps=40, warmup_steps=4,
                      learning_rate=1e-2)
  rows = MaskedRows(PackedRows(stdlib_corpus("train"), 32, seed=0),
                    vocab_size=256)
  trainer = Trainer(model, train, mesh=shd.make_mesh(
      "fsdp=1", jax.devices()[:1]), compiler_options=FAST)
  state = trainer.init()
  source = BatchSource(rows, train.batch_size)
  losses = []
  for step in range(train.steps):
    batch = source.batch(step)
    assert batch["inputs"].max() <= 256 and (batch["weights"] > 0).any()
    state, metrics = trainer.step(state, batch)
    losses.append(float(metrics["loss"]))
  assert np.mean(losses[-8:]) < losses[0] - 1.0, losses


def test_linformer_classifier_reads_rows_without_segment_ids():
  """Linformer takes no segment_ids: its classifier's batches have none
  (padding read as tokens), and a step trains."""
  model = ClassifierConfig(vocab_size=16, n_layers=1, mixer="linformer",
                           mixer_options={"linformer": {"max_len": 16}},
                           num_classes=4, max_len=16, d_model=16, n_heads=2)
  train = TrainConfig(batch_size=4, seq_len=16, steps=1, warmup_steps=1)
  trainer = Trainer(model, train, mesh=shd.make_mesh(
      "fsdp=1", jax.devices()[:1]), compiler_options=FAST)
  assert set(trainer.batch_shapes) == {"inputs", "targets", "weights"}
  rows = ExampleRows(SyntheticClassification(8, seq_len=16))
  _, metrics = trainer.step(trainer.init(), rows.batch(range(4)))
  assert np.isfinite(float(metrics["loss"]))
  gla = Trainer(ClassifierConfig(vocab_size=16, n_layers=1, mixer="gla",
                                 num_classes=4, max_len=16, **SMALL),
                train, mesh=trainer.mesh)
  assert "segment_ids" in gla.batch_shapes
