"""Stick-breaking attention: the definition against fla's naive code, the
blockwise form against the definition (outputs, the remaining stick and all
gradients), decoding with a KV cache, and bad input."""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.registry import Dims, StepForm

SPEC = registry.get_spec("stickbreaking_attn")
FIXTURE = (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ops"
           / "stickbreaking_attn.npz")
# The shapes are tiny, so compiling dominates (see test_diagonal_ssm.py).
FAST_COMPILE = {"xla_backend_optimization_level": 0,
                "xla_llvm_disable_expensive_passes": True}


def _fast_jit(fn, **kwargs):
  return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


# fla's naive form in float64, against ours in float32 on the same float32
# inputs: rounding alone, a few 1e-7 measured (up to 6e-7 for the gradients
# with saturated logits, where sums of softplus values reach a few hundred).
FIXTURE_TOL = 2e-6


@functools.lru_cache(maxsize=None)
def _definition_with_grads(attend_current: bool):
  """``(o, rem, (dq, dk, dv))`` of the parallel form for the cotangents
  ``(do, drem)``."""

  def run(q, k, v, do, drem):
    def forward(q, k, v):
      return ops.parallel_stickbreaking_attn(
          q, k, v, attend_current=attend_current, output_rem=True)

    (o, rem), vjp = jax.vjp(forward, q, k, v)
    return o, rem, vjp((do, drem))

  return _fast_jit(run)


@pytest.mark.parametrize("case", ["plain", "current", "strong",
                                  "strong_current"])
def test_definition_matches_fla_naive(case):
  """``experiments.make_op_fixtures``' ``stickbreaking_attn``: fla's
  ``naive_stickbreaking_attn`` on grouped heads, attend_current both ways,
  gentle and saturated logits; outputs, remaining stick and gradients."""
  data = np.load(FIXTURE)
  x = {n: jnp.asarray(data[f"{case}_{n}"])
       for n in ("q", "k", "v", "do", "drem")}
  o, rem, (dq, dk, dv) = _definition_with_grads(case.endswith("current"))(
      x["q"], x["k"], x["v"], x["do"], x["drem"])
  got = {"o": o, "rem": rem, "dq": dq, "dk": dk, "dv": dv}
  errors = {n: testing.rel_rms(got[n], data[f"{case}_{n}"]) for n in got}
  assert max(errors.values()) <= FIXTURE_TOL, errors
  if case.startswith("strong"):
    # Saturated: most queries give (almost) all their stick to one key.
    assert np.mean(np.asarray(rem) < 1e-6) > 0.5


def with_rem(fn, block_arg=None, **static):
  """``fn(..., output_rem=True)`` as a form returning ``(o, rem)``: the
  harness checks the remaining stick, and its gradients, as a final
  state."""
  def form(*, output_final_state=False, chunk_size=None, **inputs):
    del output_final_state
    if chunk_size is not None:
      inputs[block_arg] = chunk_size
    return fn(**inputs, output_rem=True, **static)
  return form


def rem_spec(attend_current: bool):
  """The definition and the blockwise form, both returning the remaining
  stick."""
  static = dict(attend_current=attend_current)
  return dataclasses.replace(SPEC, forms={
      "naive": with_rem(ops.parallel_stickbreaking_attn, **static),
      "chunk": with_rem(ops.chunk_stickbreaking_attn, "block_size", **static)})


def _step(q, k, v, state, reset, attend_current):
  return ops.stickbreaking_attn_step(q, k, v, state, reset=reset,
                                     attend_current=attend_current)


def _prefill(q, k, v, *, segment_ids=None, attend_current):
  cache = ops.init_kv_cache(k.shape[0], k.shape[2], k.shape[3], v.shape[3],
                            max_length=k.shape[1], dtype=k.dtype)
  return ops.stickbreaking_attn_extend(q, k, v, cache,
                                       segment_ids=segment_ids,
                                       attend_current=attend_current)[0]


def decoding_spec():
  """The registry's decoding forms (the step scanned over the sequence, the
  prefill of an empty cache) with ``attend_current=True``."""
  static = dict(attend_current=True)
  return dataclasses.replace(SPEC, forms={
      "naive": registry.o_only(ops.parallel_stickbreaking_attn, **static),
      "step": StepForm(_step, ("q", "k", "v"), static,
                       init_state=SPEC.forms["step"].init_state,
                       final_state=False),
      "prefill": registry.o_only(_prefill, **static)})


# (length, block, attend_current, strong logits, dtype): odd lengths, one
# and several blocks, a block longer than the sequence, T = 1, K != V,
# grouped heads (4 query heads to 2 key/value heads) and packed documents
# (on by default) throughout.
BLOCKWISE_CASES = [
    (1, 16, True, False, jnp.float32),
    (50, 16, False, False, jnp.float32),
    (50, 16, True, True, jnp.float32),
    (37, 64, False, True, jnp.float32),
    (45, 8, True, False, jnp.bfloat16),
    (45, 8, False, True, jnp.bfloat16),
]


