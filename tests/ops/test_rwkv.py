"""RWKV-6 and RWKV-7 forms against their naive recurrences: outputs, final
states and the gradients of every input.

A covering set of cases, each checking several forms against one naive
run: T in {63, 64, 200}, K != V, with and without initial state and segment
ids, gentle and strong decays, and for RWKV-7 in-context learning rates in
(0, 1) and in (0, 2). The recurrent forms are the decoding steps scanned
over time, so they check the steps too. T = 1 and grouped heads are covered
by the delta-rule tests, whose chunk stages RWKV-7 shares.
"""

from __future__ import annotations

import dataclasses
import importlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops import rwkv6, rwkv7
from lin_attn_jax.testing import (assert_close_errors, errors_against_reference,
                               run_reference)

FORMS = {
    "rwkv6": {
        "naive": rwkv6.naive_recurrent_rwkv6,
        "parallel": rwkv6.parallel_rwkv6,
        "chunk": rwkv6.chunk_rwkv6,
        "recurrent": rwkv6.recurrent_rwkv6,
    },
    "rwkv7": {
        "naive": rwkv7.naive_recurrent_rwkv7,
        "parallel": rwkv7.parallel_rwkv7,
        "chunk": rwkv7.chunk_rwkv7,
        "recurrent": rwkv7.recurrent_rwkv7,
    },
}
GRAD_ARGS = {
    "rwkv6": ("r", "k", "v", "w", "u", "initial_state"),
    "rwkv7": ("r", "w", "k", "v", "a", "b", "initial_state"),
}
TOL = {"rwkv6": 1e-5, "rwkv7": 1e-4}


@dataclasses.dataclass(frozen=True)
class Case:
  op: str
  length: int
  heads: int = 2
  dim_k: int = 8
  dim_v: int = 12
  initial_state: bool = True
  segments: bool = False
  strong: bool = False      # decays log_sigmoid(x) / 0.05 (else / 1)
  rate_max: float = 1.0     # RWKV-7's in-context learning rate in (0, max)
  chunk_size: int = 64
  sub_chunk_size: int = 16
  min_log_decay: float | None = None  # RWKV-7's bound: w drawn above it
  forms: tuple[str, ...] = ("parallel", "chunk", "recurrent")
  bfloat16: tuple[str, ...] = ()  # forms also run with bfloat16 inputs

  def __str__(self):
    decays = "strong" if self.strong else "gentle"
    return (f"{self.op}-T{self.length}-init{int(self.initial_state)}"
            f"-seg{int(self.segments)}-{decays}-rate{self.rate_max:g}"
            f"-C{self.chunk_size}"
            + ("" if self.min_log_decay is None else "-bounded"))


# Every case compiles each of its forms once; the cover is spread over them.
CASES = [
    Case("rwkv6", 63, segments=True, strong=True, chunk_size=16,
         sub_chunk_size=8, bfloat16=("chunk", "recurrent")),
    Case("rwkv6", 200, initial_state=False, dim_k=12, dim_v=8,
         forms=("chunk", "recurrent")),
    Case("rwkv7", 200, segments=True, strong=True, rate_max=2.0,
         bfloat16=("chunk", "recurrent")),
    Case("rwkv7", 64, initial_state=False, chunk_size=32, sub_chunk_size=8),
    # The factored intra-chunk scores, at the largest span they allow
    # (chunks of 64 with RWKV-7's bound -exp(-0.5): 38.8).
    Case("rwkv7", 200, segments=True, rate_max=2.0, forms=("chunk",),
         min_log_decay=-math.exp(-0.5), bfloat16=("chunk",)),
]


def log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def make_inputs(case: Case, seed: int, strong=None, rate_max=None):
  """Random inputs (numpy's generator: no compilation per shape)."""
  strong = case.strong if strong is None else strong
  rate_max = case.rate_max if rate_max is None else rate_max
  b, t, h, dk, dv = 2, case.length, case.heads, case.dim_k, case.dim_v
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.standard_normal(shape, np.float32)
  w = log_sigmoid(normal(b, t, h, dk))
  if case.min_log_decay is not None:
    # RWKV-7's decay -exp(-softplus(-x) - 0.5) lies above -exp(-0.5).
    w = -np.exp(log_sigmoid(normal(b, t, h, dk) + 2.0) - 0.5)
  elif strong:
    w = w / 0.05
  inputs = {
      "r": normal(b, t, h, dk),
      "w": w,
      "k": normal(b, t, h, dk),
      "v": normal(b, t, h, dv),
  }
  if case.op == "rwkv6":
    inputs["u"] = normal(h, dk)
  else:
    kappa = normal(b, t, h, dk)
    kappa = kappa / np.linalg.norm(kappa, axis=-1, keepdims=True)
    rate = rate_max * np.exp(log_sigmoid(normal(b, t, h, dk)))
    inputs.update(a=-kappa, b=kappa * rate)
  if case.initial_state:
    inputs["initial_state"] = normal(b, h, dk, dv)
  if case.segments:
    inputs["segment_ids"] = np.cumsum(rng.random((b, t)) < 0.05, axis=1)
  return {name: jnp.asarray(x, jnp.int32 if name == "segment_ids"
                            else jnp.float32) for name, x in inputs.items()}


