"""MiniMax's lightning attention layer: its decay schedule, the layer
against its recurrence written out token by token, and inside a 2-layer
LM (modes, decoding with packed documents, gradients). The whole model
against transformers' is tests/convert (the ``minimax`` fixture)."""

import jax
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, LightningAttention
from lin_attn_jax.layers.lightning import lightning_slopes
from lin_attn_jax.testing import lm_checks, rel_rms


def test_slopes_follow_the_layer_and_head():
  """``b^(h+1) (1 - l / (L - 1 + 1e-5) + 1e-5)`` with ``b = 2^(-8/H)``."""
  np.testing.assert_allclose(lightning_slopes(4, 0, 3),
                             np.array([2.0 ** -2, 2.0 ** -4, 2.0 ** -6,
                                       2.0 ** -8]) * (1 + 1e-5), rtol=1e-6)
  last = lightning_slopes(4, 2, 3)
  np.testing.assert_allclose(last / lightning_slopes(4, 0, 3),
                             (1 - 2 / (2 + 1e-5) + 1e-5) / (1 + 1e-5),
                             rtol=1e-4)
  layer = LightningAttention(32, 4, rngs=nnx.Rngs(0), layer_index=1,
                             n_layers=3)
  np.testing.assert_allclose(layer.slopes, lightning_slopes(4, 1, 3))
  with pytest.raises(ValueError, match="layer_index"):
    LightningAttention(32, 4, rngs=nnx.Rngs(0), layer_index=3, n_layers=3)
  assert MIXERS["lightning_attn"] is LightningAttention


def test_layer_is_its_recurrence():
  layer = LightningAttention(16, 2, rngs=nnx.Rngs(0), head_dim=4,
                             layer_index=1, n_layers=4, chunk_size=4)
  x = jax.random.normal(jax.random.key(1), (2, 11, 16))
  p = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(layer,
                                                          nnx.Param)))
  xs = np.asarray(x, np.float64)
  qkv = xs @ p["qkv_proj"]["kernel"]
  qkv = (qkv / (1 + np.exp(-qkv))).reshape(2, 11, 2, 12)
  q, k, v = qkv[..., :4], qkv[..., 4:8], qkv[..., 8:]
  decay = np.exp(-np.asarray(layer.slopes, np.float64))
  state = np.zeros((2, 2, 4, 4))
  outs = []
  for t in range(11):
    state = (decay[None, :, None, None] * state
             + k[:, t, :, :, None] * v[:, t, :, None, :])
    outs.append(np.einsum("bhk,bhkv->bhv", q[:, t], state))
  o = np.stack(outs, 1).reshape(2, 11, 8)
  o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-6)
  o = o * p["norm"]["scale"]
  gate = 1 / (1 + np.exp(-(xs @ p["output_gate"]["kernel"])))
  want = (gate * o) @ p["out_proj"]["kernel"]
  run = nnx.jit(lambda layer, x, mode: layer(x, mode=mode),
                static_argnums=2)
  for mode in ("chunk", "parallel", "recurrent"):
    assert rel_rms(run(layer, x, mode), want) <= 1e-5, mode


def test_modes_decoding_and_gradients():
  lm_checks.check_mixer(lm_checks.tiny_lm("lightning_attn",
                                          {"chunk_size": 8}),
                        use_segments=True)
