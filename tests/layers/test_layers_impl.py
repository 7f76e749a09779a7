"""Mixers choose the implementation of their chunk form (``impl``), also
through ``LMConfig.mixer_options``, and pass their ``chunk_size`` on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from lin_attn_jax import layers
from lin_attn_jax.layers import base
from lin_attn_jax.models import LM, LMConfig
from lin_attn_jax.testing import rel_rms

# The mixers whose chunk form has a Pallas kernel.
KERNEL_MIXERS = ("linear_attn", "performer", "based", "retnet", "gla",
                 "hgrn2", "mamba2", "deltanet", "gated_deltanet", "kda",
                 "forgetting_attn", "gdn2", "gated_deltaproduct", "comba")


@pytest.mark.parametrize("name", KERNEL_MIXERS)
def test_impl_is_validated(name):
  with pytest.raises(ValueError, match="impl"):
    layers.MIXERS[name](32, 2, rngs=nnx.Rngs(0), impl="triton")


def test_lm_config_passes_impl():
  config = LMConfig(d_model=32, n_heads=2, n_layers=3,
                    mixer=("gla", "kda", "forgetting_attn"),
                    mixer_options={"gla": {"impl": "pallas", "chunk_size": 16},
                                   "kda": {"impl": "xla"},
                                   "forgetting_attn": {"impl": "pallas"}})
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  assert [(b.mixer.impl, b.mixer.chunk_size) for b in lm.blocks] == [
      ("pallas", 16), ("xla", None), ("pallas", None)]


def _recording_forms(seen):
  """``OpForms`` whose forms record what they are given and return their
  first input and state."""

  def form(name):
    def run(q, *, initial_state, output_final_state, segment_ids, **options):
      seen.append((name, options, output_final_state))
      return q, initial_state
    return run

  def step(q, state=None, *, reset=None, **options):
    seen.append(("step", options, q.shape))
    return q, state

  return base.OpForms(form("chunk"), form("parallel"), form("recurrent"),
                      step)


def test_apply_forms_passes_chunk_options_and_picks_the_form():
  seen = []
  forms = _recording_forms(seen)
  q = jnp.ones((2, 3, 4))
  positions = jnp.zeros((2, 3), jnp.int32)
  retnet = layers.RetNet(32, 2, rngs=nnx.Rngs(0), chunk_size=48,
                         impl="pallas")
  for mode in layers.MODES:
    o, state = retnet.apply_forms(base.Context(mode, None, positions), forms,
                                  {"q": q}, None, scale=1.0)
    assert o is q and state is None
  assert seen == [
      ("chunk", {"chunk_size": 48, "impl": "pallas", "scale": 1.0}, False),
      ("parallel", {"scale": 1.0}, False),
      ("recurrent", {"scale": 1.0}, False)]
  seen.clear()
  rwkv = layers.RWKV6(32, 2, rngs=nnx.Rngs(0))
  cached = jnp.zeros((2, 1))
  rwkv.apply_forms(base.Context("chunk", None, positions), forms, {"q": q},
                   cached)
  expected = 16 if jax.default_backend() == "cpu" else 64
  assert seen == [("chunk", {"chunk_size": expected}, True)]
  seen.clear()
  o, state = rwkv.apply_forms(
      base.Context("chunk", None, positions[:, :1], cache=cached), forms,
      {"q": q[:, :1]}, cached, u=0.5)
  assert seen == [("step", {"u": 0.5}, (2, 4))]
  assert o.shape == (2, 1, 4) and state is cached


def test_pallas_impl_matches_xla():
  """The kernel (interpret mode on CPU) and the XLA chunk form give the
  layer the same outputs."""
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 24, 32))
  outputs = {}
  for impl in ("xla", "pallas"):
    mixer = layers.RetNet(32, 2, rngs=nnx.Rngs(0), chunk_size=16, impl=impl)
    outputs[impl] = jax.jit(lambda m, x: m(x))(mixer, x)
  assert outputs["pallas"].dtype == jnp.float32
  assert rel_rms(outputs["pallas"], outputs["xla"]) < 1e-5


def test_forgetting_attention_pallas_matches_xla():
  """Forgetting attention in chunk mode on the kernels (interpret mode on
  CPU) and on the XLA blockwise form: the same outputs and parameter
  gradients, with grouped heads, a window and packed documents."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 19, 32))
  ids = jnp.array([[0] * 7 + [1] * 12, [4] * 19])
  cotangent = jax.random.normal(jax.random.PRNGKey(1), x.shape)

  def outputs_and_grads(mixer, x):
    def loss(mixer):
      y = mixer(x, segment_ids=ids, mode="chunk")
      return jnp.sum(y * cotangent), y
    return nnx.grad(loss, has_aux=True)(mixer)

  results = {}
  for impl in ("xla", "pallas"):
    mixer = layers.ForgettingAttention(32, 4, rngs=nnx.Rngs(0), n_kv_heads=2,
                                       window_size=6, block_size=8,
                                       impl=impl)
    grads, y = nnx.jit(outputs_and_grads)(mixer, x)
    results[impl] = (y, jax.tree.leaves(nnx.to_pure_dict(grads)))
  (y, grads), (ref_y, ref_grads) = results["pallas"], results["xla"]
  assert rel_rms(y, ref_y) < 1e-5
  # q, k, v and o projections, the forget gate's weights and bias.
  assert len(grads) == len(ref_grads) == 6
  for got, want in zip(grads, ref_grads):
    assert rel_rms(got, want) < 1e-5
