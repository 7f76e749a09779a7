"""The native sparse attention mixer inside small LMs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import NativeSparseAttention
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.testing import lm_checks, rel_rms
from lin_attn_jax.train import flops

# Blocks of 3 tokens, 4 selected (one ranked), a window of 5, one key/value
# head: the 24-token test sequences span 8 blocks, and the documents of
# lm_checks.SEGMENT_IDS start inside blocks.
OPTIONS = {"block_size": 3, "block_counts": 4, "window_size": 5,
           "n_kv_heads": 1}


@pytest.mark.parametrize("use_segments", [
    True, pytest.param(False, marks=pytest.mark.slow)])
def test_modes_decoding_and_gradients(use_segments):
  lm = lm_checks.tiny_lm("nsa", OPTIONS)
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_hybrid_lm_decodes_as_the_full_forward():
  """With a gated-linear layer before it, a wider head and no window."""
  config = LMConfig(vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2,
                    n_heads=2, mixer=("gla", "nsa"),
                    mixer_options={"nsa": dict(block_size=4, block_counts=3,
                                               window_size=None,
                                               head_dim=24)})
  lm_checks.check_decoding(LM(config, rngs=nnx.Rngs(0)), use_segments=True)


def test_cache_holds_every_token_and_the_blocks():
  lm = lm_checks.tiny_lm("nsa", OPTIONS)
  _, final = lm_checks.decode_logits(lm, lm_checks.tokens(), None)
  cache = final[0]["mixer"]
  length = lm_checks.LENGTH
  assert cache.k.shape == (lm_checks.BATCH, length, 1, 16)
  np.testing.assert_array_equal(cache.block_end,
                                np.tile(np.arange(2, length, 3), (2, 1)))
  assert cache.window.k.shape[1] == 5
  layer = lm.blocks[0].mixer
  assert layer.state_size(length) == 2 * (length + length // 3 + 5) * 16


def test_training_flops_count_the_keys_each_branch_reads():
  mixer = nnx.eval_shape(lambda: NativeSparseAttention(
      32, 2, rngs=nnx.Rngs(0), block_size=4, block_counts=2, window_size=3))
  # Positions 1..10 see t // 4 blocks, min(t, 8) selected tokens and
  # min(t, 3) window keys: 10 + 52 + 27 = 89 over 10 queries.
  assert flops.mixing_flops_per_token(mixer, 10) == pytest.approx(
      4 * 8.9 * 2 * 16)


def test_bfloat16():
  layer = NativeSparseAttention(16, 2, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                                param_dtype=jnp.bfloat16, block_size=2,
                                block_counts=2, window_size=3)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 16), jnp.bfloat16)
  y = jax.jit(lambda x: layer(x, mode="parallel"))(x)
  assert y.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(y, float)))
  cache = layer.init_cache(1, 8, jnp.bfloat16)
  y_cached, _ = jax.jit(lambda x, cache: layer(x, cache=cache))(x, cache)
  assert rel_rms(np.asarray(y_cached, np.float32),
                 np.asarray(y, np.float32)) <= 2e-2


@pytest.mark.parametrize("options, message", [
    ({"n_kv_heads": 3}, "multiple of n_kv_heads"),
    ({"block_size": 0}, "block_size"),
    ({"block_counts": 0}, "block_counts"),
    ({"window_size": 0}, "window_size"),
    ({"head_dim": 7}, "even head_dim"),
    ({"chunk_size": 0}, "chunk_size"),
])
def test_bad_options(options, message):
  with pytest.raises(ValueError, match=message):
    NativeSparseAttention(32, 2, rngs=nnx.Rngs(0), **options)
