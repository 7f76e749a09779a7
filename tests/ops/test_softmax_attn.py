"""Softmax attention: parallel and blockwise forms, global tokens, KV cache."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops import (chunk_softmax_attn, init_kv_cache,
                              parallel_softmax_attn, softmax_attn_extend,
                              softmax_attn_step)
from lin_attn_jax.ops.softmax_attn.blocksparse import make_schedule
from lin_attn_jax.ops.softmax_attn.chunk import sequence_block_pairs
from lin_attn_jax.testing import rel_rms

TOL = 1e-5
GRAD_TOL = 1e-4


def make_qkv(seed, b, t, h, hkv, dk, dv, dtype=jnp.float32):
  kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(kq, (b, t, h, dk), dtype)
  k = jax.random.normal(kk, (b, t, hkv, dk), dtype)
  v = jax.random.normal(kv, (b, t, hkv, dv), dtype)
  cotangent = jax.random.normal(kc, (b, t, h, dv), jnp.float32)
  return q, k, v, cotangent


def outputs_and_grads(fn, q, k, v, cotangent):
  """``fn(q, k, v)`` and the gradients of ``sum(fn(q, k, v) * cotangent)``."""

  @jax.jit
  def run(q, k, v, cotangent):
    o, vjp = jax.vjp(fn, q, k, v)
    return o, vjp(cotangent.astype(o.dtype))

  return run(q, k, v, cotangent)


def assert_match(fn, ref, q, k, v, cotangent, tol=TOL, grad_tol=GRAD_TOL):
  o, grads = outputs_and_grads(fn, q, k, v, cotangent)
  ro, rgrads = outputs_and_grads(ref, q, k, v, cotangent)
  assert o.dtype == v.dtype
  errors = {"o": rel_rms(o, ro)}
  # Gradients are O(1) here; the floor keeps an exactly-zero reference
  # gradient (T = 1: one key, softmax = 1) from dividing rounding by zero.
  errors.update({name: rel_rms(g, rg, floor=1e-3)
                 for name, g, rg in zip(("dq", "dk", "dv"), grads, rgrads)})
  bad = {n: e for n, e in errors.items()
         if not e <= (tol if n == "o" else grad_tol)}
  assert not bad, f"over tolerance: {bad}; all: {errors}"


def dpa(causal, window_size, mask=None):
  """``jax.nn.dot_product_attention`` with our window convention."""
  window = None
  if window_size is not None:
    window = (window_size - 1, 0 if causal else window_size - 1)
  return lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, mask=mask, is_causal=causal, local_window_size=window)


def chunked(**kwargs):
  return lambda q, k, v: chunk_softmax_attn(q, k, v, **kwargs)


def parallel(**kwargs):
  return lambda q, k, v: parallel_softmax_attn(q, k, v, **kwargs)


@pytest.mark.parametrize("t, causal, window_size, heads", [
    (1, True, None, (2, 2)),
    (63, True, None, (4, 2)),
    (63, False, None, (4, 1)),
    (100, True, 17, (4, 2)),
    (100, False, 17, (2, 2)),
])
def test_matches_dot_product_attention(t, causal, window_size, heads):
  h, hkv = heads
  q, k, v, co = make_qkv(t, 2, t, h, hkv, 16, 16)
  ref = dpa(causal, window_size)
  kwargs = dict(causal=causal, window_size=window_size)
  assert_match(parallel(**kwargs), ref, q, k, v, co)
  assert_match(chunked(block_size=16, **kwargs), ref, q, k, v, co)


@pytest.mark.parametrize("block_size", [8, 200])
def test_chunk_matches_parallel_value_width(block_size):
  """K != V, a window not a multiple of the block, several block sizes."""
  q, k, v, co = make_qkv(1, 1, 70, 4, 2, 8, 24)
  kwargs = dict(window_size=13)
  assert_match(chunked(block_size=block_size, **kwargs), parallel(**kwargs),
               q, k, v, co)


# Window 20 in blocks of 16 takes the blockwise pass, 9 in blocks of 8 the
# banded one (``banded_fits``).
@pytest.mark.parametrize("window_size, block_size", [(20, 16), (9, 8)])
def test_bfloat16_accumulates_in_float32(window_size, block_size):
  q, k, v, co = make_qkv(2, 1, 90, 2, 2, 16, 16, jnp.bfloat16)
  o = jax.jit(chunked(window_size=window_size, block_size=block_size))(
      q, k, v)
  ref = jax.jit(parallel(window_size=window_size))(
      *(x.astype(jnp.float32) for x in (q, k, v)))
  assert o.dtype == jnp.bfloat16
  assert rel_rms(o, ref) <= 1e-2


def test_scale_is_used():
  q, k, v, co = make_qkv(3, 1, 40, 2, 2, 16, 16)
  ref = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=0.7,
                                                     is_causal=True)
  assert_match(chunked(scale=0.7, block_size=16), ref, q, k, v, co)
  assert rel_rms(dpa(True, None)(q, k, v), ref(q, k, v)) > 1e-2


SEGMENTS = np.array([[0] * 20 + [1] * 33 + [0] * 17,      # three documents
                     [4] * 70])


def document_mask(segments):
  """``[B, 1, T, T]``: same document (a new one wherever the id changes)."""
  doc = np.cumsum(np.concatenate([np.zeros((segments.shape[0], 1), int),
                                  np.diff(segments, axis=1) != 0], 1), 1)
  return (doc[:, :, None] == doc[:, None, :])[:, None]


@pytest.mark.parametrize("form", ["parallel", "chunk"])
@pytest.mark.parametrize("window_size", [None, 12])
def test_segments_block_attention(form, window_size):
  """Changing one document's tokens changes no other document's outputs."""
  q, k, v, co = make_qkv(4, 2, 70, 4, 2, 16, 16)
  fn = {"parallel": parallel, "chunk": lambda **kw: chunked(block_size=16,
                                                            **kw)}[form]
  packed = jax.jit(fn(window_size=window_size,
                      segment_ids=jnp.asarray(SEGMENTS)))
  middle = np.zeros((2, 70, 1, 1), bool)
  middle[0, 20:53] = True                      # the second document of row 0
  noise = make_qkv(5, 2, 70, 4, 2, 16, 16)[:3]
  changed = [jnp.where(middle, n, x) for n, x in zip(noise, (q, k, v))]
  o, o_changed = packed(q, k, v), packed(*changed)
  outside = ~middle[:, :, 0, 0]
  np.testing.assert_allclose(o_changed[outside], o[outside], rtol=0, atol=1e-6)
  assert rel_rms(o_changed[0, 20:53], o[0, 20:53]) > 0.1
  if form == "chunk":
    assert_match(fn(window_size=window_size,
                    segment_ids=jnp.asarray(SEGMENTS)),
                 dpa(True, window_size, document_mask(SEGMENTS)), q, k, v, co)


def longformer_mask(t, window_size, global_positions, causal, segments):
  """The Longformer pattern written out entry by entry."""
  mask = np.zeros((t, t), bool)
  glob = set(global_positions)
  for i in range(t):
    for j in range(t):
      if causal and j > i:
        continue
      mask[i, j] = abs(i - j) < window_size or i in glob or j in glob
  return mask[None, None] & document_mask(segments)


@pytest.mark.parametrize("causal, global_positions", [
    (True, [0]), (True, [3, 31, 32, 69]), (False, [3, 31, 32, 69])])
def test_global_tokens_match_dense_mask(causal, global_positions):
  q, k, v, co = make_qkv(5, 2, 70, 4, 2, 16, 16)
  segments = jnp.asarray(SEGMENTS)
  ref = dpa(False, None, longformer_mask(70, 9, global_positions, causal,
                                         SEGMENTS))
  kwargs = dict(causal=causal, window_size=9, segment_ids=segments,
                global_positions=global_positions)
  assert_match(parallel(**kwargs), ref, q, k, v, co)
  assert_match(chunked(block_size=16, **kwargs), ref, q, k, v, co)


def test_window_skips_blocks():
  """A window visits ceil((w - 1) / C) + 1 key blocks per query block; full
  causal attention packs the N (N + 1) / 2 pairs into about N / 2 slots."""
  t, c, n = 1024, 32, 32
  none = np.zeros((0,), np.int64)
  pairs = sequence_block_pairs(t, c, none, causal=True, window_size=100)
  sched = make_schedule(*pairs, num_q_blocks=n)
  assert sched.active.sum() == sum(min(qn, 4) + 1 for qn in range(n))
  assert sched.q_block.shape[0] == 5 and sched.q_block.shape[1] <= n
  pairs = sequence_block_pairs(t, c, none, causal=True, window_size=None)
  sched = make_schedule(*pairs, num_q_blocks=n)
  assert sched.active.sum() == n * (n + 1) // 2
  assert sched.q_block.shape == (n, n // 2 + 1)
  for rnd in range(sched.q_block.shape[0]):
    busy = sched.q_block[rnd][sched.active[rnd]]
    assert len(set(busy.tolist())) == busy.size


def decode(q, k, v, cache, resets):
  """One jitted step per token (inputs sliced in numpy: no op per slice)."""
  step = jax.jit(softmax_attn_step)
  q, k, v = (np.asarray(x) for x in (q, k, v))
  outs = []
  for t in range(q.shape[1]):
    o, cache = step(q[:, t], k[:, t], v[:, t], cache, reset=resets[:, t])
    outs.append(np.asarray(o))
  return np.stack(outs, axis=1)


@pytest.mark.parametrize("window_size", [None, 1, 7])
def test_cache_decoding_matches_parallel(window_size):
  """Decode 30 tokens (more than the window) with documents restarting."""
  b, t, h, hkv, dk, dv = 2, 30, 4, 2, 8, 12
  q, k, v, _ = make_qkv(7, b, t, h, hkv, dk, dv)
  segments = np.array([[0] * 12 + [1] * 18, [3] * 5 + [2] * 25])
  resets = np.concatenate([np.zeros((b, 1), bool),
                           segments[:, 1:] != segments[:, :-1]], 1)
  cache = init_kv_cache(b, hkv, dk, dv, max_length=t, window_size=window_size)
  if window_size is not None:
    assert cache.k.shape[1] == window_size
  o = decode(q, k, v, cache, resets)
  ref = jax.jit(parallel(window_size=window_size,
                        segment_ids=jnp.asarray(segments)))(q, k, v)
  assert rel_rms(o, ref) <= TOL


def test_values_from_keys():
  """A cache whose values are the first V key channels (MLA's latent
  cache): a prefill and steps give what the same cache with ``v = k[...,
  :V]`` stored gives, and the stored values stay zero-width."""
  b, t, h, dk, dv = 2, 9, 4, 10, 6
  q, k, _, _ = make_qkv(3, b, t, h, 1, dk, dv)
  segments = jnp.asarray([[0] * 4 + [1] * 5, [2] * 9])

  @jax.jit
  def both(q, k, segments):
    full = init_kv_cache(b, 1, dk, dv, max_length=t)
    o_ref, _ = softmax_attn_extend(q, k, k[..., :dv], full, scale=0.3,
                                   segment_ids=segments)
    latent = init_kv_cache(b, 1, dk, 0, max_length=t)
    o, latent = softmax_attn_extend(q[:, :5], k[:, :5], k[:, :5, :, :0],
                                    latent, scale=0.3,
                                    segment_ids=segments[:, :5],
                                    values_from_keys=dv)
    outs = [o]
    for i in range(5, t):
      o, latent = softmax_attn_step(q[:, i], k[:, i], k[:, i, :, :0],
                                    latent, scale=0.3, values_from_keys=dv)
      outs.append(o[:, None])
    return o_ref, outs, latent

  o_ref, outs, latent = both(q, k, segments)
  assert latent.v.shape == (b, t, 1, 0)
  assert rel_rms(jnp.concatenate(outs, axis=1), o_ref) <= TOL
  with pytest.raises(ValueError, match="values_from_keys"):
    softmax_attn_step(q[:, 0], k[:, 0], k[:, 0, :, :0],
                      init_kv_cache(b, 1, dk, 0, max_length=t),
                      values_from_keys=dk + 1)


def test_cache_bad_input():
  cache = init_kv_cache(1, 2, 8, 8, window_size=4)
  q = jnp.ones((1, 3, 8))
  with pytest.raises(ValueError, match="multiple"):
    softmax_attn_step(q, jnp.ones((1, 2, 8)), jnp.ones((1, 2, 8)), cache)
  with pytest.raises(ValueError, match="k must have shape"):
    softmax_attn_step(jnp.ones((1, 4, 8)), jnp.ones((1, 3, 8)),
                      jnp.ones((1, 2, 8)), cache)
  with pytest.raises(ValueError, match="window_size"):
    init_kv_cache(1, 2, 8, 8, window_size=0)
  with pytest.raises(ValueError, match="max_length"):
    init_kv_cache(1, 2, 8, 8)
  full = init_kv_cache(1, 2, 8, 8, max_length=1)
  q, kv = jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8))
  _, full = softmax_attn_step(q, kv, kv, full)
  with pytest.raises(ValueError, match="cache is full"):
    softmax_attn_step(q, kv, kv, full)


@pytest.mark.parametrize("form", [parallel_softmax_attn, chunk_softmax_attn])
def test_bad_input(form):
  q = jnp.ones((1, 10, 3, 8))
  kv = jnp.ones((1, 10, 2, 8))
  with pytest.raises(ValueError, match=r"multiple.*\(1, 10, 3, 8\)"):
    form(q, kv, kv)
  q = jnp.ones((1, 10, 4, 8))
  with pytest.raises(ValueError, match="window_size"):
    form(q, kv, kv, window_size=0)
  with pytest.raises(ValueError, match="global_positions.*10"):
    form(q, kv, kv, window_size=3, global_positions=[2, 10])
  with pytest.raises(ValueError, match="global_positions"):
    form(q, kv, kv, window_size=3, global_positions=[-1])
  with pytest.raises(ValueError, match="segment_ids"):
    form(q, kv, kv, segment_ids=jnp.zeros((1, 9), jnp.int32))
  with pytest.raises(ValueError, match="v must agree"):
    form(q, kv, jnp.ones((1, 9, 2, 8)))
  with pytest.raises(ValueError, match="k must have"):
    form(q, jnp.ones((1, 10, 2, 4)), kv)


def test_chunk_never_forms_the_score_matrix():
  """Forward and backward together stay well below one [T, T] float32
  matrix (the dense form needs several)."""
  t = 2048
  q = jnp.ones((1, t, 1, 16))
  loss = lambda q: jnp.sum(chunk_softmax_attn(q, q, q, block_size=64))
  compiled = jax.jit(jax.grad(loss)).lower(q).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < 0.25 * t * t * 4


def test_window_over_groups_of_blocks(monkeypatch):
  """The causal window's dense path over rematerialised groups of blocks
  (groups of 2 blocks here, the last one padded), with documents and
  grouped heads, against the parallel form."""
  module = importlib.import_module("lin_attn_jax.ops.softmax_attn.chunk")
  monkeypatch.setattr(module, "chunks_in_budget", lambda chunk, width: 2)
  q, k, v, co = make_qkv(4, 2, 70, 4, 2, 8, 12)
  ids = jnp.asarray(SEGMENTS)
  assert module.banded_fits(70, 4, 9)
  assert_match(
      lambda q, k, v: chunk_softmax_attn(q, k, v, window_size=9,
                                         block_size=4, segment_ids=ids),
      lambda q, k, v: parallel_softmax_attn(q, k, v, window_size=9,
                                            segment_ids=ids),
      q, k, v, co)


def test_banded_path_only_for_short_windows():
  module = importlib.import_module("lin_attn_jax.ops.softmax_attn.chunk")
  assert module.banded_fits(4096, 64, 64)        # Based's window
  assert module.banded_fits(4096, 128, 512)
  assert not module.banded_fits(256, 128, 512)   # the window spans T


def test_banded_path_under_jit_scan_and_grad():
  """The banded path with every input traced: inside ``lax.scan`` and
  under ``grad`` and ``jit``, equal to the plain call's gradients."""
  module = importlib.import_module("lin_attn_jax.ops.softmax_attn.chunk")
  assert module.banded_fits(40, 4, 5)
  q, k, v, co = make_qkv(5, 1, 40, 2, 2, 8, 8)

  def loss(q, k, v):
    return jnp.sum(chunk_softmax_attn(q, k, v, window_size=5, block_size=4)
                   * co)

  grad = jax.grad(loss, argnums=(0, 1, 2))
  scanned = jax.jit(lambda *a: jax.lax.scan(
      lambda carry, _: (carry, grad(*a)), 0, None, length=1)[1])(q, k, v)
  for got, want in zip(scanned, grad(q, k, v)):
    np.testing.assert_allclose(np.asarray(got)[0], np.asarray(want),
                               rtol=1e-5, atol=1e-6)
