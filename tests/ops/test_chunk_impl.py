"""``impl="auto" | "xla" | "pallas"`` on the chunk forms of the gated-linear
core and its variants."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from lin_attn_jax import ops
from lin_attn_jax.ops.common import dispatch
from lin_attn_jax.testing import assert_close_errors, rel_rms
from tests.kernels.test_kernels_gated_linear import (CUSTOM_CALLS, cpu_jit,
                                             exported_text, form_errors)

B, T, H, K, V = 1, 20, 2, 8, 8


def _inputs():
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  q = jax.random.normal(keys[0], (B, T, H, K))
  k = jax.random.normal(keys[1], (B, T, H, K))
  v = jax.random.normal(keys[2], (B, T, H, V))
  g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (B, T, H, K)))
  return q, k, v, g


def _positive(x):
  return jax.nn.elu(x) + 1.0


def _normalized(chunk):
  return lambda **x: chunk(**x, normalize=True)


# name -> (chunk form, naive form, array inputs from (q, k, v, g)).
OPS = {
    "gated_linear": (ops.chunk_gated_linear, ops.naive_recurrent_gated_linear,
                     lambda q, k, v, g: dict(q=q, k=k, v=v, g=g)),
    "linear_attn": (_normalized(ops.chunk_linear_attn),
                    _normalized(ops.naive_recurrent_linear_attn),
                    lambda q, k, v, g: dict(q=_positive(q), k=_positive(k),
                                            v=v)),
    "simple_gla": (ops.chunk_simple_gla, ops.naive_recurrent_simple_gla,
                   lambda q, k, v, g: dict(q=q, k=k, v=v, g=g[..., 0])),
    "retention": (ops.chunk_retention, ops.naive_recurrent_retention,
                  lambda q, k, v, g: dict(q=q, k=k, v=v)),
    "gla": (ops.chunk_gla, ops.naive_recurrent_gla,
            lambda q, k, v, g: dict(q=q, k=k, v=v, g=g)),
    "based": (ops.chunk_based, ops.naive_recurrent_based,
              lambda q, k, v, g: dict(q=q[..., :4], k=k[..., :4], v=v)),
}


def _call(name, impl, **overrides):
  chunk, _, make = OPS[name]
  return chunk(**{**make(*_inputs()), **overrides}, impl=impl)


@pytest.mark.parametrize("name", sorted(OPS))
def test_invalid_impl_raises(name):
  with pytest.raises(ValueError, match="impl must be one of"):
    _call(name, "triton")


@pytest.mark.parametrize("name", sorted(OPS))
def test_auto_runs_xla_on_cpu(name, monkeypatch):
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "cpu")
  chunk, _, make = OPS[name]
  jaxpr = jax.make_jaxpr(lambda x: chunk(**x, impl="auto"))(make(*_inputs()))
  assert "pallas_call" not in str(jaxpr)


@pytest.mark.parametrize("name", sorted(OPS))
def test_pallas_matches_naive_on_cpu(name):
  """On CPU, impl="pallas" runs the kernel in interpret mode."""
  chunk, naive, make = OPS[name]
  inputs = make(*_inputs())
  o, state = cpu_jit(lambda x: chunk(**x, impl="pallas",
                                     output_final_state=True))(inputs)
  ref_o, ref_state = naive(**inputs, output_final_state=True)
  assert_close_errors({"o": rel_rms(o, ref_o),
                       "state": rel_rms(state, ref_state)}, 1e-5, label=name)


def test_pallas_gradients_through_simple_gla():
  """All gradients through a variant (a ``[B, T, H]`` gate reshaped on the
  way in), interpret mode on CPU."""
  q, k, v, g = _inputs()
  errors = form_errors(
      lambda **x: ops.chunk_simple_gla(**x, impl="pallas",
                                       output_final_state=True),
      dict(q=q, k=k, v=v, g=g[..., 0]))
  assert_close_errors(errors, 1e-5, label="simple_gla")


def _custom_calls(text):
  return set(re.findall(r"custom_call @([\w$.]+)", text))


@pytest.mark.parametrize("name", ["simple_gla", "gla", "based"])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_pallas_exports_the_platform_kernel(name, platform):
  chunk, _, make = OPS[name]
  text = exported_text(lambda x: chunk(**x, impl="pallas"), platform,
                       make(*_inputs()))
  assert _custom_calls(text) == {CUSTOM_CALLS[platform]}


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_auto_on_an_accelerator_picks_by_platform(backend, monkeypatch):
  """With a TPU or GPU default backend, impl="auto" lowers to the kernel on
  cuda (``dispatch.AUTO_ON_CUDA``: measured faster there) and to the XLA
  form on tpu (``AUTO_ON_TPU``: not measured on a TPU) and cpu, gradients
  included."""
  monkeypatch.setattr(dispatch, "_default_backend", lambda: backend)
  assert dispatch.AUTO_ON_CUDA["gated_linear"] == "pallas"
  assert dispatch.AUTO_ON_TPU["gated_linear"] == "xla"

  def loss(q, k, v, g):
    o, state = ops.chunk_gla(q, k, v, g, impl="auto", output_final_state=True)
    return jnp.sum(o) + jnp.sum(state)

  grad = jax.grad(loss, argnums=(0, 1, 2, 3))
  for platform, calls in (("tpu", set()), ("cuda", {CUSTOM_CALLS["cuda"]}),
                          ("cpu", set())):
    assert _custom_calls(exported_text(grad, platform, *_inputs())) == calls


def test_tpu_kernels_are_not_the_default_unmeasured():
  """No TPU has run the kernels: ``impl="auto"`` keeps the XLA forms there
  for every family until a committed measurement backs a kernel."""
  assert set(dispatch.AUTO_ON_TPU.values()) == {"xla"}
  assert set(dispatch.AUTO_ON_TPU) == set(dispatch.AUTO_ON_CUDA)


@pytest.mark.parametrize("family", ["gated_linear", "delta_rule",
                                    "forgetting_attn"])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_auto_follows_the_family_table(family, platform, monkeypatch):
  """Flipping a family's entry flips what impl="auto" lowers to on that
  platform (the branches return constants that the lowered module
  shows)."""
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "gpu")
  table = {"tpu": dispatch.AUTO_ON_TPU, "cuda": dispatch.AUTO_ON_CUDA}
  for choice in ("pallas", "xla"):
    monkeypatch.setitem(table[platform], family, choice)
    text = exported_text(lambda x: x + dispatch.run(
        "auto", lambda: jnp.float32(17.0), lambda: jnp.float32(23.0),
        family=family), platform, jnp.zeros((), jnp.float32))
    assert ("2.300000e+01" in text) == (choice == "pallas"), text
    assert ("1.700000e+01" in text) == (choice == "xla"), text
