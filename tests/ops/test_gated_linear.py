"""Every form of every gated-linear-attention variant against its naive form."""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.registry import Dims, core_specs

SPEC_BY_NAME = {spec.name: spec for spec in core_specs("gated_linear")}

# A covering set: every value of every dimension appears, and the hard ones
# (odd lengths, segments, initial state, strong gates) appear together.
# (length, strong gates, initial state, segment ids, chunk size, dtype)
CASES = [
    (1, False, True, False, 64, jnp.float32),
    (63, True, True, True, 16, jnp.float32),
    (64, False, False, True, 64, jnp.float32),
    (200, True, True, True, 64, jnp.float32),
    (200, False, False, False, 16, jnp.float32),
    (63, True, True, True, 16, jnp.bfloat16),
    (200, False, True, False, 64, jnp.bfloat16),
]


def _case_id(case):
  t, strong, init, seg, chunk, dtype = case
  return (f"T{t}-{'strong' if strong else 'gentle'}-{'init' if init else 'noinit'}"
          f"-{'seg' if seg else 'noseg'}-C{chunk}-{jnp.dtype(dtype).name}")


# In the fast suite: the core's two gates, GLA's per channel and Simple
# GLA's scalar, in the hard case in float32 and in bfloat16 (and Simple
# GLA's without an initial state); every other variant (the same core code
# under its own inputs) in the hard case. The rest of each variant's set
# is in the slow suite.
CASES_BY_OP = {
    "gla": ([CASES[1], CASES[5]], [CASES[0], CASES[2], CASES[3]]),
    "simple_gla": ([CASES[1], CASES[2], CASES[5]], [CASES[0], CASES[3]]),
    "linear_attn": ([CASES[1]], [CASES[4], CASES[5]]),
    "retention": ([CASES[3]], [CASES[0], CASES[6]]),
    "linear_attn_normalized": ([CASES[1]], [CASES[6]]),
    "based": ([CASES[3]], [CASES[5], CASES[6]]),
    "mlstm": ([CASES[1]], [CASES[0], CASES[5]]),
    "mamba3": ([CASES[1]], [CASES[0], CASES[5]]),
    "mamba3_mimo": ([CASES[1]], [CASES[5]]),
    "mesa_net": ([CASES[1]], ()),
    # Offsets, level caps, continuation: tests/ops/test_log_linear_attn.py.
    "log_linear_attn": ((), ()),
}


@pytest.mark.parametrize(
    "op, case",
    [(op, case) for op in sorted(CASES_BY_OP) for case in CASES_BY_OP[op][0]]
    + [pytest.param(op, case, marks=pytest.mark.slow)
       for op in sorted(CASES_BY_OP) for case in CASES_BY_OP[op][1]],
    ids=lambda x: x if isinstance(x, str) else _case_id(x))
def test_forms_match_naive(op, case):
  """All forms of ``op`` against its naive form: outputs, state, gradients."""
  check_forms(op, case)


def test_chunk_outputs_over_groups_of_chunks(monkeypatch):
  """Long sequences map the chunk form's in-chunk outputs over groups of
  chunks (rematerialised); here groups of 2 chunks, the last one padded."""
  module = importlib.import_module("lin_attn_jax.ops.gated_linear.chunk")
  monkeypatch.setattr(module, "chunks_per_group", lambda chunk: 2)
  check_forms("gla", CASES[1], forms=("chunk",))


def check_forms(op, case, forms=None):
  length, strong, init, seg, chunk, dtype = case
  testing.check_forms(
      SPEC_BY_NAME[op], dims=Dims(batch=2, length=length, heads=2, dim_k=16,
                                  dim_v=24),
      strong=strong, initial_state=init, segment_ids=seg, chunk_size=chunk,
      dtype=dtype, forms=forms, seed=length)


