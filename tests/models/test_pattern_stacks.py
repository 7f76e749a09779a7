"""LMConfig's per-layer MLP kinds, mixture-of-experts options and
multipliers: the default stack is unchanged, patterns build the blocks they
name, the aux outputs and decoding work with experts."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers.moe import MoE
from lin_attn_jax.models.lm import LM, LMConfig, SquaredReLUMLP, SwiGLU
from lin_attn_jax.train import TrainConfig, Trainer
from lin_attn_jax import sharding as shd

MOE = dict(n_experts=4, top_k=2, expert_dim=8, normalize_topk=True,
           shared_dim=4, shared_gate=True)
BASE = dict(vocab_size=32, d_model=16, n_layers=4, n_heads=2,
            mixer="softmax_attn")


def test_the_default_mlp_is_swiglu_in_every_layer():
  config = LMConfig(**BASE)
  assert config.layer_mlps == ("swiglu",) * 4 and config.n_experts is None
  tuple_config = LMConfig(**BASE, mlp=("swiglu",))
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 32
  a, b = (LM(c, rngs=nnx.Rngs(0)) for c in (config, tuple_config))
  leaves = jax.tree.leaves(nnx.state(a, nnx.Param))
  assert all(np.array_equal(x, y) for x, y in zip(
      leaves, jax.tree.leaves(nnx.state(b, nnx.Param))))
  run = nnx.jit(lambda lm, tokens: (lm(tokens), lm(tokens, return_aux=True)))
  plain, (logits, aux) = run(a, tokens)
  np.testing.assert_array_equal(run(b, tokens)[0], plain)
  np.testing.assert_array_equal(logits, plain)
  assert float(aux["load_balancing_loss"]) == 0.0
  assert aux["expert_load"].shape == (0, 0)


def test_a_pattern_builds_the_blocks_it_names():
  config = LMConfig(**BASE, mlp=("moe", "swiglu", "none", "geglu"),
                    moe_options=MOE)
  lm = LM(config, rngs=nnx.Rngs(0))
  kinds = [type(block.mlp) for block in lm.blocks]
  assert kinds == [MoE, SwiGLU, type(None), SwiGLU]
  assert lm.blocks[2].mlp_norm is None
  assert lm.blocks[3].mlp.activation == "gelu"
  assert config.n_experts == 4
  repeated = LMConfig(**BASE, mlp=("swiglu", "moe"), moe_options=MOE)
  assert repeated.layer_mlps == ("swiglu", "moe") * 2


def test_the_config_round_trips_through_json():
  config = LMConfig(**{**BASE, "n_layers": 2}, mlp=("swiglu", "moe"), moe_options=MOE,
                    multipliers={"logits": 0.5, "mlp_out": 2.0})
  text = json.dumps(config.to_dict())
  assert LMConfig.from_dict(json.loads(text)) == config
  assert hash(config) == hash(LMConfig.from_dict(json.loads(text)))
  old = LMConfig(**BASE).to_dict()
  for name in ("moe_options", "multipliers"):
    del old[name]
  assert LMConfig.from_dict(old) == LMConfig(**BASE)


@pytest.mark.parametrize("kw, match", [
    (dict(mlp="mixture"), r"mlp must be one of .* got \['mixture'\]"),
    (dict(mlp=("swiglu",) * 3), "mlp has 3 kinds, which does not divide"),
    (dict(mlp="moe"), r"mlp 'moe' needs moe_options \['expert_dim', "
     r"'n_experts', 'top_k'\]"),
    (dict(moe_options={"experts": 4}), r"unknown moe_options \['experts'\]"),
    (dict(multipliers={"attention": 2.0}), "unknown multiplier 'attention'"),
    (dict(multipliers={"logits": "2"}), "must be a number"),
    (dict(mixer=("none", "softmax_attn"), mlp=("none", "swiglu")),
     r"layers \[0, 2\] have mixer 'none' and mlp 'none'"),
    (dict(multipliers={"logits": (1.0, 2.0)}), "must be a number"),
    (dict(multipliers={"mixer_out": (1.0,) * 3}),
     "multiplier 'mixer_out' has 3 values, which does not divide"),
])
def test_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    LMConfig(**{**BASE, **kw})


def test_multipliers_scale_the_logits_and_the_residual_terms():
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 32
  plain = LM(LMConfig(**BASE), rngs=nnx.Rngs(0))
  scaled = LM(LMConfig(**BASE, multipliers={"logits": 3.0}),
              rngs=nnx.Rngs(0))
  forward = nnx.jit(lambda lm, tokens: lm(tokens))
  np.testing.assert_allclose(forward(scaled, tokens),
                             3.0 * forward(plain, tokens), rtol=1e-6)
  residual = LM(LMConfig(**BASE, multipliers={"mixer_out": 0.0,
                                              "mlp_out": 0.0}),
                rngs=nnx.Rngs(0))
  # With both terms off the blocks pass the embeddings through.
  x = residual.final_norm(residual.embed(tokens))
  np.testing.assert_allclose(residual(tokens), residual.embed.attend(x),
                             rtol=1e-6)


def test_per_layer_multipliers_and_residuals_from_the_norms():
  """MiniMax's blocks: ``x <- a_l norm(x) + b_l mixer(norm(x))``, then the
  same with the MLP, ``a`` and ``b`` per layer; the config round-trips."""
  config = LMConfig(**{**BASE, "n_layers": 2}, residual_from_norm=True,
                    multipliers={"mixer_residual": (1.5, 0.5),
                                 "mixer_out": (2.0, 0.25),
                                 "mlp_residual": 1.2, "mlp_out": 0.8})
  assert config.multiplier("mixer_out", 1) == 0.25
  assert config.multiplier("mlp_out", 1) == 0.8
  assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
  lm = LM(config, rngs=nnx.Rngs(0))
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 32
  x = lm.embed(tokens)
  for block, a, b in zip(lm.blocks, (1.5, 0.5), (2.0, 0.25)):
    h = block.mixer_norm(x)
    x = a * h + b * block.mixer(h)
    h = block.mlp_norm(x)
    x = 1.2 * h + 0.8 * block.mlp(h)
  np.testing.assert_allclose(lm(tokens), lm.embed.attend(lm.final_norm(x)),
                             rtol=1e-5, atol=1e-6)


def test_a_mixer_kind_may_have_heads_of_its_own():
  base = {**BASE, "n_layers": 2, "mixer": ("softmax_attn", "gla")}
  lm = LM(LMConfig(**base, mixer_options={"softmax_attn": {"n_heads": 4,
                                                           "head_dim": 8}}),
          rngs=nnx.Rngs(0))
  assert lm.blocks[0].mixer.n_heads == 4 and lm.blocks[1].mixer.n_heads == 2


def test_moe_model_decodes_as_its_full_forward():
  config = LMConfig(**{**BASE, "n_layers": 2}, mlp=("swiglu", "moe"),
                    moe_options={**MOE, "score": "sigmoid",
                                 "selection_bias": True, "n_groups": 2,
                                 "topk_groups": 1, "routed_scale": 1.5})
  lm = LM(config, rngs=nnx.Rngs(1))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 7)),
                       jnp.int32)
  graphdef, state = nnx.split(lm)
  full, aux = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(
      tokens, return_aux=True))(state, tokens)
  assert aux["expert_load"].shape == (1, 4)
  np.testing.assert_allclose(aux["expert_load"].sum(1), 2 * 7 * 2)
  call = jax.jit(lambda state, tokens, cache: nnx.merge(graphdef, state)(
      tokens, cache=cache))
  first, cache = call(state, tokens[:, :5], lm.init_cache(2, 7))
  steps = [first]
  for i in range(5, 7):
    logits, cache = call(state, tokens[:, i:i + 1], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=1e-5,
                             atol=1e-5)


def test_checkpoints_of_configs_before_moe_restore():
  config = LMConfig(**BASE)
  trainer = Trainer(config, TrainConfig(batch_size=8, seq_len=8),
                    mesh=shd.make_mesh("data=1", jax.devices()[:1]))
  record = trainer.config_record()
  for name in ("moe_options", "multipliers"):
    del record["model"][name]
  trainer.check_stored_config(record)
  record["model"]["mlp"] = "geglu"
  with pytest.raises(ValueError, match="another model"):
    trainer.check_stored_config(record)


def test_mlp_only_blocks_relu2_gate_multiplier_and_mixer_heads():
  """Nemotron-H's pieces: a block without a mixer (``x + mlp(norm(x))``,
  no mixer norm, an empty cache), the squared-ReLU MLP, a mixer with a head
  count of its own; Falcon-H1's gate multiplier."""
  config = LMConfig(**{**BASE, "n_layers": 3,
                       "mixer": ("none", "softmax_attn", "mamba2")},
                    mlp=("relu2", "swiglu", "none"),
                    mixer_options={"mamba2": {"n_heads": 4, "head_dim": 8,
                                              "d_state": 4, "chunk_size": 4}},
                    multipliers={"mlp_gate": 0.5})
  lm = LM(config, rngs=nnx.Rngs(0))
  first = lm.blocks[0]
  assert first.mixer is None and first.mixer_norm is None
  assert isinstance(first.mlp, SquaredReLUMLP)
  assert lm.blocks[2].mixer.n_heads == 4 and lm.blocks[1].mixer.n_heads == 2
  x = jax.random.normal(jax.random.key(0), (2, 6, 16))
  y, cache, _ = first(x, segment_ids=None, mode="chunk", cache={})
  hidden = jax.nn.relu(first.mlp_norm(x) @ first.mlp.up.kernel[...])
  np.testing.assert_allclose(y, x + (hidden ** 2) @ first.mlp.down.kernel[...],
                             rtol=1e-5, atol=1e-6)
  assert cache == {}
  mlp = lm.blocks[1].mlp
  assert mlp.gate_scale == 0.5
  gate = 0.5 * (x @ mlp.gate.kernel[...])
  np.testing.assert_allclose(
      mlp(x), (jax.nn.silu(gate) * (x @ mlp.up.kernel[...]))
      @ mlp.down.kernel[...], rtol=1e-5, atol=1e-6)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 7)),
                       jnp.int32)
  graphdef, state = nnx.split(lm)
  call = jax.jit(lambda state, tokens, cache: nnx.merge(graphdef, state)(
      tokens, cache=cache))
  full = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))(
      state, tokens)
  first_logits, cache = call(state, tokens[:, :5], lm.init_cache(2, 7))
  steps = [first_logits]
  for i in range(5, 7):
    logits, cache = call(state, tokens[:, i:i + 1], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=1e-5,
                             atol=1e-5)
  assert lm.generate(tokens[:, :3], 2).shape == (2, 5)
