"""The decoder LM: config, generation, checkpoints and the Linen bridge."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx import bridge

from lin_attn_jax.layers import GLA, MIXERS
from lin_attn_jax.models import LM, LMConfig, Sampling
from lin_attn_jax.models import lm as lm_module
from lin_attn_jax.models.checkpoints import restore_params, save_params
from lin_attn_jax.testing import lm_checks
from lin_attn_jax.testing import rel_rms

ISSUE_MIXERS = ("softmax_attn", "sliding_window_attn", "sparse_attn",
                "linformer", "linear_attn", "performer", "based", "retnet",
                "gla", "hgrn2", "mamba", "mamba2", "h3", "rg_lru", "rwkv6",
                "rwkv7", "deltanet", "gated_deltanet", "kda")


def test_every_mixer_is_registered():
  assert set(ISSUE_MIXERS) <= set(MIXERS), sorted(set(ISSUE_MIXERS)
                                                   - set(MIXERS))


def test_config_errors():
  with pytest.raises(ValueError, match="unknown mixer"):
    LMConfig(mixer="flash")
  with pytest.raises(ValueError, match="does not divide"):
    LMConfig(n_layers=4, mixer=("gla", "gla", "gla")).layer_mixers
  with pytest.raises(ValueError, match="d_model"):
    LMConfig(d_model=0)
  config = LMConfig(n_layers=8, mixer=("gla", "gla", "gla", "softmax_attn"),
                    mixer_options={"gla": {"chunk_size": 32}})
  assert config.layer_mixers == ("gla", "gla", "gla", "softmax_attn") * 2
  assert config.options_for("gla") == {"chunk_size": 32}
  hash(config)


def test_lm_errors():
  lm = lm_checks.tiny_lm("gla", {"chunk_size": 8})
  with pytest.raises(ValueError, match="tokens must be integer"):
    lm(jnp.zeros((1, 4)))
  with pytest.raises(ValueError, match="mode"):
    lm(jnp.zeros((1, 4), jnp.int32), mode="fast")
  with pytest.raises(ValueError, match="cache has 1 layers"):
    lm(jnp.zeros((1, 4), jnp.int32), cache=lm.init_cache(1, 8)[:1])
  with pytest.raises(ValueError, match="rng"):
    lm.generate(jnp.zeros((1, 4), jnp.int32), 3, temperature=1.0)
  with pytest.raises(ValueError, match="top_p"):
    Sampling(1.0, None, 1.5)


def test_untied_embeddings_have_a_head():
  lm = lm_checks.tiny_lm("gla", {"chunk_size": 8}, tie_embeddings=False)
  assert lm.lm_head is not None
  lm_checks.check_gradients(lm, use_segments=False)


def test_greedy_generation_follows_the_full_forward():
  lm = lm_checks.tiny_lm("gla", {"chunk_size": 8})
  prompt = lm_checks.tokens(length=7)
  out = lm.generate(prompt, 9)
  assert out.shape == (2, 16) and np.array_equal(out[:, :7], prompt)
  logits = nnx.jit(lambda lm, x: lm(x))(lm, out[:, :-1])
  np.testing.assert_array_equal(np.argmax(logits[:, 6:], -1), out[:, 7:])
  # Compiled once per shape and setting: a second call reuses the program.
  size = lm_module._generate._cache_size()
  lm.generate(prompt, 9)
  assert lm_module._generate._cache_size() == size


def test_sampling_limits():
  logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0]] * 2000)
  keys = jax.random.key(0)
  assert np.all(Sampling(1.0, 1)(logits, keys) == 1)
  picked = np.asarray(Sampling(1.0, 2)(logits, keys))
  assert set(np.unique(picked)) == {1, 3}
  # top_p=0.5: token 1 alone has 0.64 of the mass.
  assert np.all(Sampling(1.0, None, 0.5)(logits, keys) == 1)
  freq = np.bincount(np.asarray(Sampling(1.0)(logits, keys)), minlength=4)
  expected = np.asarray(jax.nn.softmax(logits[0])) * 2000
  assert np.all(np.abs(freq - expected) < 5 * np.sqrt(expected) + 5)


def test_checkpoint_round_trip(tmp_path):
  source = lm_checks.tiny_lm("gla", {"chunk_size": 8}, seed=0)
  target = lm_checks.tiny_lm("gla", {"chunk_size": 8}, seed=1)
  toks = lm_checks.tokens()
  forward = nnx.jit(lambda lm, t: lm(t))
  assert rel_rms(forward(target, toks), forward(source, toks)) > 0.1
  save_params(str(tmp_path / "ckpt"), source)
  restore_params(str(tmp_path / "ckpt"), target)
  np.testing.assert_array_equal(forward(target, toks), forward(source, toks))
  wider = lm_checks.tiny_lm("gla", {"chunk_size": 8}, d_model=48)
  with pytest.raises(ValueError, match="does not fit"):
    restore_params(str(tmp_path / "ckpt"), wider)


def test_checkpoint_round_trip_past_ten_layers(tmp_path):
  """Stored keys are strings ("10" sorts before "2"): every layer's
  parameters must come back to that layer."""
  config = LMConfig(vocab_size=32, d_model=8, n_layers=12, n_heads=2,
                    mixer="gla", mixer_options={"gla": {"chunk_size": 8}})
  source, target = (LM(config, rngs=nnx.Rngs(seed)) for seed in (0, 1))
  save_params(str(tmp_path / "ckpt"), source)
  restore_params(str(tmp_path / "ckpt"), target)
  for a, b in zip(jax.tree.leaves(nnx.state(source, nnx.Param)),
                  jax.tree.leaves(nnx.state(target, nnx.Param))):
    np.testing.assert_array_equal(a, b)


class _LinenModel(nn.Module):
  """A Linen model with a GLA layer inside, through ``nnx.bridge``."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(32)(x)
    return h + bridge.to_linen(GLA, 32, 2, chunk_size=8, name="gla")(h)


