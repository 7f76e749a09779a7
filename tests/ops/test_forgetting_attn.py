"""The Forgetting Transformer's attention: every form against the parallel
reference, the reference against fla's naive code, decoding, errors.

Tolerances: float32 forms agree with the reference to 1e-5 relative RMS in
outputs and every gradient (measured about 3e-7 with gentle gates; the bias
``c_i - c_j`` of the blockwise, prefill and context-parallel forms is exact
to about ``eps |c_i|``, see the strong case). Inputs in bfloat16: 1e-2, the
rounding of the inputs and output (``2^-8``) with float32 statistics
(measured 2.6e-3).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.testing import rel_rms

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops",
                       "forgetting_attn.npz")
SPEC = registry.get_spec("forgetting_attn")
WINDOW_SPEC = registry.get_spec("forgetting_attn_window")
# Four query heads on two key/value heads (spec_inputs.attention), K != V.
DIMS = registry.Dims(batch=2, length=45, heads=4, dim_k=8, dim_v=12)
FAST = {"xla_backend_optimization_level": 0}


# Strong gates (-16 per token on average) sum to |c| of a few hundred in a
# document: the blockwise and prefill biases c_i - c_j round by eps |c|, about
# 2e-5 relative in the small weights off the diagonal, which the gradients of
# q and k are made of (measured 9e-6); 3e-5 for those (the spec's grad_tol).
# The step's decays sum each entry's own gates (measured 2e-7).
@pytest.mark.parametrize("spec, length, strong, chunk, grad_tol", [
    (SPEC, 45, False, 8, 1e-5),         # six blocks, the last one padded
    (SPEC, 45, True, 16, 3e-5),         # gates down to -60 per token
    (WINDOW_SPEC, 45, False, 8, 1e-5),  # window 16 over blocks of 8
    (WINDOW_SPEC, 7, False, 4, 1e-5),   # shorter than the window
])
def test_forms_match_reference(spec, length, strong, chunk, grad_tol):
  """Blockwise, step-by-step decoding and prefill against the parallel
  form: outputs and the gradients of q, k, v and g, with packed documents
  and grouped heads."""
  testing.check_forms(spec, dims=registry.Dims(
      batch=2, length=length, heads=4, dim_k=8, dim_v=12), strong=strong,
                      chunk_size=chunk, grad_tol=grad_tol, one_program=True,
                      compiler_options=FAST)


@pytest.mark.slow
def test_forms_without_documents():
  testing.check_forms(SPEC, dims=DIMS, segment_ids=False, chunk_size=16,
                      grad_tol=1e-5, forms=("chunk", "prefill"),
                      one_program=True, compiler_options=FAST)


# The window in bfloat16 repeats the same arithmetic on fewer block pairs.
@pytest.mark.parametrize("spec", [
    SPEC, pytest.param(WINDOW_SPEC, marks=pytest.mark.slow)])
def test_bfloat16_inputs(spec):
  testing.check_forms(spec, dims=DIMS, chunk_size=16, dtype=jnp.bfloat16,
                      forms=("chunk", "prefill"), one_program=True,
                      compiler_options=FAST)


def test_one_token():
  """T = 1: the output is the token's value; the gradients of q and g are
  exactly 0 in the reference (one key), so they get an absolute floor."""
  inputs = testing.make_inputs(SPEC, registry.Dims(batch=2, length=1,
                                                   heads=2, dim_k=4,
                                                   dim_v=6))
  del inputs["segment_ids"]
  ref = testing.run_reference(SPEC.forms["naive"], inputs,
                              grad_args=SPEC.grad_args)
  for name in ("chunk", "prefill", "step"):
    o, _, grads = testing.outputs_and_grads(SPEC.forms[name], inputs,
                                            SPEC.grad_args)
    assert rel_rms(o, ref[0]) <= 1e-6
    for arg in SPEC.grad_args:
      assert rel_rms(grads[arg], ref[2][arg], floor=1.0) <= 1e-6, (name, arg)
  np.testing.assert_allclose(ref[0][:, 0], jnp.repeat(inputs["v"][:, 0], 2,
                                                      axis=1), atol=1e-6)


def make_qkvg(seed, b, t, h, hkv, dk, dv, gate_shift=1.0):
  kq, kk, kv, kg = jax.random.split(jax.random.PRNGKey(seed), 4)
  return (jax.random.normal(kq, (b, t, h, dk)),
          jax.random.normal(kk, (b, t, hkv, dk)),
          jax.random.normal(kv, (b, t, hkv, dv)),
          jax.nn.log_sigmoid(jax.random.normal(kg, (b, t, h)) + gate_shift))


def test_gate_is_a_decay_bias():
  """g = 0 is softmax attention; a very strong gate leaves each query its
  own value; anything between differs from both."""
  q, k, v, g = make_qkvg(0, 1, 24, 4, 2, 8, 8)
  parallel = jax.jit(ops.parallel_forgetting_attn)
  chunk = jax.jit(lambda *a: ops.chunk_forgetting_attn(*a, block_size=8))
  softmax = ops.parallel_softmax_attn(q, k, v)
  own = jnp.repeat(v, 2, axis=2)
  for form in (parallel, chunk):
    assert rel_rms(form(q, k, v, jnp.zeros_like(g)), softmax) <= 1e-6
    assert rel_rms(form(q, k, v, jnp.full_like(g, -1e4)), own) <= 1e-6
    o = form(q, k, v, g)
    assert min(rel_rms(o, softmax), rel_rms(o, own)) > 0.05


def test_gate_sums_restart_per_document():
  """Changing the gates of one document changes no other's outputs; the
  gate sums of a later document do not include earlier gates."""
  q, k, v, g = make_qkvg(1, 1, 40, 2, 2, 8, 8)
  ids = jnp.asarray([[0] * 15 + [1] * 25])
  form = jax.jit(lambda g: ops.chunk_forgetting_attn(
      q, k, v, g, segment_ids=ids, block_size=8))
  changed = g.at[:, :15].set(-5.0)
  np.testing.assert_allclose(form(changed)[:, 15:], form(g)[:, 15:],
                             rtol=0, atol=1e-6)
  second = ops.parallel_forgetting_attn(q[:, 15:], k[:, 15:], v[:, 15:],
                                        g[:, 15:])
  assert rel_rms(form(g)[:, 15:], second) <= 1e-6


@pytest.mark.parametrize("window_size", [None, 6])
def test_prefill_then_decoding(window_size):
  """A prefill of 17 tokens, then one step per token up to 40 (more than
  the window: the ring buffer wraps), with documents starting in the
  prefill and in the steps, against the parallel form."""
  b, t, h, hkv, dk, dv = 2, 40, 4, 2, 8, 12
  q, k, v, g = make_qkvg(2, b, t, h, hkv, dk, dv)
  ids = np.array([[0] * 9 + [1] * 20 + [2] * 11, [5] * 30 + [4] * 10])
  resets = np.concatenate([np.zeros((b, 1), bool),
                           ids[:, 1:] != ids[:, :-1]], axis=1)
  cache = ops.init_forgetting_cache(b, h, hkv, dk, dv, max_length=t,
                                    window_size=window_size)
  o, cache = jax.jit(ops.forgetting_attn_extend)(
      q[:, :17], k[:, :17], v[:, :17], g[:, :17], cache,
      segment_ids=jnp.asarray(ids[:, :17]))
  outs = [np.asarray(o)]
  step = jax.jit(ops.forgetting_attn_step)
  q, k, v, g = (np.asarray(x) for x in (q, k, v, g))
  for i in range(17, t):
    o_t, cache = step(q[:, i], k[:, i], v[:, i], g[:, i], cache,
                      reset=resets[:, i])
    outs.append(np.asarray(o_t)[:, None])
  ref = ops.parallel_forgetting_attn(q, k, v, g, window_size=window_size,
                                     segment_ids=jnp.asarray(ids))
  assert rel_rms(np.concatenate(outs, axis=1), ref) <= 1e-6
  size = t if window_size is None else window_size
  assert cache.log_decay.shape == (b, size, h)
  assert cache.kv.k.shape == (b, size, hkv, dk)


def test_reference_matches_fla_naive():
  """``parallel_forgetting_attn`` against fla's ``naive_forgetting_attn``
  on the inputs of ``experiments/make_op_fixtures.py``: grouped heads,
  full causal and a window. fla sums the gates as ``c_i - c_j`` from one
  cumulative sum, which rounds to about ``eps |c|``; the fixtures keep
  ``|c| <= 20``."""
  data = np.load(FIXTURE)
  for case in ("full", "window"):
    window = int(data[f"{case}_window"]) or None
    o = ops.parallel_forgetting_attn(
        data[f"{case}_q"], data[f"{case}_k"], data[f"{case}_v"],
        data[f"{case}_g"], scale=float(data[f"{case}_scale"]),
        window_size=window)
    assert rel_rms(o, data[f"{case}_o"]) <= 1e-6, case
  assert int(data["window_window"]) < data["window_q"].shape[1]


def test_blockwise_memory_is_linear():
  """Forward and backward of the blockwise form at T = 2048 stay well
  below one ``[T, T]`` float32 matrix (the reference holds several)."""
  t = 2048
  q = jnp.ones((1, t, 1, 16))
  g = jnp.full((1, t, 1), -0.01)
  loss = lambda q, g: jnp.sum(ops.chunk_forgetting_attn(q, q, q, g,
                                                        block_size=64))
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(q, g).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < 0.25 * t * t * 4


@pytest.mark.parametrize("form", [ops.parallel_forgetting_attn,
                                  ops.chunk_forgetting_attn])
def test_bad_input(form):
  q = jnp.ones((1, 10, 4, 8))
  kv = jnp.ones((1, 10, 2, 8))
  g = -jnp.ones((1, 10, 4))
  with pytest.raises(ValueError, match=r"g must have shape \(1, 10, 4\)"):
    form(q, kv, kv, g[..., :2])
  with pytest.raises(ValueError, match="g must have rank 3"):
    form(q, kv, kv, g[..., None])
  with pytest.raises(ValueError, match="g holds log-decays, which must be"):
    form(q, kv, kv, -g)
  with pytest.raises(ValueError, match="g must have a floating dtype"):
    form(q, kv, kv, g.astype(jnp.int32))
  with pytest.raises(ValueError, match="multiple"):
    form(jnp.ones((1, 10, 3, 8)), kv, kv, g[..., :3])
  with pytest.raises(ValueError, match="window_size"):
    form(q, kv, kv, g, window_size=0)
  with pytest.raises(ValueError, match="segment_ids"):
    form(q, kv, kv, g, segment_ids=jnp.zeros((1, 9), jnp.int32))
  if form is ops.chunk_forgetting_attn:
    with pytest.raises(ValueError, match="block_size"):
      form(q, kv, kv, g, block_size=0)


def test_cache_bad_input():
  cache = ops.init_forgetting_cache(1, 4, 2, 8, 8, window_size=4)
  q, kv, g = jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)), -jnp.ones((1, 4))
  with pytest.raises(ValueError, match=r"g must have shape \(1, 4\)"):
    ops.forgetting_attn_step(q, kv, kv, g[:, :2], cache)
  with pytest.raises(ValueError, match="g holds log-decays"):
    ops.forgetting_attn_step(q, kv, kv, -g, cache)
  with pytest.raises(ValueError, match="cache keeps the gates of 4"):
    ops.forgetting_attn_step(jnp.ones((1, 2, 8)), kv, kv, g[:, :2], cache)
  with pytest.raises(ValueError, match="cache keeps the gates of 4"):
    ops.forgetting_attn_extend(jnp.ones((1, 3, 2, 8)), jnp.ones((1, 3, 2, 8)),
                               jnp.ones((1, 3, 2, 8)), -jnp.ones((1, 3, 2)),
                               cache)
  with pytest.raises(ValueError, match="heads"):
    ops.init_forgetting_cache(1, 0, 2, 8, 8, window_size=4)
  full = ops.init_forgetting_cache(1, 4, 2, 8, 8, max_length=1)
  _, full = ops.forgetting_attn_step(q, kv, kv, g, full)
  with pytest.raises(ValueError, match="cache is full"):
    ops.forgetting_attn_step(q, kv, kv, g, full)