def bound(op, form, case):
  """The form with the case's options bound."""
  options = dict(output_final_state=True)
  if form == "chunk":
    options.update(chunk_size=case.chunk_size,
                   sub_chunk_size=case.sub_chunk_size)
    if case.min_log_decay is not None:
      options.update(min_log_decay=case.min_log_decay)
  return functools.partial(FORMS[op][form], **options)


def check_forms(case, forms, inputs, dtype, tol):
  reference = bound(case.op, "naive", case)
  grad_args = GRAD_ARGS[case.op]
  expected = run_reference(reference, inputs, grad_args=grad_args,
                           dtype=dtype)
  for form in forms:
    errors = errors_against_reference(
        bound(case.op, form, case), reference, inputs, grad_args=grad_args,
        dtype=dtype, reference_result=expected)
    assert_close_errors(errors, tol, label=f"{form} {case} {dtype.__name__}")


# The cases without an initial state are slow: each op's hard case has one
# and the other tests of this file start from zeros.
@pytest.mark.parametrize("case", [
    pytest.param(c, id=str(c), marks=() if c.initial_state
                 else pytest.mark.slow) for c in CASES])
def test_forms_match_naive_float32(case):
  check_forms(case, case.forms, make_inputs(case, 0), jnp.float32,
              TOL[case.op])


@pytest.mark.parametrize("case", [
    pytest.param(c, id=str(c), marks=pytest.mark.slow
                 if c.min_log_decay is not None else ())
    for c in CASES if c.bfloat16])
def test_forms_match_naive_bfloat16(case):
  inputs = make_inputs(case, 7, strong=True, rate_max=2.0)
  check_forms(case, case.bfloat16, inputs, jnp.bfloat16, 1e-2)


def _step_inputs(arrays, names, t):
  return [arrays[n] if n == "u" else arrays[n][:, t] for n in names]


@pytest.mark.parametrize("op, step, names", [
    ("rwkv6", rwkv6.rwkv6_step, ("r", "k", "v", "w", "u")),
    ("rwkv7", rwkv7.rwkv7_step, ("r", "w", "k", "v", "a", "b")),
])
def test_steps_with_resets_match_naive(op, step, names):
  inputs = make_inputs(Case(op, 6), 0, strong=False, rate_max=1.0)
  segment_ids = jnp.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 2]], jnp.int32)
  expected, expected_state = jax.jit(bound(op, "naive", Case(op, 6)))(
      **inputs, segment_ids=segment_ids)
  step = jax.jit(step)
  arrays = {name: np.asarray(x) for name, x in inputs.items()}
  ids = np.asarray(segment_ids)
  state = arrays["initial_state"]
  for t in range(6):
    reset = ids[:, t] != ids[:, max(t - 1, 0)]
    o, state = step(*_step_inputs(arrays, names, t), state, reset=reset)
    np.testing.assert_allclose(o, expected[:, t], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(state, expected_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [
    pytest.param(op, marks=() if op == "rwkv7" else pytest.mark.slow)
    for op in FORMS])
def test_long_sequence_strong_decay_is_finite(op):
  """T = 8192 with strong decays: the chunk form and its gradients."""
  case = Case(op, 8192, heads=1, dim_k=4, dim_v=4, segments=True)
  inputs = make_inputs(case, 3, strong=True, rate_max=2.0)
  segment_ids = inputs.pop("segment_ids")
  chunk = functools.partial(FORMS[op]["chunk"], segment_ids=segment_ids,
                            output_final_state=True)

  def loss(diff):
    o, state = chunk(**diff)
    return jnp.sum(o * o) + jnp.sum(state)

  value, grads = jax.jit(jax.value_and_grad(loss))(inputs)
  assert np.isfinite(float(value))
  for name, grad in grads.items():
    assert np.all(np.isfinite(grad)), f"d{name} has NaN/Inf"


def _rwkv6_inputs(b=2, t=5, h=2, dk=8, dv=6):
  x = jnp.ones
  return dict(r=x((b, t, h, dk)), k=x((b, t, h, dk)), v=x((b, t, h, dv)),
              w=-x((b, t, h, dk)), u=x((h, dk)))


def _rwkv7_inputs(b=2, t=5, h=2, dk=8, dv=6):
  x = jnp.ones
  return dict(r=x((b, t, h, dk)), w=-x((b, t, h, dk)), k=x((b, t, h, dk)),
              v=x((b, t, h, dv)), a=-x((b, t, h, dk)), b=x((b, t, h, dk)))


@pytest.mark.parametrize("change, match", [
    (dict(u=jnp.ones((2, 7))), "u must have shape"),
    (dict(u=jnp.ones((2, 8), jnp.int32)), "u must have a floating"),
    (dict(w=jnp.ones((2, 5, 2, 8))), "w holds log-decays"),
    (dict(w=-jnp.ones((2, 5, 2))), "w must have rank 4"),
    (dict(r=jnp.ones((2, 5, 2, 7))), "k must have the shape of r"),
    (dict(v=jnp.ones((2, 5, 3, 6))), "v must agree with r"),
    (dict(initial_state=jnp.zeros((2, 2, 6, 8))), "initial_state"),
    (dict(segment_ids=jnp.zeros((2, 5))), "segment_ids"),
])
def test_rwkv6_bad_input_raises(change, match):
  inputs = {**_rwkv6_inputs(), **change}
  for form in FORMS["rwkv6"].values():
    with pytest.raises(ValueError, match=match):
      form(**inputs)


@pytest.mark.parametrize("change, match", [
    (dict(a=jnp.ones((2, 5, 2, 7))), "a must have shape"),
    (dict(b=jnp.ones((2, 5, 2, 8), jnp.int32)), "b must have a floating"),
    (dict(w=jnp.ones((2, 5, 2, 8))), "w holds log-decays"),
    (dict(w=-jnp.ones((2, 5, 2, 1))), "w must have shape"),
    (dict(k=jnp.ones((2, 5, 2))), "k must have rank 4"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 8))), "initial_state"),
])
def test_rwkv7_bad_input_raises(change, match):
  inputs = {**_rwkv7_inputs(), **change}
  for form in FORMS["rwkv7"].values():
    with pytest.raises(ValueError, match=match):
      form(**inputs)


