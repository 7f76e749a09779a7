"""``ops.common.variant.Variant``: a variant's forms built from its core's."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops.common.variant import Variant, form_name
from lin_attn_jax.ops.gated_linear import (chunk_gated_linear,
                                           gated_linear_step)


def _doubled_values(step, q, k, v, g, factor):
  del step
  return q, k, factor * v, g


DOUBLED = Variant(name="doubled", params=("q", "k", "v", ("g", None)),
                  core_arity=4, to_core=_doubled_values,
                  keywords=(("factor", 2.0),), step_keywords=("g",),
                  from_core=lambda out, **_: (out[0] + 1.0, out[1]),
                  fixed=(("strictly_causal", False),))


def _inputs(t=7):
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(keys[i], (1, t, 2, 4)) for i in range(3))
  g = -jax.nn.softplus(jax.random.normal(keys[3], (1, t, 2)))
  return q, k, v, g


def test_form_names():
  assert [form_name("x", f) for f in
          ("naive", "parallel", "chunk", "recurrent", "step")] == [
              "naive_recurrent_x", "parallel_x", "chunk_x", "recurrent_x",
              "x_step"]
  with pytest.raises(ValueError, match="form must be one of"):
    form_name("x", "fused")


def test_built_form_has_the_form_files_name_module_and_signature():
  chunk = DOUBLED.form(chunk_gated_linear, "pkg.doubled.chunk", "Doc.")
  assert chunk.__name__ == "chunk_doubled"
  assert chunk.__module__ == "pkg.doubled.chunk"
  assert chunk.__doc__ == "Doc."
  params = inspect.signature(chunk).parameters
  assert list(params)[:4] == ["q", "k", "v", "g"]
  assert params["factor"].kind == inspect.Parameter.KEYWORD_ONLY
  assert "strictly_causal" not in params
  assert params["chunk_size"].default == 64
  step = DOUBLED.form(gated_linear_step, "pkg.doubled.step", "Doc.")
  assert step.__name__ == "doubled_step"
  step_params = inspect.signature(step).parameters
  assert list(step_params)[:4] == ["q", "k", "v", "state"]
  assert step_params["g"].kind == inspect.Parameter.KEYWORD_ONLY


def test_built_form_maps_arguments_and_outputs():
  q, k, v, g = _inputs()
  chunk = DOUBLED.form(chunk_gated_linear, "pkg.doubled.chunk", "")
  o, state = chunk(q, k, v, g, factor=3.0, output_final_state=True,
                   chunk_size=4)
  o_ref, state_ref = chunk_gated_linear(q, k, 3.0 * v, g,
                                        output_final_state=True, chunk_size=4)
  np.testing.assert_allclose(o, o_ref + 1.0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(state, state_ref, rtol=1e-5, atol=1e-5)
  step = DOUBLED.form(gated_linear_step, "pkg.doubled.step", "")
  o_t, _ = step(q[:, 0], k[:, 0], v[:, 0], None, g=g[:, 0])
  o_t_ref, _ = gated_linear_step(q[:, 0], k[:, 0], 2.0 * v[:, 0], g[:, 0])
  np.testing.assert_allclose(o_t, o_t_ref + 1.0, rtol=1e-5, atol=1e-5)


def test_built_form_refuses_unknown_and_fixed_arguments():
  q, k, v, g = _inputs()
  chunk = DOUBLED.form(chunk_gated_linear, "pkg.doubled.chunk", "")
  with pytest.raises(TypeError):
    chunk(q, k, v, g, chunk_sise=4)
  with pytest.raises(TypeError):
    chunk(q, k, v, g, strictly_causal=True)


def test_variant_forms_of_the_package_run_through_the_adapter():
  from lin_attn_jax import ops
  q, k, v, g = _inputs()
  gk = jnp.broadcast_to(g[..., None], q.shape)
  o, _ = ops.chunk_gla(q, k, v, gk, chunk_size=4)
  o_ref, _ = chunk_gated_linear(q, k, v, gk, chunk_size=4)
  np.testing.assert_allclose(o, o_ref, rtol=1e-6, atol=1e-6)
  o, _ = ops.linear_attn_step(jnp.abs(q[:, 0]), jnp.abs(k[:, 0]), v[:, 0],
                              normalize=True)
  num, _ = gated_linear_step(jnp.abs(q[:, 0]), jnp.abs(k[:, 0]), v[:, 0])
  den = jnp.sum(jnp.abs(q[:, 0]) * jnp.abs(k[:, 0]), -1, keepdims=True) * (
      q.shape[-1] ** -0.5)
  np.testing.assert_allclose(o, num / (den + 1e-6), rtol=1e-5, atol=1e-5)
