"""The Comba mixer inside a 2-layer LM, its parameters against fla's
``Comba``, the output correction and the variant without its options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS, Comba
from lin_attn_jax.testing import lm_checks, rel_rms

# Small chunks, so that the 24-token test sequences span several chunks;
# grouped value heads (two per query/key head); the output gate drawn, so
# that it can fail the checks.
OPTIONS = {"chunk_size": 8, "n_v_heads": 4, "zero_init_gate": False}


def test_modes_decoding_and_gradients():
  """Chunk, parallel and recurrent modes agree; prefill plus token-by-token
  decoding reproduces the full forward; every parameter (the inner decay
  and the correction included) gets a gradient (packed documents)."""
  lm_checks.check_mixer(lm_checks.tiny_lm("comba", OPTIONS),
                        use_segments=True)


def test_parameters_have_fla_shapes_and_init():
  """fla's ``Comba(hidden_size=64, num_heads=2, num_v_heads=4,
  head_dim=8, expand_v=1.5)``: ``decay`` and ``D`` per query/key head
  (ones), ``A_log`` and ``dt_bias`` per value head."""
  assert MIXERS["comba"] is Comba
  layer = Comba(64, 2, rngs=nnx.Rngs(0), n_v_heads=4, head_k_dim=8,
                head_v_dim=12)
  shapes = {name: getattr(layer, name).kernel.shape
            for name in ("q_proj", "k_proj", "v_proj", "a_proj", "b_proj",
                         "g_proj", "o_proj")}
  assert shapes == {"q_proj": (64, 16), "k_proj": (64, 16),
                    "v_proj": (64, 48), "a_proj": (64, 4), "b_proj": (64, 4),
                    "g_proj": (64, 48), "o_proj": (48, 64)}
  np.testing.assert_array_equal(np.asarray(layer.decay[...]), np.ones(2))
  np.testing.assert_array_equal(np.asarray(layer.D[...]), np.ones(2))
  assert layer.A_log.shape == layer.dt_bias.shape == (4,)
  assert not layer.allow_neg_eigval and layer.state_size(9) == 4 * 8 * 12
  small = Comba(64, 2, rngs=nnx.Rngs(0), correction_factor=0.02)
  np.testing.assert_allclose(np.asarray(small.D[...]), 0.02)
  plain = Comba(64, 2, rngs=nnx.Rngs(0), use_inner_decay=False,
                use_output_correction=False)
  assert plain.decay is None and plain.D is None


@pytest.mark.slow
def test_correction_and_options_change_the_output():
  """The correction ``q - D sigmoid(d) k`` reaches the output (with ``D =
  0`` it is gone, as without the option), and the variant without short
  convolutions, output gate, inner decay and correction runs every mode
  and decodes."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 16)),
                  jnp.float32)
  layer = Comba(16, 2, rngs=nnx.Rngs(0), chunk_size=4)
  no_correction = Comba(16, 2, rngs=nnx.Rngs(0), chunk_size=4,
                        use_output_correction=False)
  zero_d = Comba(16, 2, rngs=nnx.Rngs(0), chunk_size=4,
                 correction_factor=0.0)
  plain = Comba(16, 2, rngs=nnx.Rngs(0), use_short_conv=False,
                use_output_gate=False, use_inner_decay=False,
                use_output_correction=False, chunk_size=4)
  segment_ids = jnp.asarray([[0, 0, 0, 1, 1, 1, 1], [0] * 7], jnp.int32)
  graphdef, state = nnx.split((layer, no_correction, zero_d, plain))

  def run(state, x):
    layer, no_correction, zero_d, plain = nnx.merge(graphdef, state)
    modes, decoded = lm_checks.mixer_modes_and_decoding(plain, x, segment_ids)
    return (layer(x), no_correction(x), zero_d(x)), modes, decoded

  (y, y_none, y_zero), (chunk, parallel, recurrent), decoded = jax.jit(
      run, compiler_options=lm_checks.FAST_COMPILE)(state, x)
  assert rel_rms(y_zero, y_none) < 1e-6 and rel_rms(y, y_none) > 1e-2
  assert float(jnp.std(chunk)) > 1e-3
  for other in (parallel, recurrent, decoded):
    assert rel_rms(other, chunk) <= 1e-5
