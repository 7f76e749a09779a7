"""PaTH attention: the definition against flash-linear-attention's reference
and against explicit products of reflections; the blockwise form, decoding
and prefill against the definition (outputs and the gradients of q, k, v,
w, beta and g); the cache's contents; memory; bad input."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import testing
from lin_attn_jax.ops import (chunk_path_attn, init_path_cache,
                              parallel_path_attn, path_attn_extend,
                              path_attn_step, registry)
from lin_attn_jax.ops.path_attn import chunk
from lin_attn_jax.testing import rel_rms

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops",
                       "path_attn.npz")
SPEC = registry.get_spec("path_attn")
# 37 tokens: 5 chunks of 8 (the last one padded), 4 query heads on 2
# key/value heads, K != V.
DIMS = registry.Dims(batch=2, length=37, heads=4, dim_k=8, dim_v=6)
TOL = 1e-5


def _inputs(seed, b, t, h, hkv, dk, dv):
  """Float64 NumPy inputs as the layer makes them: unit-norm ``w``, ``beta``
  in (0, 2), ``g = log_sigmoid(N(0, 1))``."""
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((b, t, hkv, dk))
  return dict(q=rng.standard_normal((b, t, h, dk)),
              k=rng.standard_normal((b, t, hkv, dk)),
              v=rng.standard_normal((b, t, hkv, dv)),
              w=w / np.linalg.norm(w, axis=-1, keepdims=True),
              beta=2.0 / (1.0 + np.exp(-rng.standard_normal((b, t, hkv)))),
              g=-np.logaddexp(0.0, -rng.standard_normal((b, t, h))))


def _f32(inputs):
  return {n: jnp.asarray(x, jnp.float32) for n, x in inputs.items()}


def _reflections(w, beta, first, last):
  """``H_last ... H_first`` of one batch row and key head, float64."""
  product = np.eye(w.shape[-1])
  for s in range(first, last + 1):
    product = (np.eye(w.shape[-1]) - beta[s] * np.outer(w[s], w[s])) @ product
  return product


def _explicit(inputs, scale, segment_ids):
  """The definition with every product of reflections formed, float64."""
  q, k, v, w, beta, g = (inputs[n] for n in ("q", "k", "v", "w", "beta",
                                             "g"))
  b, t, h, _ = q.shape
  group = h // k.shape[2]
  c = np.cumsum(g, axis=1)
  o = np.zeros((b, t, h, v.shape[-1]))
  for row in range(b):
    for head in range(h):
      kv = head // group
      for i in range(t):
        z = np.full((t,), -np.inf)
        for j in range(i + 1):
          if segment_ids[row, j] == segment_ids[row, i]:
            product = _reflections(w[row, :, kv], beta[row, :, kv], j + 1, i)
            z[j] = scale * (q[row, i, head] @ product @ k[row, j, kv]
                            + c[row, i, head] - c[row, j, head])
        p = np.exp(z - z.max())
        o[row, i, head] = p @ v[row, :, kv] / p.sum()
  return o


def test_definition_is_the_product_of_reflections():
  inputs = _inputs(0, 1, 7, 2, 1, 3, 2)
  ids = np.array([[0, 0, 0, 1, 1, 1, 1]], np.int32)
  o = parallel_path_attn(**_f32(inputs), scale=0.7, segment_ids=ids)
  assert rel_rms(o, _explicit(inputs, 0.7, ids)) < TOL


def test_definition_matches_fla_reference():
  """fla's ``naive_path_attn`` (chunked UT transform), T = 37 in chunks of
  16, grouped heads; with the gate (gradients too) and without (fla's
  reference gets a zero gate, ours None)."""
  ref = np.load(FIXTURE)
  inputs = {n: jnp.asarray(ref[n]) for n in ("q", "k", "v", "w", "beta",
                                             "g")}
  scale = float(ref["scale"])

  @jax.jit
  def run(inputs, do):
    o, vjp = jax.vjp(lambda x: parallel_path_attn(**x, scale=scale), inputs)
    plain = parallel_path_attn(**{**inputs, "g": None}, scale=scale)
    return plain, o, vjp(do)[0]

  plain, o, grads = run(inputs, jnp.asarray(ref["do"]))
  errors = {"o": rel_rms(plain, ref["o"]), "o_gate": rel_rms(o, ref["o_gate"])}
  errors.update({f"d{n}": rel_rms(x, ref[f"d{n}"]) for n, x in grads.items()})
  assert max(errors.values()) < TOL, errors


def _check(**options):
  errors = testing.check_forms(SPEC, one_program=True, **options)
  return {form: max(e.values()) for form, e in errors.items()}


def test_forms_match_definition():
  """Blockwise, decoding steps and prefill: documents, grouped heads, a
  forget gate, 37 tokens in 5 chunks."""
  errors = _check(dims=DIMS, chunk_size=8)
  assert set(errors) == {"chunk", "step", "prefill"}


@pytest.mark.slow
def test_forms_in_bfloat16():
  """bfloat16 inputs, float32 statistics: within the spec's 1e-2."""
  errors = _check(dims=DIMS, chunk_size=8, dtype=jnp.bfloat16,
                  forms=("chunk", "step"))
  assert max(errors.values()) > 1e-4       # the inputs were rounded