def _case_id(case):
  t, block, current, strong, dtype = case
  return (f"T{t}-C{block}-{'current' if current else 'before'}-"
          f"{'strong' if strong else 'gentle'}-{jnp.dtype(dtype).name}")


@pytest.mark.parametrize("case", BLOCKWISE_CASES, ids=_case_id)
def test_blockwise_matches_definition(case):
  """Outputs, the remaining stick and the gradients of q, k and v (random
  cotangents of both) under jit, scan and grad. Tolerances of the spec:
  1e-5 in float32 (measured up to 8e-7, with saturated logits), 1e-2 with
  bfloat16 inputs (measured up to 2.5e-3)."""
  t, block, current, strong, dtype = case
  testing.check_forms(rem_spec(current),
                      dims=Dims(length=t, heads=4, dim_k=8, dim_v=12),
                      strong=strong, chunk_size=block, dtype=dtype, seed=t,
                      one_program=True, compiler_options=FAST_COMPILE)


def test_registry_forms_and_decoding_attend_current():
  """The registry's forms (attend_current=False: the step over a KV cache,
  the prefill, the blockwise form) and the decoding forms with
  attend_current=True, against the definition, saturated logits."""
  dims = Dims(length=29, heads=4, dim_k=8, dim_v=12)
  for spec in (SPEC, decoding_spec()):
    testing.check_forms(spec, dims=dims, strong=True, chunk_size=8,
                        one_program=True, compiler_options=FAST_COMPILE)


def test_remaining_stick_and_weights():
  """Without documents the weights and the remaining stick of a query sum
  to 1 (the identity of ``v = 1``); a document's first query sees nothing
  (o = 0, rem = 1) unless it attends to itself."""
  key = jax.random.split(jax.random.PRNGKey(3), 3)
  q = jax.random.normal(key[0], (2, 21, 4, 8))
  k = jax.random.normal(key[1], (2, 21, 2, 8))
  ones = jnp.ones((2, 21, 2, 1))
  ids = jnp.asarray([[0] * 9 + [1] * 12, [5] * 21])
  for current in (False, True):
    o, rem = _fast_jit(functools.partial(
        ops.chunk_stickbreaking_attn, attend_current=current, block_size=4,
        output_rem=True))(q, k, ones, segment_ids=ids)
    np.testing.assert_allclose(o[..., 0] + rem, 1.0, atol=1e-6)
    if not current:
      np.testing.assert_array_equal(o[0, [0, 9]], 0.0)
      np.testing.assert_array_equal(rem[0, [0, 9]], 1.0)
    else:
      assert np.all(np.asarray(rem[0, [0, 9]]) < 1.0)


def test_documents_do_not_mix():
  """Changing the second document's tokens changes no other output."""
  key = jax.random.split(jax.random.PRNGKey(4), 6)
  shapes = ((1, 30, 2, 8), (1, 30, 1, 8), (1, 30, 1, 8))
  qkv = [jax.random.normal(kk, s) for kk, s in zip(key[:3], shapes)]
  noise = [jax.random.normal(kk, s) for kk, s in zip(key[3:], shapes)]
  ids = jnp.asarray([[0] * 7 + [1] * 13 + [2] * 10])
  middle = np.zeros((1, 30, 1, 1), bool)
  middle[0, 7:20] = True
  changed = [jnp.where(middle, n, x) for n, x in zip(noise, qkv)]
  run = _fast_jit(functools.partial(ops.chunk_stickbreaking_attn,
                                    segment_ids=ids, block_size=8))
  o, o_changed = run(*qkv), run(*changed)
  outside = ~middle[0, :, 0, 0]
  np.testing.assert_array_equal(o_changed[0, outside], o[0, outside])
  assert testing.rel_rms(o_changed[0, 8:20], o[0, 8:20]) > 0.1


def test_extreme_logits_stay_finite():
  """Logits of |z| ~ 1000: every weight is a sum of softplus values in log
  space, so outputs and gradients stay finite and match the definition."""
  key = jax.random.split(jax.random.PRNGKey(5), 4)
  q = 300.0 * jax.random.normal(key[0], (1, 24, 2, 8))
  k, v = (jax.random.normal(kk, (1, 24, 2, 8)) for kk in key[1:3])
  co = jax.random.normal(key[3], (1, 24, 2, 8))

  def grads(form):
    loss = lambda q, k, v: jnp.sum(form(q, k, v) * co)
    return _fast_jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)

  blockwise = grads(functools.partial(ops.chunk_stickbreaking_attn,
                                      block_size=8))
  dense = grads(ops.parallel_stickbreaking_attn)
  for got, want in zip(jax.tree.leaves(blockwise), jax.tree.leaves(dense)):
    assert np.all(np.isfinite(np.asarray(got)))
    assert testing.rel_rms(got, want) <= 1e-5


