"""Expert parallelism: training a model with mixture-of-experts MLPs on 8
CPU devices with an ``expert`` mesh axis (alone, and with ``data``) gives
the losses, parameters and router biases of one device."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lin_attn_jax import sharding as shd
from lin_attn_jax.data import BatchSource, PackedRows, stdlib_corpus
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig, Trainer
from tests.train import train_worker

MODEL = LMConfig(
    vocab_size=256, d_model=16, n_layers=2, n_heads=2, mixer="softmax_attn",
    mlp=("swiglu", "moe"),
    moe_options=dict(n_experts=8, top_k=2, expert_dim=8, score="sigmoid",
                     selection_bias=True, n_groups=2, topk_groups=1,
                     normalize_topk=True, routed_scale=2.0, shared_dim=8))
TRAIN = TrainConfig(batch_size=8, seq_len=16, steps=3, warmup_steps=1,
                    learning_rate=1e-2, router_aux_loss_coef=0.01,
                    router_bias_rate=1e-3)


def rel_rms(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.sqrt(np.mean((a - b) ** 2))
               / max(np.sqrt(np.mean(b ** 2)), 1e-30))


@functools.cache
def run(spec: str | None, devices: int):
  mesh = shd.make_mesh(spec, jax.devices()[:devices])
  trainer = Trainer(MODEL, TRAIN, mesh=mesh, rules="fsdp",
                    compiler_options=train_worker.FAST_COMPILE)
  state = trainer.init()
  source = BatchSource(PackedRows(stdlib_corpus("train"), TRAIN.seq_len,
                                  seed=0), TRAIN.batch_size)
  losses, aux = [], []
  for step in range(TRAIN.steps):
    state, metrics = trainer.step(state, source.batch(step))
    losses.append(float(metrics["loss"]))
    aux.append(float(metrics["router_aux_loss"]))
  moe = state.params["blocks"][1]["mlp"]
  layout = {name: (moe[name].get_value().sharding.spec,
                   shd.per_device_bytes(moe[name].get_value()))
            for name in ("gate", "up", "down")}
  return (np.array(losses), np.array(aux), jax.device_get(state.params),
          jax.device_get(state.rest), layout)


@pytest.mark.parametrize("spec, parts", [
    ("data=2,expert=4", 4),
    pytest.param("expert=8", 8, marks=pytest.mark.slow)])
def test_expert_parallel_training_equals_one_device(spec, parts):
  losses, aux, params, rest, layout = run(spec, 8)
  ref_losses, ref_aux, ref_params, ref_rest, ref_layout = run(None, 1)
  assert rel_rms(losses, ref_losses) < 1e-5
  assert rel_rms(aux, ref_aux) < 1e-5 and np.all(aux > 0)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    assert rel_rms(a, b) < 1e-5
  bias = rest["blocks"][1]["mlp"]["selection_bias"].get_value()
  ref_bias = ref_rest["blocks"][1]["mlp"]["selection_bias"].get_value()
  np.testing.assert_allclose(bias, ref_bias, atol=1e-7)
  # Three steps of +-rate moved every bias.
  assert np.all(np.abs(ref_bias) > 0)
  for name, (spec_of, nbytes) in layout.items():
    assert spec_of == P("expert", None, None), name
    assert nbytes * parts == ref_layout[name][1], name


@pytest.mark.slow
def test_micro_batches_sum_the_expert_loads():
  """With grad_accum the balancing sees the loads of the whole batch (the
  aux loss, not linear in the batch, is off here)."""
  results = []
  for accum in (1, 2):
    train = TrainConfig(**{**TRAIN.to_dict(), "grad_accum": accum,
                           "steps": 2, "router_aux_loss_coef": 0.0})
    trainer = Trainer(MODEL, train, mesh=shd.make_mesh(
        None, jax.devices()[:1]), compiler_options=train_worker.FAST_COMPILE)
    state = trainer.init()
    source = BatchSource(PackedRows(stdlib_corpus("train"), train.seq_len,
                                    seed=0), train.batch_size)
    for step in range(train.steps):
      state, metrics = trainer.step(state, source.batch(step))
    results.append((float(metrics["loss"]), jax.device_get(state.rest)))
  assert abs(results[0][0] - results[1][0]) < 1e-5 * abs(results[0][0])
  bias = [r["blocks"][1]["mlp"]["selection_bias"].get_value()
          for _, r in results]
  np.testing.assert_allclose(bias[0], bias[1], atol=1e-7)
  assert np.any(bias[0] != 0)
