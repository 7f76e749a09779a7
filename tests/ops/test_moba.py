"""MoBA: the definition against flash-linear-attention's ``parallel_moba``,
the blockwise form, decoding and prefill against the definition, the
selection's rules, and bad arguments.

Inputs are normal draws, so two gates tie with probability 0 and every
form selects the same blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.moba import blocks
from lin_attn_jax.ops.moba.parallel import moba_mask
from lin_attn_jax.testing import rel_rms

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ops",
                       "moba.npz")
TOL = 1e-5
# Gradients are O(1); the floor keeps a gradient that is zero in the
# reference (a query alone in its block) from dividing rounding by zero.
GRAD_FLOOR = 1e-3
# Three documents in row 0 (13, 22 and 10 tokens: partial last blocks, one
# starting mid-tile), one in row 1.
IDS = np.array([[0] * 13 + [1] * 22 + [2] * 10, [5] * 45], np.int32)


def _normal(seed, shape, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape),
                     dtype)


def _qkv(t, h, hkv, dk=8, dv=6, batch=2, dtype=jnp.float32):
  return (_normal(0, (batch, t, h, dk), dtype),
          _normal(1, (batch, t, hkv, dk), dtype),
          _normal(2, (batch, t, hkv, dv), dtype),
          _normal(3, (batch, t, h, dv)))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _outputs_and_grads(form, options, q, k, v, cotangent, segment_ids):
  """``form(q, k, v)`` and the gradients of ``sum(o * cotangent)``."""
  def run(q, k, v):
    return form(q, k, v, segment_ids=segment_ids, **dict(options))
  o, vjp = jax.vjp(run, q, k, v)
  return o, vjp(cotangent.astype(o.dtype))


def _errors(got, want):
  errors = {"o": rel_rms(got[0], want[0])}
  errors.update({name: rel_rms(g, w, floor=GRAD_FLOOR)
                 for name, g, w in zip(("dq", "dk", "dv"), got[1], want[1])})
  return errors


def test_definition_matches_fla_parallel_moba():
  """fla's own ``parallel_moba`` (flash-attn swapped for dense torch code,
  ``experiments/make_op_fixtures.py``): outputs and gradients, three
  cases over four packed documents."""
  f = np.load(FIXTURE)
  cu = f["cu_seqlens"]
  ids = np.repeat(np.arange(cu.size - 1), np.diff(cu))[None].astype(np.int32)
  q, k, v, do = (jnp.asarray(f[n]) for n in ("q", "k", "v", "do"))
  for case in ("sparse", "full", "all"):
    options = (("block_size", int(f[f"{case}_block_size"])),
               ("top_k", int(f[f"{case}_top_k"])))
    got = _outputs_and_grads(ops.parallel_moba, options, q, k, v, do, ids)
    want = (f[f"{case}_o"], tuple(f[f"{case}_d{n}"] for n in "qkv"))
    errors = _errors(got, want)
    assert max(errors.values()) <= TOL, (case, errors)
  # The cases differ: selection changes the result.
  assert rel_rms(f["sparse_o"], f["full_o"]) > 0.1


# (T, H, Hkv, block_size, top_k, chunk_size, segment ids): T = 1; odd
# lengths with partial last blocks; tiles longer and shorter than blocks;
# grouped and multi-query heads; top_k of 2, 3 and more than any document
# has blocks; top_k = 1 (causal attention).
CASES = [
    (1, 2, 2, 4, 2, 8, False),
    (45, 4, 2, 4, 3, 8, True),
    (50, 2, 1, 8, 2, 4, False),
    (45, 2, 2, 5, 100, 16, True),
    (45, 4, 2, 4, 1, 8, True),
]


@pytest.mark.parametrize("t, h, hkv, block_size, top_k, chunk, docs", CASES)
def test_chunk_matches_definition(t, h, hkv, block_size, top_k, chunk, docs):
  q, k, v, co = _qkv(t, h, hkv)
  ids = jnp.asarray(IDS[:, :t]) if docs else None
  moba = (("block_size", block_size), ("top_k", top_k))
  want = _outputs_and_grads(ops.parallel_moba, moba, q, k, v, co, ids)
  got = _outputs_and_grads(ops.chunk_moba, moba + (("chunk_size", chunk),),
                           q, k, v, co, ids)
  errors = _errors(got, want)
  assert max(errors.values()) <= TOL, errors


def test_every_form_through_the_harness():
  """The registry's forms (chunk, step over a MoBA cache, prefill) against
  the definition, under jit, scan and grad, with grouped heads and
  documents; the chunk form in bfloat16 too (float32 statistics)."""
  spec = registry.get_spec("moba")
  dims = registry.Dims(length=45, heads=4, dim_k=8, dim_v=12)
  testing.check_forms(spec, dims=dims, chunk_size=8, one_program=True)
  testing.check_forms(spec, dims=dims, chunk_size=8, one_program=True,
                      dtype=jnp.bfloat16, forms=("chunk",))


def test_selection_rules():
  """Per query and head, from the mask: its own block up to itself, and
  ``min(top_k - 1, m)`` whole earlier blocks of its document (``m``: the
  blocks before its own), for every ``top_k`` from 1 to more than there
  are blocks; ``top_k = 1``: every earlier key of the document."""
  t, block_size = 45, 4
  q, k, _, _ = _qkv(t, 4, 2)
  doc = jnp.asarray(blocks.documents(jnp.asarray(IDS), 2, t))
  pos = jnp.broadcast_to(jnp.arange(t), (2, t))
  start = blocks.block_starts(pos, blocks.document_starts(doc), block_size)
  mask_of = jax.jit(functools.partial(
      moba_mask, q_pos=pos, q_doc=doc, q_start=start, k_doc=doc,
      k_start=start, block_size=block_size), static_argnames="top_k")
  doc, start = np.asarray(doc), np.asarray(start)
  for top_k in range(1, 7):
    mask = np.broadcast_to(mask_of(q, k, top_k=top_k), (2, 4, t, t))
    for b, h, i in np.ndindex(2, 4, t):
      keys = np.flatnonzero(mask[b, h, i])
      same = doc[b] == doc[b, i]
      if top_k == 1:
        assert keys.tolist() == np.flatnonzero(same[:i + 1]).tolist()
        continue
      own = np.flatnonzero(same & (start[b] == start[b, i]))
      assert keys[-len(own[own <= i]):].tolist() == own[own <= i].tolist()
      picked = np.unique(start[b, keys[keys < start[b, i]]])
      before = (start[b, i] - start[b, same].min()) // block_size
      assert picked.size == min(top_k - 1, before), (top_k, b, h, i)
      for first in picked:
        block = np.flatnonzero(start[b] == first)
        assert block.size == block_size and np.isin(block, keys).all()
        assert same[block].all()


def test_enough_blocks_is_causal_attention():
  """``top_k`` past the number of blocks, and ``top_k = 1``: causal
  attention over each document; fewer blocks: something else."""
  q, k, v, _ = _qkv(45, 4, 2)
  ids = jnp.asarray(IDS)
  causal = ops.parallel_softmax_attn(q, k, v, segment_ids=ids)
  # Row 1 has 11 blocks, row 0's longest document 5.
  for top_k, same in ((1, True), (12, True), (3, False)):
    o = ops.parallel_moba(q, k, v, block_size=4, top_k=top_k,
                          segment_ids=ids)
    assert (rel_rms(o, causal) <= TOL) == same, top_k


def test_packed_documents_are_computed_alone():
  """Blocks start at each document's first token: a document packed after
  others gives what it gives alone (its blocks are not shifted)."""
  q, k, v, _ = _qkv(45, 4, 2, batch=1)
  packed = jax.jit(functools.partial(
      ops.chunk_moba, block_size=4, top_k=3, chunk_size=8,
      segment_ids=jnp.asarray(IDS[:1])))(q, k, v)
  alone = jax.jit(functools.partial(ops.parallel_moba, block_size=4,
                                    top_k=3))
  for lo, hi in ((0, 13), (13, 35), (35, 45)):
    want = alone(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi])
    assert rel_rms(packed[:, lo:hi], want) <= TOL, (lo, hi)


@pytest.mark.parametrize("top_k", [3, 1])
def test_prefill_extend_and_steps_reproduce_the_forward(top_k):
  """A prefill of 20 tokens, 20 more in one call (row 0's third document
  starts inside it), then one token at a time: the definition's outputs;
  and the cache's block sums are those of the last document."""
  t, block_size = 45, 4
  q, k, v, _ = _qkv(t, 4, 2)
  ids = jnp.asarray(IDS)
  want = ops.parallel_moba(q, k, v, block_size=block_size, top_k=top_k,
                           segment_ids=ids)
  extend = jax.jit(functools.partial(ops.moba_extend, top_k=top_k))
  step = jax.jit(functools.partial(ops.moba_step, top_k=top_k))
  cache = ops.init_moba_cache(2, 2, 8, 6, max_length=t,
                              block_size=block_size)
  o1, cache = extend(q[:, :20], k[:, :20], v[:, :20], cache,
                     segment_ids=ids[:, :20])
  o2, cache = extend(q[:, 20:40], k[:, 20:40], v[:, 20:40], cache,
                     segment_ids=ids[:, 20:40],
                     reset=ids[:, 20] != ids[:, 19])
  outs = [o1, o2]
  for i in range(40, t):
    o, cache = step(q[:, i], k[:, i], v[:, i], cache,
                    reset=ids[:, i] != ids[:, i - 1])
    outs.append(o[:, None])
  assert rel_rms(jnp.concatenate(outs, axis=1), want) <= TOL
  # Row 0's last document starts at 35: blocks 35..38 and 39..42 are
  # complete, 43..44 is the current one.
  sums = np.asarray(cache.block_sums[0])
  np.testing.assert_allclose(sums[:2], np.asarray(k[0, 35:43]).reshape(
      2, 4, 2, 8).sum(axis=1), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(cache.current_sum[0], k[0, 43:].sum(axis=0),
                             rtol=1e-6, atol=1e-6)
  assert int(cache.doc_start[0]) == 35 and int(cache.length[1]) == t


def test_step_reads_only_its_blocks():
  """The step gathers its own block and ``top_k - 1`` earlier blocks, not
  the whole cache: with every slot past its own block NaN, its output is
  finite (a softmax over all slots would give 0 * NaN)."""
  block_size, t = 4, 12
  q, k, v, _ = _qkv(t + 1, 2, 2, batch=1)
  cache = ops.init_moba_cache(1, 2, 8, 6, max_length=64,
                              block_size=block_size)
  _, cache = jax.jit(functools.partial(ops.moba_extend, top_k=2))(
      q[:, :t], k[:, :t], v[:, :t], cache)
  poisoned = dataclasses.replace(cache, k=cache.k.at[:, 16:].set(jnp.nan),
                                 v=cache.v.at[:, 16:].set(jnp.nan))
  step = jax.jit(ops.moba_step, static_argnames="top_k")
  o, _ = step(q[:, t], k[:, t], v[:, t], poisoned, top_k=2)
  assert bool(jnp.isfinite(o).all())
  o_causal, _ = step(q[:, t], k[:, t], v[:, t], poisoned, top_k=1)
  assert not bool(jnp.isfinite(o_causal).all())


def test_bad_arguments_name_themselves():
  q, k, v, _ = _qkv(9, 2, 2)
  for form in (ops.parallel_moba, ops.chunk_moba):
    with pytest.raises(ValueError, match="block_size must be a positive"):
      form(q, k, v, block_size=0, top_k=2)
    with pytest.raises(ValueError, match="top_k must be a positive"):
      form(q, k, v, block_size=4, top_k=True)
    with pytest.raises(ValueError, match="k must have shape"):
      form(q, k[:, :5], v, block_size=4, top_k=2)
    with pytest.raises(ValueError, match="segment_ids must have shape"):
      form(q, k, v, block_size=4, top_k=2,
           segment_ids=jnp.zeros((2, 8), jnp.int32))
  with pytest.raises(ValueError, match="chunk_size must be a positive"):
    ops.chunk_moba(q, k, v, block_size=4, top_k=2, chunk_size=0)
  with pytest.raises(ValueError, match="block_size must be a positive"):
    ops.init_moba_cache(2, 2, 8, 6, max_length=9, block_size=-1)
  cache = ops.init_moba_cache(2, 2, 8, 6, max_length=9, block_size=4)
  with pytest.raises(ValueError, match="top_k must be a positive"):
    ops.moba_step(q[:, 0], k[:, 0], v[:, 0], cache, top_k=0)
  with pytest.raises(ValueError, match="cache is full"):
    ops.moba_extend(jnp.concatenate([q, q], 1), jnp.concatenate([k, k], 1),
                    jnp.concatenate([v, v], 1), cache, top_k=2)
