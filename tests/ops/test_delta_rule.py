"""Forms of the delta-rule core (DeltaNet, Gated DeltaNet, KDA) against the
naive recurrence: outputs, final states and the gradients of every input.

A covering set of cases, each checking several forms against one naive
run: T in {1, 63, 64, 200}, K != V, with and without initial state and
segment ids, gentle and strong gates, beta in (0, 1) and in (0, 2)
(negative eigenvalues), grouped value heads, unit-norm keys and raw keys
with ``use_qk_l2norm``, scalar and per-channel decays in every form. The
recurrent forms are the decoding steps scanned over time, so they check the
steps too.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops import delta_rule as dr
from lin_attn_jax.ops.common import chunking
from lin_attn_jax.ops import gated_delta_rule as gdr
from lin_attn_jax.ops import kda
from lin_attn_jax import testing
from lin_attn_jax.ops.registry import OpSpec

FORMS = {
    "delta_rule": {
        "naive": dr.naive_recurrent_delta_rule,
        "parallel": dr.parallel_delta_rule,
        "chunk": dr.chunk_delta_rule,
        "recurrent": dr.recurrent_delta_rule,
    },
    "gated_delta_rule": {
        "naive": gdr.naive_recurrent_gated_delta_rule,
        "parallel": gdr.parallel_gated_delta_rule,
        "chunk": gdr.chunk_gated_delta_rule,
        "recurrent": gdr.recurrent_gated_delta_rule,
    },
    "kda": {
        "naive": kda.naive_recurrent_kda,
        "parallel": kda.parallel_kda,
        "chunk": kda.chunk_kda,
        "recurrent": kda.recurrent_kda,
    },
}
GATE = {"delta_rule": None, "gated_delta_rule": "scalar", "kda": "channel"}
GRAD_ARGS = ("q", "k", "v", "beta", "g", "initial_state")


@dataclasses.dataclass(frozen=True)
class Case:
  op: str
  length: int
  heads: int = 2          # H, of q and k
  value_heads: int = 2    # HV, a multiple of H
  dim_k: int = 8
  dim_v: int = 12
  initial_state: bool = True
  segments: bool = False
  use_qk_l2norm: bool = False   # False: the keys are unit-norm already
  strong: bool = False          # gates log_sigmoid(x) / 0.05 (else / 1)
  beta_max: float = 1.0         # beta = beta_max * sigmoid(x)
  chunk_size: int = 64
  sub_chunk_size: int = 16
  forms: tuple[str, ...] = ("parallel", "chunk", "recurrent")
  bfloat16: tuple[str, ...] = ()  # forms also run with bfloat16 inputs

  def __str__(self):
    gates = "strong" if self.strong else "gentle"
    return (f"{self.op}-T{self.length}-H{self.heads}x{self.value_heads}"
            f"-init{int(self.initial_state)}-seg{int(self.segments)}"
            f"-l2{int(self.use_qk_l2norm)}-{gates}-beta{self.beta_max:g}"
            f"-C{self.chunk_size}")


# Every case compiles each of its forms once; the cover is spread over them.
CASES = [
    Case("delta_rule", 63, segments=True, beta_max=2.0, chunk_size=16,
         sub_chunk_size=8, forms=("chunk", "recurrent")),
    Case("gated_delta_rule", 200, heads=1, segments=True, use_qk_l2norm=True,
         strong=True, beta_max=2.0),
    Case("gated_delta_rule", 1, forms=("chunk", "recurrent")),
    Case("kda", 64, value_heads=4, initial_state=False, use_qk_l2norm=True,
         beta_max=2.0),
    Case("kda", 200, segments=True, strong=True,
         bfloat16=("chunk", "recurrent")),
]


def log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def sigmoid(x):
  return np.exp(log_sigmoid(x))


def make_inputs(case: Case, seed: int, strong=None, beta_max=None):
  """Random inputs (numpy's generator: no compilation per shape)."""
  strong = case.strong if strong is None else strong
  beta_max = case.beta_max if beta_max is None else beta_max
  b, t = 2, case.length
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.standard_normal(shape, np.float32)
  q = normal(b, t, case.heads, case.dim_k)
  k = normal(b, t, case.heads, case.dim_k)
  if not case.use_qk_l2norm:
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
  inputs = {
      "q": q, "k": k,
      "v": normal(b, t, case.value_heads, case.dim_v),
      "beta": beta_max * sigmoid(normal(b, t, case.value_heads)),
  }
  gate = GATE[case.op]
  if gate is not None:
    shape = (b, t, case.value_heads) + ((case.dim_k,) if gate == "channel"
                                        else ())
    g = log_sigmoid(normal(*shape))
    inputs["g"] = g / 0.05 if strong else g
  if case.initial_state:
    inputs["initial_state"] = normal(b, case.value_heads, case.dim_k,
                                     case.dim_v)
  if case.segments:
    inputs["segment_ids"] = np.cumsum(rng.random((b, t)) < 0.05, axis=1)
  return {name: jnp.asarray(x, jnp.int32 if name == "segment_ids"
                            else jnp.float32) for name, x in inputs.items()}


def bound(op, form, case):
  """The form with the case's options bound."""
  options = dict(output_final_state=True, use_qk_l2norm=case.use_qk_l2norm)
  if form == "chunk":
    options.update(chunk_size=case.chunk_size,
                   sub_chunk_size=case.sub_chunk_size)
  return functools.partial(FORMS[op][form], **options)


def check_forms(case, forms, inputs, dtype, tol):
  spec = OpSpec(str(case),
                {form: bound(case.op, form, case) for form in FORMS[case.op]},
                make_inputs=None, grad_args=GRAD_ARGS, chunked=())
  testing.check_forms(spec, inputs=inputs, dtype=dtype, forms=forms, tol=tol,
                      grad_tol=tol)


# The single token is slow: the gated-linear and diagonal-SSM sets cover a
# chunk form's one-token path.
@pytest.mark.parametrize("case", [
    pytest.param(c, id=str(c), marks=pytest.mark.slow if c.length == 1
                 else ()) for c in CASES])
def test_forms_match_naive_float32(case):
  check_forms(case, case.forms, make_inputs(case, 0), jnp.float32, 1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if c.bfloat16], ids=str)
