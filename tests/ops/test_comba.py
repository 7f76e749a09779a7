"""Comba: every form against the naive recurrence (outputs, final states,
all gradients), the naive recurrence against flash-linear-attention's two
naive forms (committed fixture), the Pallas sweep in interpret mode, and
bad inputs."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.registry import Dims
from lin_attn_jax.testing import assert_close_errors, rel_rms
from tests.ops import variant_checks

FIXTURE = (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ops"
           / "comba.npz")
SPEC = registry.get_spec("comba")
ARGS = ("q", "k", "v", "p", "g", "beta")


def test_forms_match_naive_strong_gates():
  """Odd T over several chunks, strong decays, beta up to 2, packed
  documents, an initial state, K != V: every form, the step included."""
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
  k = normal(b, t, h, dk)
  inputs = dict(q=normal(b, t, h, dk), k=k, v=normal(b, t, hv, dv),
                p=0.8 * k + 0.6 * normal(b, t, h, dk),
                g=-np.logaddexp(0.0, -normal(b, t, hv)) / 0.05,
                beta=sigmoid(normal(b, t, hv)),
                initial_state=normal(b, hv, dk, dv),
                segment_ids=np.cumsum(rng.random((b, t)) < 0.1, axis=1))
  testing.check_forms(SPEC, inputs=inputs, chunk_size=8, one_program=True,
                      forms=("parallel", "chunk", "step"))
  testing.check_forms(SPEC, inputs=inputs, chunk_size=8, one_program=True,
                      dtype=jnp.bfloat16, forms=("chunk", "recurrent"))


def _case(case):
  return {name[len(case) + 1:]: x for name, x in np.load(FIXTURE).items()
          if name.startswith(case + "_")}


@pytest.mark.parametrize(
    "case", [pytest.param("gentle", marks=pytest.mark.slow), "strong"])
def test_naive_matches_fla_chunk_reference(case):
  """``naive_recurrent_comba`` against fla's ``naive_chunk_comba`` (torch,
  float32: the recurrence of fla's kernels; ``python -m
  experiments.make_op_fixtures --only=comba``): outputs, final state and
  the gradients of every input."""
  data = _case(case)
  errors = testing.errors_against_fixture(ops.naive_recurrent_comba, data,
                                          ARGS)
  assert set(errors) >= {"o", "state", "dq", "dk", "dv", "dp", "dg", "dbeta"}
  assert_close_errors(errors, 1e-5, label=f"comba/{case}")


@pytest.mark.parametrize(
    "case", [pytest.param("gentle", marks=pytest.mark.slow), "strong"])
def test_erase_key_times_decay_is_fla_naive_recurrent(case):
  """fla's ``naive_recurrent_comba`` reads the state after the decay,
  ``(exp(g_t) S_{t-1})^T p_t``: it is ``naive_recurrent_comba`` with the
  erase key ``exp(g_t) p_t``, and differs from it with ``p_t``."""
  data = _case(case)
  initial = data["h0"] if bool(data["initial"]) else None
  inputs = {n: data[n] for n in ARGS}
  scaled = dict(inputs, p=inputs["p"] * np.exp(inputs["g"])[..., None])
  o, ht = ops.naive_recurrent_comba(**scaled, initial_state=initial,
                                    output_final_state=True)
  assert_close_errors({"o": rel_rms(o, data["o_decayed_read"]),
                       "state": rel_rms(ht, data["ht_decayed_read"])}, 1e-5,
                      label=f"comba/{case} decayed read")
  o, _ = ops.naive_recurrent_comba(**inputs, initial_state=initial)
  assert rel_rms(o, data["o_decayed_read"]) > 1e-3


@pytest.mark.slow
def test_pallas_sweep_matches_naive_on_cpu():
  """``impl="pallas"``: the delta-rule core's sweep kernels (interpret mode
  on CPU), outputs, final state and gradients."""
  variant_checks.check_pallas_sweep(SPEC, ops.chunk_comba)


def _inputs(bs=2, t=5, h=2, hv=4, dk=8, dv=6):
  x = jnp.ones
  return dict(q=x((bs, t, h, dk)), k=x((bs, t, h, dk)), v=x((bs, t, hv, dv)),
              p=x((bs, t, h, dk)), g=-x((bs, t, hv)), beta=x((bs, t, hv)))


@pytest.mark.parametrize("change, match", [
    (dict(p=jnp.ones((2, 5, 4, 8))), "p must have the shape of q"),
    (dict(p=jnp.ones((2, 5, 2, 8), jnp.int32)), "p must have a floating"),
    (dict(beta=jnp.ones((2, 5, 2))), r"beta must have shape \(2, 5, 4\)"),
    (dict(g=jnp.ones((2, 5, 4))), "g holds log-decays"),
    (dict(g=-jnp.ones((2, 5, 4, 8))), r"g must have shape \(2, 5, 4\)"),
    (dict(g=None), "g must be a log-decay"),
    (dict(v=jnp.ones((2, 5, 3, 6))), "HV=3"),
    (dict(k=jnp.ones((2, 5, 2, 7))), "k must have the shape of q"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 6))), "initial_state"),
    (dict(segment_ids=jnp.zeros((2, 4), jnp.int32)), "segment_ids"),
])
def test_bad_input_raises(change, match):
  variant_checks.check_forms_raise(SPEC, {**_inputs(), **change}, match)


def test_bad_step_input_raises():
  token = {n: x[:, 0] for n, x in _inputs().items()}
  with pytest.raises(ValueError, match="p must have the shape of q"):
    ops.comba_step(**{**token, "p": token["p"][..., :4]})
  with pytest.raises(ValueError, match="state must have shape"):
    ops.comba_step(**token, state=jnp.zeros((2, 4, 6, 8)))
  with pytest.raises(ValueError, match="impl must be one of"):
    ops.chunk_comba(**_inputs(), impl="triton")


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_pallas_exports_the_sweep_kernels(platform):
  """``impl="pallas"`` lowers the forward and backward to the core's sweep
  kernels on TPU (Mosaic) and CUDA (Triton), from a CPU-only machine."""
  variant_checks.check_pallas_exports(SPEC, ops.chunk_comba, platform)
