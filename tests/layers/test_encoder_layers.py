"""The encoder-only mixers (Agent Attention, Nystromformer, EfficientViT):
not causal, documents, bfloat16, and a sequence axis. Their ops are checked
against the papers' equations in tests/ops/test_encoder_ops.py; tracing
with every parameter traced in tests/ops/test_traced.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import (MIXERS, AgentAttention,
                                 EfficientViTAttention, Nystromformer)
from lin_attn_jax.layers.encoder_modules import resize_matrix
from lin_attn_jax.testing import rel_rms

D, H, T = 16, 2, 24
ENCODERS = {"agent_attn": AgentAttention, "nystromformer": Nystromformer,
            "efficientvit": EfficientViTAttention}
OPTIONS = {"agent_attn": {"agent_num": 4}, "nystromformer": {
    "num_landmarks": 4, "conv_kernel_size": 5}, "efficientvit": {}}


def _x(seed=0, t=T):
  return jax.random.normal(jax.random.PRNGKey(seed), (2, t, D), jnp.float32)


def _layer(name, **kw):
  return MIXERS[name](D, H, rngs=nnx.Rngs(0), **{**OPTIONS[name], **kw})


def test_registered_and_not_causal():
  assert ENCODERS.items() <= MIXERS.items()
  for name in ENCODERS:
    layer = _layer(name)
    assert not layer.causal
    with pytest.raises(ValueError, match="not causal"):
      layer.init_cache(2, T)
    with pytest.raises(ValueError, match="no recurrent mode"):
      layer(_x(), mode="recurrent")


# EfficientViT's op is checked in bfloat16 in the fast suite
# (test_encoder_ops.py, test_noncausal.py), its layer in the slow one.
@pytest.mark.parametrize("name", [
    "agent_attn", "nystromformer",
    pytest.param("efficientvit", marks=pytest.mark.slow)])
def test_bfloat16_and_every_token_sees_the_future(name):
  """bfloat16 close to float32 (same parameters); a change to the last
  token moves the first token's output."""
  layer = _layer(name)
  x = _x(1)
  run = jax.jit(lambda x: layer(x))
  y = run(x)
  low = _layer(name, dtype=jnp.bfloat16)
  y_low = jax.jit(lambda x: low(x))(x.astype(jnp.bfloat16))
  assert y_low.dtype == jnp.bfloat16
  assert rel_rms(y_low, y) <= 3e-2
  y_moved = run(x.at[:, -1].add(1.0))
  assert np.abs(np.asarray(y_moved - y)[:, 0]).max() > 1e-4


def test_efficientvit_bounds_documents_in_convolutions_and_attention():
  layer = _layer("efficientvit", scales=(3, 5))
  x = _x(2)
  ids = jnp.asarray([[0] * 10 + [1] * 14, [5] * T])
  run = jax.jit(lambda x, s, mode: layer(x, segment_ids=s, mode=mode),
                static_argnames="mode")
  packed = run(x, ids, "chunk")
  # The second document alone in row 1, after a first one of other tokens.
  alone = run(x.at[1, 10:].set(x[0, 10:]), ids.at[1].set(ids[0]), "chunk")
  other = run(x.at[0, :10].set(x[1, :10]), ids, "parallel")
  np.testing.assert_allclose(packed[0, 10:], alone[1, 10:], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(packed[0, 10:], other[0, 10:], rtol=1e-5,
                             atol=1e-5)
  assert np.abs(np.asarray(packed - run(x, 0 * ids, "chunk"))[0]).max() > 1e-3


# The op's split is checked in the fast suite (test_noncausal.py).
@pytest.mark.slow
def test_efficientvit_splits_the_sequence_over_8_devices():
  layer = _layer("efficientvit")
  x = _x(3, 32)
  ids = jnp.asarray([[0] * 13 + [1] * 19, [2] * 32])
  run = jax.jit(lambda x, s: layer(x, segment_ids=s))
  one = run(x, ids)
  mesh = jax.make_mesh((1, 8), ("data", "sequence"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    split = jax.jit(lambda x, s: layer(x, segment_ids=s))(x, ids)
  np.testing.assert_allclose(split, one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, match", [
    ("agent_attn", "Agent Attention cannot split"),
    ("nystromformer", "Nystromformer cannot split")])
def test_one_document_per_row_and_no_sequence_axis(name, match):
  layer = _layer(name)
  ids = jnp.asarray([[0] * 10 + [1] * 14, [5] * T])
  with pytest.raises(ValueError, match="one document per row"):
    layer(_x(), segment_ids=ids)
  mesh = jax.make_mesh((4, 2), ("data", "sequence"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    with pytest.raises(ValueError, match=match):
      layer(_x())


def test_agent_bias_resize_is_linear_interpolation():
  np.testing.assert_allclose(resize_matrix(5, 5), np.eye(5), atol=1e-7)
  m = np.asarray(resize_matrix(2, 4))
  # align_corners=False: outputs at 0.25, 0.75 of the way, clamped ends.
  np.testing.assert_allclose(np.array([1.0, 3.0]) @ m,
                             [1.0, 1.5, 2.5, 3.0], rtol=1e-6)


@pytest.mark.parametrize("cls, kw, match", [
    (AgentAttention, {"dwc_kernel": 4}, "odd"),
    (AgentAttention, {"agent_num": 0}, "agent_num"),
    (Nystromformer, {"pinv_init": "lu"}, "pinv_init"),
    (EfficientViTAttention, {"scales": (2,)}, "odd")])
def test_bad_options(cls, kw, match):
  with pytest.raises(ValueError, match=match):
    cls(D, H, rngs=nnx.Rngs(0), **kw)
