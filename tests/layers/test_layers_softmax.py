"""The softmax-family mixers, each inside a 2-layer LM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import (MIXERS, Linformer, MoBA,
                                 SlidingWindowAttention, SoftmaxAttention,
                                 SparseAttention)
from lin_attn_jax.testing import lm_checks
from lin_attn_jax.testing import rel_rms

WINDOW = 6
# Small blocks, windows and strides, so that the 24-token test sequences span
# several blocks and the masks cut through them.
CAUSAL_CASES = {
    "softmax_attn": ("softmax_attn", {"block_size": 8, "n_kv_heads": 1}),
    "sliding_window_attn": ("sliding_window_attn",
                            {"window_size": WINDOW, "block_size": 8}),
    "sparse_attn_strided": ("sparse_attn", {"pattern": "strided", "stride": 4,
                                            "block_size": 8}),
    "sparse_attn_fixed": ("sparse_attn", {"pattern": "fixed", "stride": 6,
                                          "summary_size": 2,
                                          "block_size": 8}),
    # Blocks of 3, so that the documents of 5 and 11 tokens have blocks to
    # choose from; tiles of 4, shorter than some documents' blocks.
    "moba": ("moba", {"block_size": 3, "top_k": 2, "chunk_size": 4,
                      "n_kv_heads": 1}),
    "moba_gated": ("moba", {"block_size": 3, "top_k": 3, "chunk_size": 4,
                            "qk_norm": True, "use_output_gate": True}),
}
# Without segment ids the same modes run on one document: slow only, as for
# the other mixers (the segment case covers every path and the masks
# besides).
# The second option set of MoBA and of the sparse patterns is slow too: the
# first runs the same layer and op.
SLOW_CASES = ("moba_gated", "sparse_attn_strided")
CAUSAL_RUNS = [pytest.param(case, use_segments,
                            id=f"{case}-{'seg' if use_segments else 'noseg'}",
                            marks=() if use_segments and case not in SLOW_CASES
                            else pytest.mark.slow)
               for case in sorted(CAUSAL_CASES)
               for use_segments in (False, True)]
LINFORMER_OPTIONS = {"max_len": 32, "projected_length": 8}


@pytest.mark.parametrize("case, use_segments", CAUSAL_RUNS)
def test_modes_decoding_and_gradients(case, use_segments):
  name, options = CAUSAL_CASES[case]
  lm = lm_checks.tiny_lm(name, options)
  lm_checks.check_mixer(lm, use_segments=use_segments)


def test_moba_in_a_hybrid_lm():
  """MoBA after a GLA layer: prefill and decoding reproduce the forward."""
  from lin_attn_jax.models import LM, LMConfig

  lm = LM(LMConfig(vocab_size=lm_checks.VOCAB, d_model=32, n_layers=2,
                   n_heads=2, mixer=("gla", "moba"),
                   mixer_options={"gla": {"chunk_size": 8},
                                  "moba": {"block_size": 3, "top_k": 2,
                                           "chunk_size": 4}}),
          rngs=nnx.Rngs(0))
  lm_checks.check_decoding(lm, use_segments=True)


def test_sliding_window_cache_is_a_ring_buffer():
  lm = lm_checks.tiny_lm("sliding_window_attn", {"window_size": WINDOW})
  cache = lm.init_cache(lm_checks.BATCH, lm_checks.LENGTH)
  _, final = lm_checks.decode_logits(lm, lm_checks.tokens(), None)
  for layer in (cache, final):
    kv = layer[0]["mixer"]
    assert kv.k.shape == (lm_checks.BATCH, WINDOW, 2, 16)
    assert kv.v.shape == (lm_checks.BATCH, WINDOW, 2, 16)
    assert kv.window_size == WINDOW
  # After 24 tokens the buffer holds the last six, token t in slot t mod 6.
  np.testing.assert_array_equal(final[0]["mixer"].position,
                                np.tile(np.arange(18, 24), (2, 1)))


def test_sliding_window_matters_only_past_the_window():
  """Same parameters as full attention: equal logits for the first WINDOW
  tokens, different ones after."""
  full = lm_checks.all_modes(lm_checks.tiny_lm("softmax_attn"),
                             lm_checks.tokens(), None, ("parallel",))
  window = lm_checks.all_modes(
      lm_checks.tiny_lm("sliding_window_attn", {"window_size": WINDOW}),
      lm_checks.tokens(), None, ("parallel",))
  full, window = full["parallel"], window["parallel"]
  assert rel_rms(window[:, :WINDOW], full[:, :WINDOW]) <= 1e-6
  assert rel_rms(window[:, WINDOW:], full[:, WINDOW:]) > 1e-3


def test_linformer():
  lm = lm_checks.tiny_lm("linformer", LINFORMER_OPTIONS)
  lm_checks.check_modes(lm, use_segments=False, modes=("chunk", "parallel"))
  lm_checks.check_gradients(lm, use_segments=False)
  with pytest.raises(ValueError, match="not causal"):
    lm.init_cache(lm_checks.BATCH, lm_checks.LENGTH)
  layer = lm.blocks[0].mixer
  x = jnp.ones((1, 4, 32))
  with pytest.raises(ValueError, match="not causal"):
    layer(x, mode="recurrent")
  with pytest.raises(ValueError, match="not causal"):
    layer(x, cache={"position": jnp.zeros((1,), jnp.int32),
                    "segment_id": jnp.zeros((1,), jnp.int32), "mixer": None})
  with pytest.raises(ValueError, match="segment_ids"):
    layer(x, segment_ids=jnp.zeros((1, 4), jnp.int32))
  with pytest.raises(ValueError, match="max_len = 32"):
    layer(jnp.ones((1, 33, 32)))


def test_linformer_sees_the_future():
  layer = Linformer(16, 2, rngs=nnx.Rngs(0), max_len=8, projected_length=4)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 16))
  # Row 1 differs from row 0 in its last token only.
  y = jax.jit(lambda x: layer(x))(jnp.concatenate([x, x.at[:, -1].add(1.0)]))
  assert float(jnp.max(jnp.abs(y[0, 0] - y[1, 0]))) > 1e-4


@pytest.mark.parametrize("name", ["softmax_attn", "sliding_window_attn",
                                  "sparse_attn", "linformer", "moba"])
def test_bfloat16(name):
  options = {"linformer": {"max_len": 8}, "sparse_attn": {"stride": 2},
             "moba": {"block_size": 2, "top_k": 2}}
  layer = MIXERS[name](16, 2, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                       param_dtype=jnp.bfloat16, **options.get(name, {}))
  params = jax.tree.leaves(nnx.state(layer, nnx.Param))
  assert all(p.dtype == jnp.bfloat16 for p in params)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 16), jnp.bfloat16)
  y = jax.jit(lambda x: layer(x, mode="parallel"))(x)
  assert y.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(y, float)))
  if layer.causal:
    cache = layer.init_cache(1, 8, jnp.bfloat16)
    assert cache["mixer"].k.dtype == jnp.bfloat16
    y_cached, _ = jax.jit(lambda x, cache: layer(x, cache=cache))(x, cache)
    assert rel_rms(np.asarray(y_cached, np.float32),
                   np.asarray(y, np.float32)) <= 2e-2


@pytest.mark.parametrize("cls, options, message", [
    (SoftmaxAttention, {"n_kv_heads": 3}, "multiple of n_kv_heads"),
    (SoftmaxAttention, {"block_size": 0}, "block_size"),
    (SlidingWindowAttention, {"window_size": 0}, "window_size"),
    (SlidingWindowAttention, {"window_size": None}, "window_size"),
    (SparseAttention, {"pattern": "banded"}, "pattern"),
    (SparseAttention, {"pattern": "fixed", "stride": 4, "summary_size": 5},
     "summary_size"),
    (Linformer, {"projected_length": 0}, "projected_length"),
    (MoBA, {"block_size": 0}, "block_size"),
    (MoBA, {"top_k": -1}, "top_k"),
    (MoBA, {"chunk_size": 2.5}, "chunk_size"),
    (MoBA, {"n_kv_heads": 3}, "multiple of n_kv_heads"),
])
def test_bad_options(cls, options, message):
  with pytest.raises(ValueError, match=message):
    cls(32, 2, rngs=nnx.Rngs(0), **options)


def test_bad_widths():
  with pytest.raises(ValueError, match="divide into n_heads"):
    SoftmaxAttention(30, 4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="even number of rotated channels"):
    SoftmaxAttention(30, 2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="divide into n_heads"):
    Linformer(30, 4, rngs=nnx.Rngs(0))