def test_linen_bridge_matches_the_nnx_layer():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 20, 8)),
                  jnp.float32)
  model = _LinenModel()
  variables = jax.jit(model.init)(jax.random.key(0), x)
  y = jax.jit(model.apply)(variables, x)
  params = nn.meta.unbox(variables["params"])
  layer = GLA(32, 2, chunk_size=8, rngs=nnx.Rngs(5))
  state = nnx.state(layer, nnx.Param)
  nnx.replace_by_pure_dict(state, params["gla"])
  nnx.update(layer, state)
  h = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
  assert rel_rms(y, h + nnx.jit(lambda m, h: m(h))(layer, h)) < 1e-6
  grads = jax.jit(jax.grad(
      lambda p: jnp.sum(model.apply({"params": p}, x) ** 2)))(
          variables["params"])
  assert all(np.any(np.asarray(g) != 0) for g in
             jax.tree.leaves(nn.meta.unbox(grads)))


def test_depth_dependent_inits_see_their_layer():
  from lin_attn_jax.layers import RWKV6
  lm = LM(LMConfig(vocab_size=16, d_model=32, n_layers=3, n_heads=2,
                   mixer="rwkv6"), rngs=nnx.Rngs(0))
  for i, block in enumerate(lm.blocks):
    alone = RWKV6(32, 2, layer_index=i, n_layers=3, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(block.mixer.decay_base[...],
                                  alone.decay_base[...])
  assert not np.array_equal(lm.blocks[0].mixer.decay_base[...],
                            lm.blocks[2].mixer.decay_base[...])


def _left_padded(prompts, pad=0):
  """``([B, P] int32, [B] lengths)`` of token lists, padded on the left."""
  width = max(len(p) for p in prompts)
  rows = [[pad] * (width - len(p)) + list(p) for p in prompts]
  return (jnp.asarray(rows, jnp.int32),
          jnp.asarray([len(p) for p in prompts], jnp.int32))


@pytest.mark.parametrize("mixers,config", [
    (("gla", "softmax_attn"), {}),
    pytest.param(("mamba2", "rwkv6"), {"mlp": "rwkv6"},
                 marks=pytest.mark.slow),
])
def test_batched_prompts_of_different_lengths_decode_as_alone(mixers, config):
  """Left padding with its own segment and shifted positions: every row's
  greedy continuation is that of its prompt decoded alone (RoPE, short
  convolutions, token shifts and recurrent states included)."""
  lm = lm_checks.tiny_lm(mixers, **config)
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, lm_checks.VOCAB, n).tolist() for n in (3, 9, 6)]
  batch, lengths = _left_padded(prompts, pad=7)
  out = np.asarray(lm.generate(batch, 8, prompt_lengths=lengths))
  for row, prompt in enumerate(prompts):
    alone = np.asarray(lm.generate(jnp.asarray([prompt], jnp.int32), 8))
    np.testing.assert_array_equal(out[row, -8:], alone[0, len(prompt):],
                                  err_msg=f"row {row}")
  # Without the lengths the padding is read as text: the short rows differ.
  unaware = np.asarray(lm.generate(batch, 8))
  assert not np.array_equal(unaware[0, -8:], out[0, -8:])
  streamed = np.stack(list(lm.stream(batch, 8, prompt_lengths=lengths)), 1)
  np.testing.assert_array_equal(streamed, out[:, -8:])


def test_generation_stops_at_eos_and_streams_as_generate():
  lm = lm_checks.tiny_lm("gla", {"chunk_size": 8})
  prompt = lm_checks.tokens(length=5)
  key = jax.random.key(4)
  kw = dict(temperature=1.0, top_k=20, top_p=0.9, rng=key)
  out = np.asarray(lm.generate(prompt, 12, **kw))
  streamed = np.stack(list(lm.stream(prompt, 12, **kw)), 1)
  np.testing.assert_array_equal(streamed, out[:, 5:])
  eos = int(out[0, 8])
  first = int(np.flatnonzero(out[0, 5:] == eos)[0]) + 5
  stopped = np.asarray(lm.generate(prompt, 12, eos_id=eos, **kw))
  np.testing.assert_array_equal(stopped[0, :first + 1], out[0, :first + 1])
  assert np.all(stopped[0, first:] == eos)
  for row in stopped[:, 5:]:
    hits = np.flatnonzero(row == eos)
    assert not len(hits) or np.all(row[hits[0]:] == eos)
  with pytest.raises(ValueError, match="eos_id"):
    lm.generate(prompt, 3, eos_id=lm_checks.VOCAB)
  with pytest.raises(ValueError, match="prompt_lengths"):
    lm.generate(prompt, 3, prompt_lengths=[0, 5])