def test_prefill_then_steps_reproduce_the_forward():
  """Prefill 11 tokens, then decode 13 one at a time, documents restarting
  inside the prefill and during decoding; and a second prefill after
  cached tokens."""
  b, t, h, hkv, dk, dv = 2, 24, 4, 2, 8, 6
  key = jax.random.split(jax.random.PRNGKey(6), 3)
  q = jax.random.normal(key[0], (b, t, h, dk))
  k = jax.random.normal(key[1], (b, t, hkv, dk))
  v = jax.random.normal(key[2], (b, t, hkv, dv))
  ids = np.array([[0] * 5 + [1] * 10 + [2] * 9, [3] * 11 + [4] * 13])
  starts = np.concatenate([np.zeros((b, 1), bool),
                           ids[:, 1:] != ids[:, :-1]], axis=1)
  for current in (False, True):
    expected = ops.parallel_stickbreaking_attn(
        q, k, v, attend_current=current, segment_ids=jnp.asarray(ids))
    extend = _fast_jit(functools.partial(ops.stickbreaking_attn_extend,
                                         attend_current=current))
    step = _fast_jit(functools.partial(ops.stickbreaking_attn_step,
                                       attend_current=current))
    cache = ops.init_kv_cache(b, hkv, dk, dv, max_length=t)
    o, cache = extend(q[:, :11], k[:, :11], v[:, :11], cache,
                      segment_ids=jnp.asarray(ids[:, :11]))
    outs = [o]
    for i in range(11, t):
      o_t, cache = step(q[:, i], k[:, i], v[:, i], cache,
                        reset=jnp.asarray(starts[:, i]))
      outs.append(o_t[:, None])
    assert testing.rel_rms(jnp.concatenate(outs, 1), expected) <= 1e-6
    np.testing.assert_array_equal(cache.length, t)
  cache = ops.init_kv_cache(b, hkv, dk, dv, max_length=t)
  outs = []
  for a, z in ((0, 11), (11, 22), (22, 24)):
    o, cache = extend(q[:, a:z], k[:, a:z], v[:, a:z], cache,
                      segment_ids=jnp.asarray(ids[:, a:z]),
                      reset=jnp.asarray(starts[:, a]))
    outs.append(o)
  assert testing.rel_rms(jnp.concatenate(outs, 1), expected) <= 1e-6


def test_blockwise_memory_is_linear():
  """Forward and backward together stay well below one [T, T] float32
  matrix (the dense definition holds several)."""
  t = 2048
  q = jnp.ones((1, t, 1, 16))
  loss = lambda q: jnp.sum(ops.chunk_stickbreaking_attn(q, q, q,
                                                        block_size=64))
  compiled = jax.jit(jax.grad(loss)).lower(q).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < 0.25 * t * t * 4


def test_bad_input():
  q = jnp.ones((1, 10, 3, 8))
  kv = jnp.ones((1, 10, 2, 8))
  for form in (ops.parallel_stickbreaking_attn, ops.chunk_stickbreaking_attn):
    with pytest.raises(ValueError, match=r"multiple.*\(1, 10, 3, 8\)"):
      form(q, kv, kv)
    q4 = jnp.ones((1, 10, 4, 8))
    with pytest.raises(ValueError, match="attend_current must be a bool"):
      form(q4, kv, kv, attend_current=1)
    with pytest.raises(ValueError, match="segment_ids"):
      form(q4, kv, kv, segment_ids=jnp.zeros((1, 9), jnp.int32))
    with pytest.raises(ValueError, match="v must agree"):
      form(q4, kv, jnp.ones((1, 9, 2, 8)))
  with pytest.raises(ValueError, match="block_size"):
    ops.chunk_stickbreaking_attn(q4, kv, kv, block_size=0)
  q1, kv1 = jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8))
  ring = ops.init_kv_cache(1, 2, 8, 8, window_size=4)
  with pytest.raises(ValueError, match="cache must be a full KV cache"):
    ops.stickbreaking_attn_step(q1, kv1, kv1, ring)
  full = ops.init_kv_cache(1, 2, 8, 8, max_length=1)
  _, full = ops.stickbreaking_attn_step(q1, kv1, kv1, full)
  with pytest.raises(ValueError, match="cache is full"):
    ops.stickbreaking_attn_step(q1, kv1, kv1, full)
  with pytest.raises(ValueError, match="cache is full"):
    ops.stickbreaking_attn_extend(q4[:, :2], kv[:, :2], kv[:, :2],
                                  ops.init_kv_cache(1, 2, 8, 8, max_length=1))
  with pytest.raises(ValueError, match="k must have shape"):
    ops.stickbreaking_attn_step(q1, jnp.ones((1, 2, 4)), kv1,
                                ops.init_kv_cache(1, 2, 8, 8, max_length=4))