def test_forms_match_naive_bfloat16(case):
  inputs = make_inputs(case, 7, strong=True, beta_max=2.0)
  check_forms(case, case.bfloat16, inputs, jnp.bfloat16, 1e-2)


def test_chunk_groups_match_naive(monkeypatch):
  """KDA's long chunks build their terms over groups of chunks (a map,
  rematerialised): with groups of 2 chunks of 32, 7 chunks per row (the
  last group padded) and documents across groups, the chunk form still
  matches the naive recurrence."""
  monkeypatch.setattr(chunking, "GROUP_FLOATS", 2 * 32 * 2 * 32)
  case = Case("kda", 200, segments=True, chunk_size=32, sub_chunk_size=8,
              forms=("chunk",))
  inputs = make_inputs(case, 3)
  form = bound(case.op, "chunk", case)
  assert "remat" in str(jax.make_jaxpr(lambda x: form(**x))(inputs))
  check_forms(case, case.forms, inputs, jnp.float32, 1e-5)


def test_steps_with_resets_match_naive():
  case = Case("gated_delta_rule", 6, value_heads=4, use_qk_l2norm=True)
  inputs = make_inputs(case, 0, strong=False, beta_max=2.0)
  segment_ids = jnp.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 2]], jnp.int32)
  expected, expected_state = jax.jit(bound(case.op, "naive", case))(
      **inputs, segment_ids=segment_ids)
  step = jax.jit(functools.partial(gdr.gated_delta_rule_step,
                                   use_qk_l2norm=True))
  arrays = {name: np.asarray(x) for name, x in inputs.items()}
  ids = np.asarray(segment_ids)
  state = arrays["initial_state"]
  for t in range(case.length):
    reset = ids[:, t] != ids[:, max(t - 1, 0)]
    o, state = step(*(arrays[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                    state, reset=reset)
    np.testing.assert_allclose(o, expected[:, t], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(state, expected_state, rtol=1e-5, atol=1e-5)


def test_step_without_state_starts_from_zeros():
  inputs = make_inputs(Case("kda", 1, initial_state=False), 0, False, 1.0)
  expected, _ = kda.naive_recurrent_kda(**inputs)
  o, state = kda.kda_step(*(inputs[n][:, 0] for n in ("q", "k", "v", "g",
                                                       "beta")))
  np.testing.assert_allclose(o, expected[:, 0], rtol=1e-5, atol=1e-6)
  assert state.shape == (2, 2, 8, 12) and state.dtype == jnp.float32


# KDA's per-channel decay in the fast suite, the others (scalar and no
# decay, the same chunk sweep) in the slow one.
@pytest.mark.parametrize("op", [
    pytest.param(op, marks=() if op == "kda" else pytest.mark.slow)
    for op in FORMS])
def test_long_sequence_strong_gates_is_finite(op):
  """T = 8192 with strong gates and beta up to 2: chunk form and gradients."""
  case = Case(op, 8192, heads=1, value_heads=1, dim_k=4, dim_v=4,
              segments=True, use_qk_l2norm=True)
  inputs = make_inputs(case, 3, strong=True, beta_max=2.0)
  segment_ids = inputs.pop("segment_ids")
  chunk = functools.partial(FORMS[op]["chunk"], segment_ids=segment_ids,
                            output_final_state=True, use_qk_l2norm=True)

  def loss(diff):
    o, state = chunk(**{**inputs, **diff})
    return jnp.sum(o * o) + jnp.sum(state)

  diff = {n: inputs[n] for n in GRAD_ARGS if n in inputs}
  value, grads = jax.jit(jax.value_and_grad(loss))(diff)
  assert np.isfinite(float(value))
  for name, grad in grads.items():
    assert np.all(np.isfinite(grad)), f"d{name} has NaN/Inf"


def _inputs(b=2, t=5, h=2, hv=4, dk=8, dv=6, gate=None):
  x = jnp.ones
  inputs = dict(q=x((b, t, h, dk)), k=x((b, t, h, dk)), v=x((b, t, hv, dv)),
                beta=x((b, t, hv)))
  if gate == "scalar":
    inputs["g"] = -x((b, t, hv))
  elif gate == "channel":
    inputs["g"] = -x((b, t, hv, dk))
  return inputs


@pytest.mark.parametrize("change, match", [
    (dict(beta=jnp.ones((2, 5, 2))), "beta"),
    (dict(beta=jnp.ones((2, 5, 4), jnp.int32)), "beta"),
    (dict(v=jnp.ones((2, 5, 3, 6))), "HV=3"),
    (dict(k=jnp.ones((2, 5, 2, 7))), "k must have the shape of q"),
    (dict(v=jnp.ones((2, 4, 4, 6))), "v must agree with q"),
    (dict(q=jnp.ones((2, 5, 8))), "q must have rank 4"),
    (dict(q=jnp.ones((2, 5, 2, 8), jnp.int32)), "q must have a floating"),
    (dict(g=jnp.ones((2, 5, 4))), "g holds log-decays"),
    (dict(g=-jnp.ones((2, 5, 2))), "g must have shape"),
    (dict(initial_state=jnp.zeros((2, 2, 8, 6))), "initial_state"),
    (dict(segment_ids=jnp.zeros((2, 4), jnp.int32)), "segment_ids"),
])
def test_bad_input_raises(change, match):
  inputs = {**_inputs(), **change}
  for form in FORMS["delta_rule"].values():
    with pytest.raises(ValueError, match=match):
      form(**inputs)


def test_variants_check_the_gate_kind():
  with pytest.raises(ValueError, match="g must have rank 3"):
    gdr.chunk_gated_delta_rule(**_inputs(gate="channel"))
  with pytest.raises(ValueError, match="g must have rank 4"):
    kda.chunk_kda(**_inputs(gate="scalar"))
  with pytest.raises(ValueError, match="chunk_size"):
    kda.chunk_kda(**_inputs(gate="channel"), chunk_size=0)
  with pytest.raises(ValueError, match="sub_chunk_size"):
    dr.chunk_delta_rule(**_inputs(), chunk_size=64, sub_chunk_size=24)


def test_bad_step_input_raises():
  x = jnp.ones
  with pytest.raises(ValueError, match="beta"):
    dr.delta_rule_step(x((2, 2, 8)), x((2, 2, 8)), x((2, 4, 6)), x((2, 2)))
  with pytest.raises(ValueError, match="HV=3"):
    dr.delta_rule_step(x((2, 2, 8)), x((2, 2, 8)), x((2, 3, 6)), x((2, 3)))
  with pytest.raises(ValueError, match="state"):
    dr.delta_rule_step(x((2, 2, 8)), x((2, 2, 8)), x((2, 4, 6)), x((2, 4)),
                       state=jnp.zeros((2, 2, 8, 6)))
  with pytest.raises(ValueError, match="reset"):
    kda.kda_step(x((2, 2, 8)), x((2, 2, 8)), x((2, 4, 6)), -x((2, 4, 8)),
                 x((2, 4)), reset=jnp.zeros((3,), bool))


@pytest.mark.parametrize("gate", [None, 1, 5])
def test_chunk_state_scan_gradient_matches_autodiff(gate):
  """``scan_chunk_states``' written-out gradient against autodiff of the
  same scan, with no diagonal, a scalar one and one per key channel."""
  from lin_attn_jax.ops.delta_rule import chunk as chunk_module
  rng = np.random.default_rng(0)
  b, n, h, k, v = 2, 7, 3, 5, 4
  args = [jnp.asarray(x, jnp.float32) for x in (
      0.3 * rng.standard_normal((b, n, h, k, k)),
      rng.standard_normal((b, n, h, k, v)), rng.standard_normal((b, h, k, v)),
      rng.uniform(0.2, 1.0, (b, n, h, gate or 1)))]
  if gate is None:
    args[3] = None
  weights = [jnp.asarray(rng.standard_normal(s), jnp.float32)
             for s in ((b, h, k, v), (b, n, h, k, v))]

  def loss(scan):
    def value(*a):
      final, entering = scan(*a)
      return jnp.sum(weights[0] * final) + jnp.sum(weights[1] * entering ** 2)
    return value

  argnums = (0, 1, 2) if gate is None else (0, 1, 2, 3)
  got = jax.grad(loss(chunk_module.scan_chunk_states), argnums)(*args)
  want = jax.grad(loss(chunk_module._affine_scan), argnums)(*args)
  for a, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-5,
                               atol=1e-5 * float(jnp.max(jnp.abs(w))))
