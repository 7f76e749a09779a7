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
                 "hgrn2", "mamba2", "deltanet", "gated_deltanet", "kda")


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


def test_chunk_form_passes_chunk_size_and_impl(monkeypatch):
  seen = {}

  def op(*args, chunk_size, impl):
    seen.update(chunk_size=chunk_size, impl=impl)

  base.chunk_form(op, 48, "pallas")()
  assert seen == {"chunk_size": 48, "impl": "pallas"}
  base.chunk_form(op, None, "xla")()
  expected = 16 if jax.default_backend() == "cpu" else 64
  assert seen == {"chunk_size": expected, "impl": "xla"}


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
