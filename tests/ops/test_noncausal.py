"""The non-causal forms (``causal=False``) against their definitions.

Every non-causal op of the registry (``registry.core_specs("noncausal")``:
the LION forms of the recurrences, the softmax family without the causal
mask, EfficientViT's ReLU linear attention) is checked by
``lin_attn_jax.testing.check_forms`` against its naive form, the dense
``[T, T]`` definition: outputs and gradients, with segment ids, in float32
and bfloat16, and split over 8 devices on ``sequence``. The dense
definitions are checked here against float64 loops written from the
formula, padding against the unpadded sequence, and the refusal of a state.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.registry import Dims, core_specs

SPECS = {spec.name: spec for spec in core_specs("noncausal")}
DIMS = Dims(batch=2, length=32, heads=2, dim_k=8, dim_v=8)
# Segment ids from the registry's makers have a new document with
# probability 0.05: at T = 32 and seed 3 both rows hold several.
SEED = 3


def _params(slow=()):
  return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n
          for n in sorted(SPECS)]


# Agent Attention and Nystromformer have one form each, nothing to compare
# it with here (test_encoder_ops.py holds them to their papers' equations).
ONE_FORM = ("agent_attn", "nystrom_attn")


# The ops whose paths another op covers (as below) are slow here too.
@pytest.mark.parametrize("name", _params(slow=ONE_FORM + (
    "retention_noncausal", "simple_gla_noncausal", "linear_scan_noncausal",
    "sliding_window_attn_noncausal")))
def test_forms_match_the_definition(name):
  testing.check_forms(SPECS[name], dims=DIMS, chunk_size=8, seed=SEED,
                      one_program=True)


# Strong gates and bfloat16 of the ops whose paths another op covers (the
# scalar decays by SSD's, the scan by the RG-LRU's, the masks by full
# attention's) are slow; the selective scan's program is the largest.
@pytest.mark.parametrize("name", _params(slow=ONE_FORM + (
    "retention_noncausal", "simple_gla_noncausal", "linear_scan_noncausal",
    "sliding_window_attn_noncausal", "sparse_attn_noncausal",
    "selective_scan_noncausal")))
def test_strong_gates_and_bfloat16(name):
  spec = SPECS[name]
  testing.check_forms(spec, dims=DIMS, chunk_size=8, seed=SEED, strong=True,
                      one_program=True)
  testing.check_forms(spec, dims=DIMS, chunk_size=8, seed=SEED,
                      dtype=jnp.bfloat16, one_program=True)


# The split of the ops whose paths another op's covers (as above; the
# ReLU map's by linear attention's) is slow.
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in (
        "retention_noncausal", "simple_gla_noncausal",
        "linear_scan_noncausal", "sliding_window_attn_noncausal",
        "selective_scan_noncausal", "relu_linear_attn") else n
    for n in sorted(n for n, s in SPECS.items() if s.context_parallel)])
def test_context_parallel_matches_one_device(name):
  testing.check_forms(SPECS[name], dims=DIMS, chunk_size=4, seed=SEED,
                      forms=("chunk",), context_parallel=(8,))


def _lion_mask(log_a, ids):
  """float64 ``M [B, T, T, ...]`` from log-decays ``[B, T, ...]``, written
  from the formula: the decays strictly after the earlier token up to the
  later, zero across documents."""
  log_a, ids = np.asarray(log_a, np.float64), np.asarray(ids)
  b, t = ids.shape
  mask = np.zeros((b, t, t) + log_a.shape[2:])
  for row in range(b):
    for i in range(t):
      for j in range(t):
        if ids[row, i] == ids[row, j]:
          lo, hi = min(i, j), max(i, j)
          mask[row, i, j] = np.exp(log_a[row, lo + 1:hi + 1].sum(0))
  return mask


def _docs(t):
  return jnp.asarray([[0] * 5 + [1] * 9 + [2] * (t - 14), [4] * t])


def test_gla_definition_is_the_lion_mask():
  b, t, h, k, v = 2, 20, 2, 4, 3
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, kk = (jax.random.normal(x, (b, t, h, k)) for x in keys[:2])
  vv = jax.random.normal(keys[2], (b, t, h, v))
  g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (b, t, h, k)))
  ids = _docs(t)
  o, state = ops.naive_recurrent_gla(q, kk, vv, g, segment_ids=ids,
                                     causal=False)
  mask = _lion_mask(g, ids)                                # [B, T, T, H, K]
  scores = np.einsum("bihk,bjhk,bijhk->bijh", np.asarray(q, np.float64),
                     np.asarray(kk, np.float64), mask) * k ** -0.5
  expected = np.einsum("bijh,bjhv->bihv", scores, np.asarray(vv, np.float64))
  assert state is None
  np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)


def test_scan_definition_is_the_lion_mask():
  b, t, d = 2, 20, 3
  ka, kb = jax.random.split(jax.random.PRNGKey(1))
  log_a = jax.nn.log_sigmoid(jax.random.normal(ka, (b, t, d)))
  x = jax.random.normal(kb, (b, t, d))
  ids = _docs(t)
  h, _ = ops.naive_recurrent_linear_scan(jnp.exp(log_a), x, segment_ids=ids,
                                         causal=False)
  expected = np.einsum("bijd,bjd->bid", _lion_mask(log_a, ids),
                       np.asarray(x, np.float64))
  np.testing.assert_allclose(h, expected, rtol=1e-5, atol=1e-5)


def test_linear_attention_is_the_global_normalised_sum():
  b, t, h, k, v = 1, 16, 2, 4, 3
  keys = jax.random.split(jax.random.PRNGKey(2), 3)
  q, kk = (jax.nn.elu(jax.random.normal(x, (b, t, h, k))) + 1
           for x in keys[:2])
  vv = jax.random.normal(keys[2], (b, t, h, v))
  o, _ = jax.jit(functools.partial(ops.chunk_linear_attn, normalize=True,
                                   causal=False, chunk_size=4))(q, kk, vv)
  kv = jnp.einsum("bshk,bshv->bhkv", kk, vv)
  expected = (jnp.einsum("bthk,bhkv->bthv", q, kv)
              / jnp.einsum("bthk,bhk->bth", q, kk.sum(1))[..., None])
  np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gla_noncausal", "softmax_attn_noncausal",
                                  "selective_scan_noncausal"])
def test_padding_is_invisible(name):
  """A row padded at the end (segment id 0 on the padding, the library's
  convention) gives the unpadded row's outputs on its tokens."""
  spec = SPECS[name]
  inputs = spec.make_inputs(jax.random.PRNGKey(0), DIMS, False)
  inputs = {n: x for n, x in inputs.items() if x is not None}
  real = 24
  ids = jnp.where(jnp.arange(DIMS.length) < real, 1, 0)[None].repeat(
      DIMS.batch, 0)
  form = jax.jit(spec.forms["chunk"], static_argnames=("chunk_size",))
  padded, _ = form(**{**inputs, "segment_ids": ids}, chunk_size=8)
  cut = {n: x[:, :real] if getattr(x, "ndim", 0) >= 2
         and x.shape[:2] == (DIMS.batch, DIMS.length) else x
         for n, x in inputs.items() if n != "segment_ids"}
  alone, _ = form(**cut, chunk_size=8)
  np.testing.assert_allclose(padded[:, :real], alone, rtol=1e-5, atol=1e-5)


