"""``chunk_favor_attn`` (Performer's fused XLA chunk form) against the naive
recurrence of normalized linear attention on the same FAVOR+ features."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import feature_maps, ops
from lin_attn_jax.testing import (assert_close_errors, errors_against_reference,
                               run_reference)

K, V, M = 8, 12, 32
PROJECTION = feature_maps.favor_plus_projection(jax.random.PRNGKey(9), M, K)


def _naive(q, k, v, initial_state, segment_ids, output_final_state):
  fq, fk = ops.favor_features(q, k, PROJECTION)
  return ops.naive_recurrent_linear_attn(
      fq, fk, v, scale=1.0, normalize=True, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids)


def _inputs(length, init, seg):
  keys = jax.random.split(jax.random.PRNGKey(length), 5)
  b, h = 2, 2
  inputs = {
      "q": jax.random.normal(keys[0], (b, length, h, K)),
      "k": jax.random.normal(keys[1], (b, length, h, K)),
      "v": jax.random.normal(keys[2], (b, length, h, V)),
      "initial_state": (jax.random.uniform(keys[3], (b, h, M, V + 1))
                        if init else None),
      "segment_ids": (jnp.sort(jax.random.randint(keys[4], (b, length), 0, 4),
                               axis=1) if seg else None),
  }
  return inputs


# (length, initial state, segment ids, chunk size, dtype): odd lengths pad
# the last chunk; one chunk, several, and documents across chunk borders.
CASES = [
    (1, True, False, 16, jnp.float32),
    (45, True, True, 16, jnp.float32),
    (64, False, False, 16, jnp.float32),
    (45, False, True, 64, jnp.float32),
    (45, True, True, 16, jnp.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_chunk_favor_attn_matches_naive(case):
  length, init, seg, chunk, dtype = case
  inputs = _inputs(length, init, seg)
  reference = functools.partial(_naive, output_final_state=True)
  grad_args = ("q", "k", "v") + (("initial_state",) if init else ())
  expected = run_reference(reference, inputs, grad_args=grad_args,
                           dtype=dtype, cotangent_seed=length)
  form = functools.partial(ops.chunk_favor_attn, projection=PROJECTION,
                           output_final_state=True, chunk_size=chunk)
  errors = errors_against_reference(
      form, reference, inputs, grad_args=grad_args, dtype=dtype,
      cotangent_seed=length, reference_result=expected)
  tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5
  assert_close_errors(errors, tol, tol, f"favor {case}")


def test_chunk_favor_attn_traced_projection_and_bad_shapes():
  inputs = _inputs(20, True, True)

  @jax.jit
  def loss(projection, q):
    o, s = ops.chunk_favor_attn(q, inputs["k"], inputs["v"], projection,
                                initial_state=inputs["initial_state"],
                                output_final_state=True,
                                segment_ids=inputs["segment_ids"],
                                chunk_size=8)
    return jnp.sum(o ** 2) + jnp.sum(s)

  grads = jax.grad(loss, argnums=(0, 1))(PROJECTION, inputs["q"])
  assert all(np.all(np.isfinite(np.asarray(g))) and float(jnp.max(jnp.abs(g)))
             > 0 for g in grads)
  with pytest.raises(ValueError, match="projection"):
    ops.chunk_favor_attn(inputs["q"], inputs["k"], inputs["v"],
                         PROJECTION[:, :5])
  with pytest.raises(ValueError, match="initial_state"):
    ops.chunk_favor_attn(inputs["q"], inputs["k"], inputs["v"], PROJECTION,
                         initial_state=inputs["initial_state"][..., :V])