@pytest.mark.parametrize("op", ["simple_gla", "gla"])
def test_long_strong_gates_stay_finite(op):
  """T=8192 with log-decays down to ~-100 per token: no NaN/Inf anywhere."""
  spec = SPEC_BY_NAME[op]
  dims = Dims(batch=1, length=8192, heads=1, dim_k=16, dim_v=16)
  inputs = spec.make_inputs(jax.random.PRNGKey(0), dims, True)
  assert float(jnp.min(inputs["g"])) < -60.0
  chunk = spec.forms["chunk"]

  def loss(q, k, v, g, s0):
    o, s = chunk(q=q, k=k, v=v, g=g, initial_state=s0,
                 segment_ids=inputs["segment_ids"], output_final_state=True)
    return jnp.sum(o) + jnp.sum(s), (o, s)

  grads, (o, s) = jax.jit(jax.grad(loss, argnums=range(5), has_aux=True))(
      inputs["q"], inputs["k"], inputs["v"], inputs["g"],
      inputs["initial_state"])
  for x in (o, s, *grads):
    assert np.all(np.isfinite(np.asarray(x)))
  assert float(jnp.max(jnp.abs(o))) > 0.0


def test_chunk_size_does_not_change_results():
  spec = SPEC_BY_NAME["gla"]
  inputs = spec.make_inputs(jax.random.PRNGKey(3), Dims(length=150), True)
  outs = [jax.jit(functools.partial(spec.forms["chunk"], chunk_size=c,
                                    output_final_state=True))(**inputs)
          for c in (16, 32, 128)]
  for o, s in outs[1:]:
    np.testing.assert_allclose(o, outs[0][0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(s, outs[0][1], rtol=2e-5, atol=2e-5)


def test_segment_reset_equals_separate_documents():
  """Packing two documents with segment ids == running them one by one."""
  spec = SPEC_BY_NAME["gla"]
  inputs = spec.make_inputs(jax.random.PRNGKey(4), Dims(batch=1, length=90),
                            False)
  seg = jnp.concatenate([jnp.zeros((1, 40), jnp.int32),
                         jnp.ones((1, 50), jnp.int32)], axis=1)
  chunk = jax.jit(functools.partial(ops.chunk_gla, chunk_size=16))
  packed, _ = chunk(inputs["q"], inputs["k"], inputs["v"], inputs["g"],
                    segment_ids=seg)
  first, _ = chunk(*(inputs[n][:, :40] for n in "qkvg"))
  second, _ = chunk(*(inputs[n][:, 40:] for n in "qkvg"))
  np.testing.assert_allclose(packed, jnp.concatenate([first, second], 1),
                             rtol=1e-5, atol=1e-5)


def test_step_continues_a_prefix():
  """Chunk form on a prefix, then step forms, equal the chunk form on all."""
  spec = SPEC_BY_NAME["gla"]
  inputs = spec.make_inputs(jax.random.PRNGKey(5), Dims(batch=2, length=40),
                            False)
  q, k, v, g = (inputs[n] for n in "qkvg")
  chunk = jax.jit(functools.partial(ops.chunk_gla, output_final_state=True))
  full, _ = chunk(q, k, v, g)
  _, state = chunk(q[:, :30], k[:, :30], v[:, :30], g[:, :30])
  step = jax.jit(ops.gla_step)
  for t in range(30, 40):
    o_t, state = step(q[:, t], k[:, t], v[:, t], g[:, t], state)
    np.testing.assert_allclose(o_t, full[:, t], rtol=1e-5, atol=1e-5)


def test_retention_decay_values():
  from lin_attn_jax.ops.retention import retention_log_decay
  np.testing.assert_allclose(np.exp(retention_log_decay(3)),
                             [1 - 2.0 ** -5, 1 - 2.0 ** -6, 1 - 2.0 ** -7],
                             rtol=1e-7)


def test_normalized_linear_attention_definition():
  """normalize=True is (q.S) / (q.sum k) with positive features."""
  key = jax.random.PRNGKey(6)
  q, k, v = (jax.nn.elu(jax.random.normal(kk, (1, 20, 1, 4))) + 1
             for kk in jax.random.split(key, 3))
  o, _ = jax.jit(lambda *x: ops.chunk_linear_attn(
      *x, normalize=True, chunk_size=16))(q, k, v)
  scores = jnp.tril(jnp.einsum("bihk,bjhk->bhij", q, k))
  expected = jnp.einsum("bhij,bjhv->bihv", scores, v) / (
      jnp.sum(scores, -1)[..., None].transpose(0, 2, 1, 3))
  np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-6)


def test_every_op_has_cases():
  assert set(CASES_BY_OP) == set(SPEC_BY_NAME)
