"""The Gated DeltaProduct mixer: fla's parameter shapes, and the variant
without forget gate or short convolutions (3 steps per token) in every mode
and decoding. The default variant runs the delta-rule layer checks
(tests/layers/test_layers_delta_rwkv.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import GatedDeltaProduct, MIXERS
from lin_attn_jax.testing import lm_checks, rel_rms


def test_parameters_have_fla_shapes():
  """fla's ``GatedDeltaProduct(hidden_size=64, num_heads=2, head_dim=8,
  expand_v=1.5, num_householder=3)``: ``k_proj`` and ``v_proj`` ``N``
  times wider, ``b_proj`` one column per step and head, ``a_proj`` one per
  head."""
  layer = nnx.eval_shape(lambda: MIXERS["gated_deltaproduct"](
      64, 2, rngs=nnx.Rngs(0), head_k_dim=8, head_v_dim=12,
      num_householder=3))
  shapes = {name: getattr(layer, name).kernel.shape
            for name in ("q_proj", "k_proj", "v_proj", "b_proj", "a_proj",
                         "g_proj", "o_proj")}
  assert shapes == {"q_proj": (64, 16), "k_proj": (64, 48),
                    "v_proj": (64, 72), "b_proj": (64, 6), "a_proj": (64, 2),
                    "g_proj": (64, 24), "o_proj": (24, 64)}
  assert [c.channels for c in (layer.short_conv.q_conv,
                               layer.short_conv.k_conv,
                               layer.short_conv.v_conv)] == [16, 48, 72]
  assert layer.A_log.shape == layer.dt_bias.shape == (2,)
  assert layer.allow_neg_eigval and layer.state_size(9) == 2 * 8 * 12
  plain = nnx.eval_shape(lambda: GatedDeltaProduct(
      64, 2, rngs=nnx.Rngs(0), use_forget_gate=False))
  assert not hasattr(plain, "a_proj") and not hasattr(plain, "A_log")


def test_without_gate_or_convolutions_modes_and_decoding_agree():
  layer = GatedDeltaProduct(16, 2, rngs=nnx.Rngs(0), num_householder=3,
                            use_forget_gate=False, use_short_conv=False,
                            zero_init_gate=False, chunk_size=4)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 16)),
                  jnp.float32)
  segment_ids = jnp.asarray([[0, 0, 0, 1, 1, 1, 1], [0] * 7], jnp.int32)
  graphdef, state = nnx.split(layer)

  def run(state, x):
    return lm_checks.mixer_modes_and_decoding(nnx.merge(graphdef, state), x,
                                              segment_ids)

  (chunk, parallel, recurrent), decoded = jax.jit(
      run, compiler_options=lm_checks.FAST_COMPILE)(state, x)
  assert float(jnp.std(chunk)) > 1e-3
  for other in (parallel, recurrent, decoded):
    assert rel_rms(other, chunk) <= 1e-5
