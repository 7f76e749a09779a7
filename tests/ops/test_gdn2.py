"""Gated DeltaNet-2: every form against the naive recurrence (outputs,
final states, all gradients), the naive recurrence against
flash-linear-attention's ``naive.py`` (committed fixture), the reduction to
KDA, the Pallas sweep in interpret mode, and bad inputs."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.registry import Dims
from lin_attn_jax.testing import assert_close_errors, rel_rms
from tests.ops import variant_checks

FIXTURE = (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ops"
           / "gdn2.npz")
SPEC = registry.get_spec("gdn2")
ARGS = ("q", "k", "v", "g", "b", "w")


def test_forms_match_naive_strong_gates():
  """Odd T over several chunks, strong per-channel decays, erase gates up
  to 2 (negative eigenvalues), packed documents, an initial state, K !=
  V: every form, the step included."""
  testing.check_forms(SPEC, dims=Dims(length=45, dim_k=8, dim_v=12),
                      strong=True, chunk_size=16, one_program=True)


@pytest.mark.slow
def test_forms_match_naive_grouped_heads_bfloat16():
  """Two value heads per query/key head (raw keys, normalised by the op)
  and bfloat16 inputs."""
  rng = np.random.default_rng(1)
  b, t, h, hv, dk, dv = 2, 21, 1, 2, 8, 6
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  sigmoid = lambda x: 1.0 / (1.0 + np.exp(-x))
  inputs = dict(q=normal(b, t, h, dk), k=normal(b, t, h, dk),
                v=normal(b, t, hv, dv),
                g=-np.logaddexp(0.0, -normal(b, t, hv, dk)) / 0.05,
                b=2.0 * sigmoid(normal(b, t, hv, dk)),
                w=sigmoid(normal(b, t, hv, dv)),
                initial_state=normal(b, hv, dk, dv),
                segment_ids=np.cumsum(rng.random((b, t)) < 0.1, axis=1))
  testing.check_forms(SPEC, inputs=inputs, chunk_size=8, one_program=True,
                      forms=("parallel", "chunk", "step"))
  testing.check_forms(SPEC, inputs=inputs, chunk_size=8, one_program=True,
                      dtype=jnp.bfloat16, forms=("chunk", "recurrent"))


@pytest.mark.parametrize("case", ["gentle", "strong"])
def test_naive_matches_fla_naive(case):
  """``naive_recurrent_gdn2`` against fla's ``naive_recurrent_gdn2`` (torch,
  float32; ``python -m experiments.make_op_fixtures --only=gdn2``):
  outputs, final state and the gradients of every input."""
  data = {name[len(case) + 1:]: x for name, x in np.load(FIXTURE).items()
          if name.startswith(case + "_")}
  errors = testing.errors_against_fixture(ops.naive_recurrent_gdn2, data,
                                          ARGS)
  assert set(errors) >= {"o", "state", "dq", "dk", "dv", "dg", "db", "dw"}
  assert_close_errors(errors, 1e-5, label=f"gdn2/{case}")


def test_scalar_gates_are_kda():
  """``b = w = beta`` (one value per token and head) is KDA."""
  inputs = registry.get_spec("kda").make_inputs(
      jax.random.PRNGKey(2), Dims(length=24, dim_k=8, dim_v=6), True)
  beta = inputs.pop("beta")
  dk, dv = inputs["k"].shape[-1], inputs["v"].shape[-1]
  b = jnp.repeat(beta[..., None], dk, axis=-1)
  w = jnp.repeat(beta[..., None], dv, axis=-1)
  options = dict(output_final_state=True, use_qk_l2norm=True, chunk_size=8)

  @jax.jit
  def both(inputs):
    return (ops.chunk_gdn2(**inputs, b=b, w=w, **options),
            ops.chunk_kda(**inputs, beta=beta, **options))

  (o, state), (o_kda, state_kda) = both(inputs)
  assert_close_errors({"o": rel_rms(o, o_kda),
                       "state": rel_rms(state, state_kda)}, 1e-6,
                      label="gdn2 as kda")


def test_pallas_sweep_matches_naive_on_cpu():
  """``impl="pallas"``: the delta-rule core's sweep kernels (interpret mode
  on CPU), outputs, final state and gradients."""
  variant_checks.check_pallas_sweep(SPEC, ops.chunk_gdn2)


def _inputs(bs=2, t=5, h=2, hv=4, dk=8, dv=6):
  x = jnp.ones
  return dict(q=x((bs, t, h, dk)), k=x((bs, t, h, dk)), v=x((bs, t, hv, dv)),
              g=-x((bs, t, hv, dk)), b=x((bs, t, hv, dk)),
              w=x((bs, t, hv, dv)))


@pytest.mark.parametrize("change, match", [
    (dict(b=jnp.ones((2, 5, 4, 6))), r"b must have shape \(2, 5, 4, 8\)"),
    (dict(w=jnp.ones((2, 5, 4, 8))), r"w must have shape \(2, 5, 4, 6\)"),
    (dict(w=jnp.ones((2, 5, 4, 6), jnp.int32)), "w must have a floating"),
    (dict(g=jnp.ones((2, 5, 4, 8))), "g holds log-decays"),
    (dict(g=-jnp.ones((2, 5, 4))), r"g must have shape \(2, 5, 4, 8\)"),
    (dict(v=jnp.ones((2, 5, 3, 6))), "HV=3"),
    (dict(k=jnp.ones((2, 5, 2, 7))), "k must have the shape of q"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 6))), "initial_state"),
    (dict(segment_ids=jnp.zeros((2, 4), jnp.int32)), "segment_ids"),
])
def test_bad_input_raises(change, match):
  variant_checks.check_forms_raise(SPEC, {**_inputs(), **change}, match)


def test_bad_step_input_raises():
  token = {n: x[:, 0] for n, x in _inputs().items()}
  with pytest.raises(ValueError, match=r"b must have shape \(2, 4, 8\)"):
    ops.gdn2_step(**{**token, "b": token["b"][..., :4]})
  with pytest.raises(ValueError, match="state must have shape"):
    ops.gdn2_step(**token, state=jnp.zeros((2, 4, 6, 8)))
  with pytest.raises(ValueError, match="impl must be one of"):
    ops.chunk_gdn2(**_inputs(), impl="triton")


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_pallas_exports_the_sweep_kernels(platform):
  """``impl="pallas"`` lowers the forward and backward to the core's sweep
  kernels on TPU (Mosaic) and CUDA (Triton), from a CPU-only machine."""
  variant_checks.check_pallas_exports(SPEC, ops.chunk_gdn2, platform)