def test_bad_step_input_raises():
  x = jnp.ones
  with pytest.raises(ValueError, match="u must have shape"):
    rwkv6.rwkv6_step(x((2, 2, 8)), x((2, 2, 8)), x((2, 2, 6)), -x((2, 2, 8)),
                     x((8,)))
  with pytest.raises(ValueError, match="state"):
    rwkv7.rwkv7_step(x((2, 2, 8)), -x((2, 2, 8)), x((2, 2, 8)), x((2, 2, 6)),
                     x((2, 2, 8)), x((2, 2, 8)), state=x((2, 2, 6, 8)))
  with pytest.raises(ValueError, match="chunk_size"):
    rwkv7.chunk_rwkv7(**_rwkv7_inputs(), chunk_size=-1)
  for bound in (0.0, 0.5, jnp.float32(-0.5), "-0.5"):
    with pytest.raises(ValueError, match="min_log_decay"):
      rwkv7.chunk_rwkv7(**_rwkv7_inputs(), min_log_decay=bound)


def test_rwkv7_chunk_raises_decays_to_min_log_decay():
  """Log-decays below ``min_log_decay`` act as the bound itself."""
  case = Case("rwkv7", 40, chunk_size=16)
  inputs = make_inputs(case, 5, strong=True)
  inputs.pop("segment_ids", None)
  bound = -0.5
  assert float(jnp.min(inputs["w"])) < bound < float(jnp.max(inputs["w"]))

  @jax.jit
  def both(inputs):
    got = rwkv7.chunk_rwkv7(**inputs, chunk_size=16, output_final_state=True,
                            min_log_decay=bound)
    want = rwkv7.naive_recurrent_rwkv7(
        **dict(inputs, w=jnp.maximum(inputs["w"], bound)),
        output_final_state=True)
    return got, want

  got, want = both(inputs)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                               atol=1e-4 * float(jnp.max(jnp.abs(b))))


def test_rwkv7_chunk_local_terms_over_groups_of_chunks(monkeypatch):
  """Long sequences map RWKV-7's chunk-local terms over groups of chunks
  (rematerialised); here groups of 2 chunks, the last one padded."""
  module = importlib.import_module("lin_attn_jax.ops.rwkv7.chunk")
  monkeypatch.setattr(module, "chunks_per_group", lambda chunk: 2)
  case = Case("rwkv7", 100, segments=True, chunk_size=16, sub_chunk_size=8,
              forms=("chunk",))
  check_forms(case, case.forms, make_inputs(case, 1), jnp.float32,
              TOL["rwkv7"])
