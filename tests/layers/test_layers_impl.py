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
                 "gated_deltaproduct")


@pytest.mark.parametrize("name", KERNEL_MIXERS)
def test_impl_is_validated(name):
  with pytest.raises(ValueError, match="impl"):
    layers.MIXERS[name](32, 2, rngs=nnx.Rngs(0), impl="triton")


def test_lm_config_passes_impl():
  config = LMConfig(d_model=32, n_heads=2, mixer=("gla", "kda"),
                    mixer_options={"gla": {"impl": "pallas", "chunk_size": 16},
                                   "kda": {"impl": "xla"}})
  lm = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  assert [(b.mixer.impl, b.mixer.chunk_size) for b in lm.blocks] == [
      ("pallas", 16), ("xla", None)]


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
