"""The PaTH attention mixer inside 2-layer LMs: modes, prefill and
decoding, gradients, a hybrid LM, the cache, bfloat16 and bad options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, PaTHAttention
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.ops import PaTHCache
from lin_attn_jax.testing import lm_checks, rel_rms

# Chunks of 8, so that the 24-token test sequences span three of them.
CASES = {
    # fla's defaults: rank-32 w, its short convolution, no gate, no norms.
    "defaults": {"chunk_size": 8},
    # Every option the other way, with grouped heads.
    "gate_qk_norm_full_w": {"chunk_size": 8, "use_forget_gate": True,
                            "use_qk_norm": True, "use_low_rank_w": False,
                            "use_w_shortconv": False, "n_kv_heads": 1},
}


@pytest.mark.parametrize("case", [
    "defaults",
    pytest.param("gate_qk_norm_full_w", marks=pytest.mark.slow)])
def test_modes_decoding_and_gradients(case):
  lm = lm_checks.tiny_lm("path_attn", CASES[case])
  lm_checks.check_mixer(lm, use_segments=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_modes_decoding_and_gradients_one_document(case):
  lm = lm_checks.tiny_lm("path_attn", CASES[case])
  lm_checks.check_mixer(lm, use_segments=False)


def test_hybrid_lm_decodes():
  """PaTH layers beside GLA layers in one LM: prefill and decoding give the
  full forward's logits."""
  config = LMConfig(vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2,
                    n_heads=2, mixer=("gla", "path_attn"),
                    mixer_options={"gla": {"chunk_size": 8},
                                   "path_attn": {"chunk_size": 8,
                                                 "use_forget_gate": True}})
  lm = LM(config, rngs=nnx.Rngs(0))
  assert isinstance(lm.blocks[1].mixer, PaTHAttention)
  lm_checks.check_decoding(lm, use_segments=True)


def test_cache_and_state_size():
  layer = PaTHAttention(32, 4, n_kv_heads=2, use_forget_gate=True,
                        rngs=nnx.Rngs(0))
  cache = layer.init_cache(3, 10)
  state = cache["mixer"]["state"]
  assert isinstance(state, PaTHCache)
  assert state.k.shape == state.v.shape == (3, 10, 2, 8)
  assert state.log_gate.shape == (3, 10, 4)
  assert cache["mixer"]["conv"].shape == (3, 2, 16)
  assert layer.state_size(10) == 2 * 10 * 16 + 10 * 4
  assert layer.state_size(10, include_conv=True) == 2 * 10 * 16 + 40 + 32
  plain = PaTHAttention(32, 4, use_w_shortconv=False, rngs=nnx.Rngs(0))
  assert set(plain.init_cache(1, 4)["mixer"]) == {"state"}
  assert plain.state_size(10, include_conv=True) == 2 * 10 * 32


def test_bfloat16():
  """bfloat16 computation (float32 parameters), within 5e-2 of float32,
  with a bfloat16 cache of keys and values and float32 gate sums."""
  kw = dict(use_forget_gate=True, chunk_size=4)
  layer = PaTHAttention(16, 2, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, **kw)
  reference = PaTHAttention(16, 2, rngs=nnx.Rngs(0), **kw)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 16))

  @jax.jit
  def run(x):
    cache = layer.init_cache(1, 8, jnp.bfloat16)
    low = x.astype(jnp.bfloat16)
    return layer(low), layer(low, cache=cache), reference(x)

  y, (y_cached, cache), expected = run(x)
  assert y.dtype == y_cached.dtype == jnp.bfloat16
  state = cache["mixer"]["state"]
  assert state.k.dtype == jnp.bfloat16 and state.log_gate.dtype == jnp.float32
  assert rel_rms(y, expected) < 5e-2
  assert rel_rms(y_cached, expected) < 5e-2


def test_registered_and_bad_options():
  assert MIXERS["path_attn"] is PaTHAttention
  for options, message in (({"n_kv_heads": 3}, "multiple of n_kv_heads"),
                           ({"w_rank": 0}, "w_rank"),
                           ({"conv_size": 0}, "conv_size"),
                           ({"chunk_size": 0}, "chunk_size")):
    with pytest.raises(ValueError, match=message):
      PaTHAttention(32, 2, rngs=nnx.Rngs(0), **options)


def test_positions_enter_through_the_reflections():
  """No position encoding but the reflections: swapping two earlier tokens
  changes a later output, and not the first one."""
  layer = PaTHAttention(16, 2, rngs=nnx.Rngs(0), chunk_size=4)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 6, 16))
  swapped = x.at[:, jnp.array([1, 2])].set(x[:, jnp.array([2, 1])])
  y, y_swapped = jax.jit(lambda a, b: (layer(a), layer(b)))(x, swapped)
  assert float(jnp.max(jnp.abs(y[:, -1] - y_swapped[:, -1]))) > 1e-4
  np.testing.assert_allclose(y[:, 0], y_swapped[:, 0], atol=1e-6)
