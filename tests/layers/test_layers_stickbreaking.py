"""The stick-breaking attention mixer, alone and in a hybrid 2-layer LM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, StickBreakingAttention
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.testing import lm_checks, rel_rms

# Blocks of 8 over the 24-token test sequences: several blocks, documents
# starting inside them.
FLA_DEFAULTS = {"block_size": 8, "n_kv_heads": 1}
ALL_OPTIONS = {"block_size": 8, "attend_current": True, "qk_norm": True,
               "qkv_bias": True}


# Without segment ids: slow only, as for the other mixers.
@pytest.mark.parametrize("use_segments", [
    pytest.param(False, id="noseg", marks=pytest.mark.slow),
    pytest.param(True, id="seg")])
def test_modes_decoding_and_gradients(use_segments):
  """Chunk, parallel and recurrent logits agree; two prefills and
  token-by-token decoding reproduce them; every parameter gets a
  gradient."""
  lm = lm_checks.tiny_lm("stickbreaking_attn", FLA_DEFAULTS)
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_hybrid_lm_with_every_option():
  """After a GLA layer, with a query seeing its own key, q/k norms and
  biases: every mode, decoding and gradients."""
  config = LMConfig(vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2,
                    n_heads=2, mixer=("gla", "stickbreaking_attn"),
                    mixer_options={"gla": {"chunk_size": 8},
                                   "stickbreaking_attn": ALL_OPTIONS})
  lm_checks.check_mixer(LM(config, rngs=nnx.Rngs(0)), use_segments=True)


def test_layer_is_the_op_on_its_projections():
  """``y = W_o o`` with ``o`` the dense op on ``x W_q``, ``x W_k``, ``x
  W_v`` (no position encoding), and the q/k RMSNorm of fla's layer (one
  scale of ``head_dim`` for every head)."""
  from lin_attn_jax.ops import parallel_stickbreaking_attn
  layer = StickBreakingAttention(16, 4, rngs=nnx.Rngs(0), n_kv_heads=2,
                                 qk_norm=True)
  assert layer.q_norm.scale.shape == (4,)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 9, 16))
  q = layer.q_proj(x).reshape(2, 9, 4, 4)
  k = layer.k_proj(x).reshape(2, 9, 2, 4)
  v = layer.v_proj(x).reshape(2, 9, 2, 4)

  def rms(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)

  o = parallel_stickbreaking_attn(rms(q), rms(k), v)
  expected = layer.o_proj(o.reshape(2, 9, 16))
  np.testing.assert_allclose(layer(x, mode="parallel"), expected, atol=1e-5)
  # The first token sees no key (attend_current=False): y_0 = 0.
  np.testing.assert_allclose(layer(x)[:, 0], 0.0, atol=0)


def test_state_size_is_the_kv_cache():
  layer = nnx.eval_shape(lambda: StickBreakingAttention(
      32, 4, rngs=nnx.Rngs(0), n_kv_heads=2))
  assert layer.state_size(80) == 2 * 80 * 2 * 8
  cache = jax.eval_shape(lambda: layer.init_cache(1, 80))
  assert cache["mixer"].k.shape == (1, 80, 2, 8)


def test_bfloat16():
  layer = MIXERS["stickbreaking_attn"](16, 2, rngs=nnx.Rngs(0),
                                       dtype=jnp.bfloat16,
                                       param_dtype=jnp.bfloat16,
                                       block_size=4)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 10, 16), jnp.bfloat16)
  y = jax.jit(lambda x: layer(x))(x)
  y_dense = jax.jit(lambda x: layer(x, mode="parallel"))(x)
  assert y.dtype == jnp.bfloat16
  assert rel_rms(np.asarray(y, np.float32),
                 np.asarray(y_dense, np.float32)) <= 1e-2
  cache = layer.init_cache(1, 10, jnp.bfloat16)
  y_cached, _ = jax.jit(lambda x, cache: layer(x, cache=cache))(x, cache)
  assert rel_rms(np.asarray(y_cached, np.float32),
                 np.asarray(y_dense, np.float32)) <= 2e-2


@pytest.mark.parametrize("options, message", [
    ({"n_kv_heads": 3}, "multiple of n_kv_heads"),
    ({"block_size": 0}, "block_size"),
    ({"attend_current": "yes"}, "attend_current must be a bool"),
])
def test_bad_options(options, message):
  with pytest.raises(ValueError, match=message):
    StickBreakingAttention(32, 2, rngs=nnx.Rngs(0), **options)
