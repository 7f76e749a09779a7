"""Gated DeltaProduct: every form against the naive recurrence, and the
naive recurrence against flash-linear-attention's ``naive.py``.

The registry's spec (2 Householder steps per token, a scalar decay) is
checked through ``lin_attn_jax.testing.check_forms``: outputs, final states
and the gradients of every input with random cotangents, at an odd length
that spans several chunks of the interleaved sub-steps, with packed
documents and an initial state, strong gates, K != V, in float32 and
bfloat16. Another case takes 3 steps per token, grouped value heads and no
decay.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry

SPEC = registry.get_spec("gated_delta_product")
FIXTURE = (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ops"
           / "gated_delta_product.npz")
# 37 tokens of 2 sub-steps: 74 core tokens, in chunks of 16 (5 chunks, the
# last one partial).
DIMS = registry.Dims(length=37, dim_k=8, dim_v=12)


def test_forms_match_naive_float32():
  testing.check_forms(SPEC, dims=DIMS, strong=True, chunk_size=16,
                      one_program=True)


def test_forms_match_naive_bfloat16():
  testing.check_forms(SPEC, dims=DIMS, strong=True, chunk_size=16,
                      dtype=jnp.bfloat16, forms=("chunk", "recurrent"),
                      one_program=True)


def test_grouped_heads_without_decay():
  """3 steps per token, 4 value heads on 2 query/key heads, ``g=None``,
  raw keys normalised by the op."""
  rng = np.random.default_rng(1)
  b, t, n, h, hv, dk, dv = 2, 21, 3, 2, 4, 8, 6
  inputs = {
      "q": rng.standard_normal((b, t, h, dk)),
      "k": rng.standard_normal((b, t, n, h, dk)),
      "v": rng.standard_normal((b, t, n, hv, dv)),
      "g": None,
      "beta": 2 / (1 + np.exp(-rng.standard_normal((b, t, n, hv)))),
      "initial_state": rng.standard_normal((b, hv, dk, dv)),
  }
  inputs = {name: None if x is None else x.astype(np.float32)
            for name, x in inputs.items()}
  inputs["segment_ids"] = np.cumsum(rng.random((b, t)) < 0.1,
                                    axis=1).astype(np.int32)
  testing.check_forms(SPEC, inputs=inputs, chunk_size=8, one_program=True)


@pytest.mark.parametrize("case", ["gated", "plain"])
def test_naive_matches_fla_reference(case):
  """``naive_recurrent_gated_delta_product`` against fla's naive form on
  the committed fixture (``python -m experiments.make_op_fixtures
  --only=gated_delta_product``), whose inputs are in fla's interleaved
  ``[B, T N, ...]`` layout."""
  data = np.load(FIXTURE)
  x = {name[len(case) + 1:]: data[name] for name in data.files
       if name.startswith(case + "_")}
  b, t, h, dk = x["q"].shape
  n = x["k"].shape[1] // t
  per_token = {name: x[name].reshape((b, t, n) + x[name].shape[2:])
               for name in ("k", "v", "beta")}
  o, state = ops.naive_recurrent_gated_delta_product(
      x["q"], per_token["k"], per_token["v"], x.get("g"), per_token["beta"],
      initial_state=x["h0"], output_final_state=True)
  assert testing.rel_rms(o, x["o"]) <= 1e-5
  assert testing.rel_rms(state, x["s"]) <= 1e-5


B, T, N, H, K, V = 2, 5, 2, 3, 4, 6
Q = jnp.ones((B, T, H, K))
KEYS = jnp.ones((B, T, N, H, K))
VALUES = jnp.ones((B, T, N, H, V))
G = -jnp.ones((B, T, H))
BETA = jnp.ones((B, T, N, H))


@pytest.mark.parametrize("change, match", [
    (dict(k=KEYS[:, :, :, :2]), r"k must have shape \(2, 5, 2, 3, 4\)"),
    (dict(k=KEYS[:, :, :0]), r"k must hold at least one Householder step"),
    (dict(v=VALUES[:, :, :1]), r"v must agree with k on \[B, T, N\]"),
    (dict(v=jnp.ones((B, T, N, 2, V))), r"v has HV=2 heads"),
    (dict(beta=BETA[:, :, :1]), r"beta must have shape \(2, 5, 2, 3\)"),
    (dict(g=G[:, :4]), r"g must have shape \(2, 5, 3\)"),
    (dict(g=-G), r"g holds log-decays, which must be <= 0"),
    (dict(initial_state=jnp.ones((B, H, V, K))),
     r"initial_state must have shape \(2, 3, 4, 6\)"),
    (dict(segment_ids=jnp.zeros((B, T * N), jnp.int32)),
     r"segment_ids must have shape \(2, 5\)"),
])
@pytest.mark.parametrize("form", [ops.chunk_gated_delta_product,
                                  ops.naive_recurrent_gated_delta_product])
def test_bad_input_names_the_argument(form, change, match):
  arguments = dict(q=Q, k=KEYS, v=VALUES, g=G, beta=BETA)
  arguments.update(change)
  with pytest.raises(ValueError, match=match):
    form(**arguments)


def test_bad_step_input_names_the_argument():
  with pytest.raises(ValueError, match=r"state must have shape"):
    ops.gated_delta_product_step(Q[:, 0], KEYS[:, 0], VALUES[:, 0], G[:, 0],
                                 BETA[:, 0], jnp.zeros((B, H, K, K)))
  with pytest.raises(ValueError, match=r"k must have rank 4"):
    ops.gated_delta_product_step(Q[:, 0], KEYS[:, 0, 0], VALUES[:, 0],
                                 G[:, 0], BETA[:, 0])
  with pytest.raises(ValueError, match=r"reset must have shape"):
    ops.gated_delta_product_step(Q[:, 0], KEYS[:, 0], VALUES[:, 0], G[:, 0],
                                 BETA[:, 0], reset=jnp.zeros((B + 1,), bool))
