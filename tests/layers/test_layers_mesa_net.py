"""The MesaNet layer: fla's defaults, its cache, and the decoding start of
the reference (the modes, decoding and gradients of the default layer are
in test_layers_gated_linear.py)."""

import jax
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MesaNet
from lin_attn_jax.testing import lm_checks


def test_defaults_and_cache():
  layer = MesaNet(64, 4, rngs=nnx.Rngs(0))
  assert (layer.head_k, layer.head_v, layer.cg_steps,
          layer.decode_cg_steps) == (16, 16, 30, 30)
  np.testing.assert_allclose(layer.lamb(), np.ones((4, 16)), rtol=1e-6)
  assert layer.g_proj is None and layer.a_proj.bias is not None
  cache = layer.init_cache(3, 10)["mixer"]
  assert jax.tree.map(lambda x: x.shape, cache) == {
      "conv": {"q": (3, 3, 64), "k": (3, 3, 64)}, "state": (3, 4, 16, 32)}
  assert layer.state_size(10) == 4 * 16 * 32
  assert layer.state_size(10, include_conv=True) == 4 * 16 * 32 + 2 * 3 * 64
  assert "lambda_params" in MesaNet.no_weight_decay


def test_bad_options_raise():
  with pytest.raises(ValueError, match="decode_cg_start must be one of"):
    MesaNet(32, 2, rngs=nnx.Rngs(0), decode_cg_start="jacobi")
  with pytest.raises(ValueError, match="lambda_init"):
    MesaNet(32, 2, rngs=nnx.Rngs(0), lambda_init=0.2)
  with pytest.raises(ValueError, match="d_model = 30 must be a multiple"):
    MesaNet(30, 4, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_output_gate_and_reference_decoding_start():
  """The output gate's modes, decoding and gradients; and the reference's
  decoding start: decoding departs from the full forward pass by about
  1e-3 relative (the reference CG's stall, ``ops.mesa_net_step``)."""
  lm = lm_checks.tiny_lm("mesa_net", {"chunk_size": 8,
                                      "use_output_gate": True})
  lm_checks.check_mixer(lm, use_segments=True)
  lm = lm_checks.tiny_lm("mesa_net", {"chunk_size": 8,
                                      "decode_cg_start": "diagonal"})
  error = lm_checks.check_decoding(lm, use_segments=True, tol=1e-2)
  assert 1e-5 < error, error