def test_chunk_without_gate_over_groups_of_slots(monkeypatch):
  """No gate and no documents, so that every query crosses every
  reflection before it; 10 chunks of 4 in slots run one per group (the
  rematerialised path of long sequences)."""
  monkeypatch.setattr(chunk, "PAIR_FLOATS", 1)
  assert chunk.slots_per_group(5, 9, 4, 2, 8, 6) == 1
  spec = dataclasses.replace(SPEC, grad_args=("q", "k", "v", "w", "beta"))
  inputs = testing.make_inputs(spec, dataclasses.replace(DIMS, heads=2),
                               segment_ids=False)
  inputs["g"] = None
  errors = testing.check_forms(spec, inputs=inputs, chunk_size=4,
                               forms=("chunk", "prefill"), one_program=True)
  assert set(errors) == {"chunk", "prefill"}


@pytest.mark.parametrize("length, chunk_size", [(1, 8), (8, 8)])
def test_chunk_at_one_and_one_chunk(length, chunk_size):
  _check(dims=dataclasses.replace(DIMS, length=length), chunk_size=chunk_size,
         forms=("chunk",))


@pytest.mark.slow
def test_forms_with_strong_gates():
  _check(dims=DIMS, chunk_size=8, strong=True, forms=("chunk", "step"))


def test_schedule_pairs_every_chunk_with_its_earlier_chunks():
  for n in range(1, 8):
    sched = chunk.make_schedule(n)
    pairs = set()
    for r, s in zip(*np.nonzero(sched.active)):
      query = (sched.short if sched.which[r, s] else sched.long)[s]
      pairs.add((int(query), int(sched.key[r, s])))
      if r:              # each query chunk walks back one key chunk a round
        same = sched.which[r - 1, s] == sched.which[r, s]
        assert not same or sched.key[r - 1, s] == sched.key[r, s] + 1
    assert pairs == {(m, j) for m in range(n) for j in range(m)}
    rows = np.concatenate([sched.long, sched.short])
    np.testing.assert_array_equal(rows[sched.home], np.arange(n))


def test_decoding_continues_a_prefill():
  """A prefill of 7 tokens, 6 decoding steps, then a block of 7 more
  (a document starts inside each part, and at the start of the block in
  row 1) reproduce the definition on all 20 tokens."""
  inputs = _f32(_inputs(1, 2, 20, 4, 2, 8, 6))
  ids = np.array([[0] * 3 + [1] * 7 + [2] * 6 + [3] * 4,
                  [0] * 9 + [1] * 4 + [2] * 7], np.int32)
  expected = parallel_path_attn(**inputs, segment_ids=ids)
  extend = jax.jit(lambda x, cache, ids, reset: path_attn_extend(
      x["q"], x["k"], x["v"], x["w"], x["beta"], cache, g=x["g"],
      segment_ids=ids, reset=reset))
  step = jax.jit(lambda x, cache, reset: path_attn_step(
      x["q"], x["k"], x["v"], x["w"], x["beta"], cache, g=x["g"],
      reset=reset))
  cache = init_path_cache(2, 2, 8, 6, max_length=20, gate_heads=4)
  outs = []
  o, cache = extend({n: x[:, :7] for n, x in inputs.items()}, cache,
                    ids[:, :7], None)
  outs.append(o)
  for t in range(7, 13):
    o, cache = step({n: x[:, t] for n, x in inputs.items()}, cache,
                    jnp.asarray(ids[:, t] != ids[:, t - 1]))
    outs.append(o[:, None])
  o, cache = extend({n: x[:, 13:] for n, x in inputs.items()}, cache,
                    ids[:, 13:], jnp.asarray(ids[:, 13] != ids[:, 12]))
  outs.append(o)
  assert rel_rms(jnp.concatenate(outs, axis=1), expected) < TOL
  np.testing.assert_array_equal(cache.length, [20, 20])


