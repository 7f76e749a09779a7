"""The Gated DeltaNet-2 mixer inside a 2-layer LM, and its gates."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import MIXERS, GatedDeltaNet2
from lin_attn_jax.testing import lm_checks

# Small chunks, so that the 24-token test sequences span several chunks;
# grouped value heads (two per query/key head).
OPTIONS = {"chunk_size": 8, "n_v_heads": 4}


def test_modes_decoding_and_gradients():
  """Chunk, parallel and recurrent modes agree; prefill plus token-by-token
  decoding reproduces the full forward; every parameter gets a gradient
  (packed documents)."""
  lm_checks.check_mixer(lm_checks.tiny_lm("gdn2", OPTIONS),
                        use_segments=True)


def test_registered_with_the_reference_gates_and_init():
  assert MIXERS["gdn2"] is GatedDeltaNet2
  layer = GatedDeltaNet2(32, 2, rngs=nnx.Rngs(0), n_v_heads=4)
  assert (layer.head_k, layer.head_v) == (16, 16)
  a = np.exp(np.asarray(layer.A_log[...]))
  dt = np.log1p(np.exp(np.asarray(layer.dt_bias[...])))
  assert layer.A_log.shape == (2,) and layer.dt_bias.shape == (32,)
  assert np.all((a >= 1) & (a <= 16)) and np.all((dt >= 1e-4) & (dt <= 0.1))
  assert layer.g_up.bias.shape == (64,)
  assert layer.state_size(10) == 4 * 16 * 16

  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 6, 32)),
                  jnp.float32)
  g, b, w = layer.op_gates(x).values()
  assert g.shape == b.shape == (1, 6, 4, 16) and w.shape == (1, 6, 4, 16)
  g, b = np.asarray(g), np.asarray(b)
  assert np.all(g < 0) and np.all((b > 0) & (b < 1))
  # Value heads 0, 1 read query/key head 0; 2, 3 head 1.
  np.testing.assert_array_equal(g[:, :, 0], g[:, :, 1])
  np.testing.assert_array_equal(b[:, :, 2], b[:, :, 3])
  assert not np.array_equal(b[:, :, 1], b[:, :, 2])
  wide = GatedDeltaNet2(32, 2, rngs=nnx.Rngs(0), n_v_heads=4,
                        allow_neg_eigval=True)
  np.testing.assert_allclose(np.asarray(wide.op_gates(x)["b"]), 2 * b,
                             rtol=1e-6)
