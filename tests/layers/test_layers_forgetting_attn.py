"""The Forgetting Transformer's mixer, alone and in a hybrid 2-layer LM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, ForgettingAttention
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.testing import lm_checks, rel_rms

# Blocks of 8 over the 24-token test sequences, grouped heads, and every
# option of fla's layer; the hybrid adds a window shorter than a prefill (the
# ring buffer wraps while decoding) and the short convolutions.
FULL = {"block_size": 8, "n_kv_heads": 1, "qk_norm": True,
        "use_output_gate": True, "qkv_bias": True}
CASES = {
    "full": {"forgetting_attn": FULL},
    "hybrid_window": {"gla": {"chunk_size": 8},
                      "forgetting_attn": {"block_size": 8, "window_size": 6,
                                          "use_short_conv": True}},
}
RUNS = [pytest.param(case, use_segments,
                     id=f"{case}-{'seg' if use_segments else 'noseg'}",
                     marks=(() if use_segments and case == "full"
                            else pytest.mark.slow))
        for case in sorted(CASES) for use_segments in (False, True)]


@pytest.mark.parametrize("case, use_segments", RUNS)
def test_modes_decoding_and_gradients(case, use_segments):
  """Chunk, parallel and recurrent modes agree; two prefills and token by
  token decoding reproduce the full forward; every parameter gets a
  gradient."""
  options = CASES[case]
  lm = LM(LMConfig(vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2,
                   n_heads=2, mixer=tuple(options) * (2 // len(options)),
                   mixer_options=options), rngs=nnx.Rngs(0))
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_state_size_counts_keys_values_and_gate_decays():
  layer = ForgettingAttention(32, 4, n_kv_heads=2, rngs=nnx.Rngs(0))
  assert layer.state_size(80) == 80 * (2 * 2 * 8 + 4)
  window = ForgettingAttention(32, 4, window_size=16, rngs=nnx.Rngs(0))
  assert window.state_size(80) == 16 * (2 * 32 + 4)
  assert window.state_size(10) == 10 * (2 * 32 + 4)


def test_forget_gate_bias_starts_at_zero():
  """fla's init: the gate's bias is 0, so ``g`` starts at ``log_sigmoid(x
  W_f)``; its projection is a dense layer with a bias, one per head."""
  layer = MIXERS["forgetting_attn"](32, 4, rngs=nnx.Rngs(0))
  assert layer.f_proj.kernel.shape == (32, 4)
  np.testing.assert_array_equal(layer.f_proj.bias[...], np.zeros(4))
  assert layer.q_norm is None and layer.g_proj is None
  assert layer.short_conv is None and layer.q_proj.bias is None


def test_gate_changes_the_output():
  """A strongly closed forget gate leaves each token its own value: the
  mixer's output then depends on its own token only."""
  layer = ForgettingAttention(16, 2, rngs=nnx.Rngs(0))
  layer.f_proj.bias[...] = jnp.full((2,), -30.0)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 16))
  y = layer(x, mode="parallel")
  alone = jnp.concatenate([layer(x[:, i:i + 1], mode="parallel")
                           for i in range(6)], axis=1)
  assert rel_rms(y, alone) <= 1e-5
  layer.f_proj.bias[...] = jnp.zeros((2,))
  assert rel_rms(layer(x, mode="parallel"), alone) > 1e-2


def test_bfloat16():
  layer = ForgettingAttention(16, 2, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                              param_dtype=jnp.bfloat16, qk_norm=True,
                              use_output_gate=True)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 16), jnp.bfloat16)
  y = jax.jit(lambda x: layer(x, mode="chunk"))(x)
  assert y.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(y, float)))
  cache = layer.init_cache(1, 8, jnp.bfloat16)
  assert cache["mixer"].kv.k.dtype == jnp.bfloat16
  assert cache["mixer"].log_decay.dtype == jnp.float32
  y_cached, _ = jax.jit(lambda x, cache: layer(x, cache=cache))(x, cache)
  assert rel_rms(np.asarray(y_cached, np.float32),
                 np.asarray(y, np.float32)) <= 2e-2


@pytest.mark.parametrize("options, message", [
    ({"n_kv_heads": 3}, "multiple of n_kv_heads"),
    ({"window_size": 0}, "window_size"),
    ({"block_size": 0}, "block_size"),
    ({"use_short_conv": True, "conv_size": 0}, "conv_size"),
])
def test_bad_options(options, message):
  with pytest.raises(ValueError, match=message):
    ForgettingAttention(32, 2, rngs=nnx.Rngs(0), **options)