def test_cache_holds_keys_as_later_tokens_see_them():
  """After a prefill, entry j holds ``H_T ... H_{j+1} k_j`` and the gate
  summed after j; the context-parallel summary of the chunks is the
  same."""
  raw = _inputs(2, 1, 13, 2, 1, 4, 3)
  inputs = _f32(raw)
  cache = init_path_cache(1, 1, 4, 3, max_length=16, gate_heads=2)
  _, cache = jax.jit(lambda x, cache: path_attn_extend(
      x["q"], x["k"], x["v"], x["w"], x["beta"], cache, g=x["g"]))(
          inputs, cache)
  w, beta, k = raw["w"][0, :, 0], raw["beta"][0, :, 0], raw["k"][0, :, 0]
  keys = np.stack([_reflections(w, beta, j + 1, 12) @ k[j]
                   for j in range(13)])
  gate = np.cumsum(raw["g"][0, ::-1], axis=0)[::-1] - raw["g"][0]
  np.testing.assert_allclose(cache.k[0, :13, 0], keys, atol=1e-5)
  np.testing.assert_allclose(cache.log_gate[0, :13], gate, atol=1e-5)
  np.testing.assert_array_equal(cache.position[0], list(range(13)) + [-1] * 3)
  summary_keys, summary_gate, _, total = jax.jit(
      lambda x: chunk.sequence_summary(chunk.chunk_terms(
          x["q"], x["k"], x["v"], x["w"], x["beta"], x["g"], None, 4), 13))(
              inputs)
  np.testing.assert_allclose(summary_keys[0, :, 0], keys, atol=1e-5)
  np.testing.assert_allclose(summary_gate[0], gate, atol=1e-5)
  np.testing.assert_allclose(total[0], raw["g"][0].sum(0), atol=1e-5)


@pytest.mark.slow
def test_chunk_memory_grows_linearly():
  """Forward and backward of the blockwise form: doubling T from 4096
  less than doubles the temporary memory (slots run in groups of a fixed
  budget), far below one [T, T] float32 matrix."""
  def temp_bytes(t):
    q = jnp.ones((1, t, 1, 16))
    beta = jnp.ones((1, t, 1))

    def loss(q, k, v, w, beta):
      return jnp.sum(chunk_path_attn(q, k, v, w, beta, chunk_size=64))

    compiled = jax.jit(jax.grad(loss, (0, 1, 2, 3, 4))).lower(
        q, q, q, q, beta).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(4096), temp_bytes(8192)
  assert large < 2.0 * small
  assert large < 0.25 * 8192 * 8192 * 4


def _bad_calls():
  q = jnp.ones((1, 9, 4, 8))
  kv = jnp.ones((1, 9, 2, 8))
  beta = jnp.ones((1, 9, 2))
  forms = (parallel_path_attn, chunk_path_attn)
  return q, kv, beta, forms


def test_bad_input():
  q, kv, beta, forms = _bad_calls()
  for form in forms:
    with pytest.raises(ValueError, match="w must have the shape of k"):
      form(q, kv, kv, jnp.ones((1, 9, 2, 4)), beta)
    with pytest.raises(ValueError, match="beta must have shape"):
      form(q, kv, kv, kv, jnp.ones((1, 9, 4)))
    with pytest.raises(ValueError, match="g must have shape"):
      form(q, kv, kv, kv, beta, jnp.zeros((1, 9, 2)))
    with pytest.raises(ValueError, match="g holds log-decays"):
      form(q, kv, kv, kv, beta, jnp.ones((1, 9, 4)))
    with pytest.raises(ValueError, match="w must have rank 4"):
      form(q, kv, kv, kv[0], beta)
    with pytest.raises(ValueError, match="heads of q"):
      form(jnp.ones((1, 9, 3, 8)), kv, kv, kv, beta)
    with pytest.raises(ValueError, match="segment_ids"):
      form(q, kv, kv, kv, beta, segment_ids=jnp.zeros((1, 8), jnp.int32))
  with pytest.raises(ValueError, match="chunk_size"):
    chunk_path_attn(q, kv, kv, kv, beta, chunk_size=0)


def test_bad_cache_input():
  q, kv, beta, _ = _bad_calls()
  cache = init_path_cache(1, 2, 8, 8, max_length=9)
  gated = init_path_cache(1, 2, 8, 8, max_length=9, gate_heads=4)
  step = functools.partial(path_attn_step, q[:, 0], kv[:, 0], kv[:, 0],
                           kv[:, 0], beta[:, 0])
  with pytest.raises(ValueError, match="g must be given exactly"):
    step(gated)
  with pytest.raises(ValueError, match="g must be given exactly"):
    step(cache, g=jnp.zeros((1, 4)))
  with pytest.raises(ValueError, match="w must have the shape of k"):
    path_attn_step(q[:, 0], kv[:, 0], kv[:, 0], kv[:, 0, :1], beta[:, 0],
                   cache)
  with pytest.raises(ValueError, match="cache.k must have shape"):
    step(init_path_cache(1, 2, 4, 8, max_length=9))
  with pytest.raises(ValueError, match="reset must have shape"):
    step(cache, reset=jnp.zeros((2,), bool))
  full = path_attn_extend(q, kv, kv, kv, beta, cache)[1]
  with pytest.raises(ValueError, match="cache is full"):
    step(full)
  with pytest.raises(ValueError, match="max_length"):
    init_path_cache(1, 2, 8, 8, max_length=0)
  with pytest.raises(ValueError, match="must be a PaTHCache"):
    step({"k": kv})
