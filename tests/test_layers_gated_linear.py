"""Mixers on the gated-linear-attention core, each inside a 2-layer LM."""

import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import GLA
from tests import lm_checks

# Small chunks, so that the 24-token test sequences span several chunks.
MIXER_OPTIONS = {
    "gla": {"chunk_size": 8},
}


@pytest.mark.parametrize("use_segments", [False, True],
                         ids=["noseg", "seg"])
@pytest.mark.parametrize("name", sorted(MIXER_OPTIONS))
def test_modes_decoding_and_gradients(name, use_segments):
  lm = lm_checks.tiny_lm(name, MIXER_OPTIONS[name])
  reference, _ = lm_checks.check_modes(lm, use_segments=use_segments)
  lm_checks.check_decoding(lm, use_segments=use_segments, reference=reference)
  lm_checks.check_gradients(lm, use_segments=use_segments)


def test_gla_gates_start_close_to_one():
  layer = GLA(64, 4, rngs=nnx.Rngs(0))
  x = np.random.default_rng(0).normal(size=(1, 16, 64)).astype(np.float32)
  g = np.log(1 / (1 + np.exp(-np.asarray(layer.gate_up(layer.gate_down(x))))))
  g = g / layer.gate_logit_normalizer
  assert np.all(g <= 0) and np.mean(np.exp(g)) > 0.9