def test_a_state_is_refused():
  q = jnp.ones((1, 8, 1, 4))
  with pytest.raises(ValueError, match="causal=False has no state"):
    ops.chunk_gla(q, q, q, -jnp.ones((1, 8, 1, 4)), causal=False,
                  output_final_state=True)
  with pytest.raises(ValueError, match="causal=False has no state"):
    ops.parallel_linear_scan(q[:, :, 0], q[:, :, 0], causal=False,
                             initial_state=jnp.zeros((1, 4)))
  with pytest.raises(ValueError, match="strictly_causal"):
    ops.chunk_gated_linear(q, q, q, causal=False, strictly_causal=True)


def test_linear_attention_split_is_one_all_reduce():
  """Ungated and non-causal, the split over ``sequence`` reduces the
  crossing documents' sums once (no scans): outputs and gradients equal
  one device's, with documents inside a device, over several devices,
  repeated ids and no ids, at P = 8 (4 tokens a device) and P = 2."""
  b, t, h, k, v = 2, 32, 2, 4, 3
  keys = jax.random.split(jax.random.PRNGKey(4), 4)
  q, kk = (jax.nn.elu(jax.random.normal(x, (b, t, h, k))) + 1
           for x in keys[:2])
  vv = jax.random.normal(keys[2], (b, t, h, v))
  cot = jax.random.normal(keys[3], (b, t, h, v))
  ids = jnp.asarray([[0] * 5 + [1] * 3 + [0] * 8 + [2] * 3 + [1] * 13,
                     [0] * 7 + [1] + [2] * 4 + [0] * 12 + [3] * 8])

  def loss(q, kk, vv, ids):
    o, _ = ops.chunk_linear_attn(q, kk, vv, normalize=True, causal=False,
                                 segment_ids=ids, chunk_size=2)
    return jnp.sum(o * cot), o

  run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  for segment_ids in (ids, None):
    (_, expected), grads = run(q, kk, vv, segment_ids)
    for parts in (8, 2):
      mesh = jax.make_mesh((8 // parts, parts), ("data", "sequence"),
                           axis_types=(jax.sharding.AxisType.Auto,) * 2)
      with jax.set_mesh(mesh):
        (_, o), split_grads = run(q, kk, vv, segment_ids)
        text = jax.jit(loss).lower(q, kk, vv, segment_ids).as_text()
      assert text.count("all_reduce") == 1, parts
      np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)
      for got, want in zip(split_grads, grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
