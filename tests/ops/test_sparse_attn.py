"""Sparse Transformer attention: block-sparse form against the dense mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops import (parallel_sparse_attn, sparse_attn_mask,
                              sparse_attn_reference)
from lin_attn_jax.ops.softmax_attn.blocksparse import make_schedule
from lin_attn_jax.ops.sparse_attn.parallel import (fixed_block_pairs,
                                                   local_block_pairs,
                                                   residue_block_pairs,
                                                   residue_major_positions)
from tests.ops.test_softmax_attn import assert_match, document_mask, make_qkv


def written_out_mask(t, pattern, stride, summary, causal):
  """Child et al.'s sets, entry by entry."""
  mask = np.zeros((t, t), bool)
  for i in range(t):
    for j in range(t):
      if causal and j > i:
        continue
      if pattern == "strided":
        near = (i - j < stride) if causal else abs(i - j) < stride
        mask[i, j] = near or (i - j) % stride == 0
      else:
        mask[i, j] = i // stride == j // stride or j % stride >= stride - summary
  return mask


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("causal", [True, False])
def test_mask_is_the_paper_pattern(pattern, causal):
  np.testing.assert_array_equal(
      sparse_attn_mask(45, pattern=pattern, stride=6, summary_size=2,
                       causal=causal),
      written_out_mask(45, pattern, 6, 2, causal))


SEGMENTS = np.array([[0] * 30 + [1] * 45 + [2] * 26, [7] * 101])


@pytest.mark.parametrize("pattern, causal, stride, heads, segments", [
    ("strided", True, 10, (4, 2), True),
    ("strided", False, 7, (2, 2), False),
    ("fixed", True, 12, (4, 1), True),
    ("fixed", False, 9, (2, 2), False),
])
def test_block_sparse_matches_dense_reference(pattern, causal, stride, heads,
                                              segments):
  h, hkv = heads
  q, k, v, co = make_qkv(11, 2, 101, h, hkv, 16, 16)
  kwargs = dict(pattern=pattern, stride=stride, summary_size=3, causal=causal,
                segment_ids=jnp.asarray(SEGMENTS) if segments else None)
  mask = written_out_mask(101, pattern, stride, 3, causal)[None, None]
  if segments:
    mask = mask & document_mask(SEGMENTS)
  dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask)
  assert_match(lambda q, k, v: sparse_attn_reference(q, k, v, **kwargs),
               dense, q, k, v, co)
  assert_match(lambda q, k, v: parallel_sparse_attn(q, k, v, block_size=16,
                                                    **kwargs),
               dense, q, k, v, co)


def computed_entries(pairs, rows_per_block, num_q_blocks):
  sched = make_schedule(*pairs, num_q_blocks=num_q_blocks)
  return int(sched.active.sum()) * rows_per_block ** 2


def test_empty_blocks_are_skipped():
  """At T = 4096, l = 64 the computed block entries stay within a small
  factor of the pattern's nonzeros and far below the causal T^2 / 2."""
  t, stride, c = 4096, 64, 32
  n = t // c
  allowed = {p: int(sparse_attn_mask(t, pattern=p, stride=stride,
                                     summary_size=4).sum())
             for p in ("strided", "fixed")}
  c_group = min(c, t // stride)
  _, per_group = residue_major_positions(t, stride, c_group)
  strided = (computed_entries(local_block_pairs(t, stride, c, causal=True),
                              c, n)
             + computed_entries(residue_block_pairs(stride, per_group,
                                                    causal=True),
                                c_group, stride * per_group))
  summary = np.arange(t)[np.arange(t) % stride >= stride - 4]
  fixed = computed_entries(fixed_block_pairs(t, stride, summary, c,
                                             causal=True), c, n)
  causal_entries = t * (t + 1) // 2
  for name, computed in (("strided", strided), ("fixed", fixed)):
    assert computed >= allowed[name]
    assert computed <= 2.5 * allowed[name], name
    assert computed <= 0.2 * causal_entries, name


def test_bad_input():
  q = k = v = jnp.ones((1, 20, 2, 8))
  with pytest.raises(ValueError, match="pattern"):
    parallel_sparse_attn(q, k, v, stride=4, pattern="dilated")
  with pytest.raises(ValueError, match="stride"):
    parallel_sparse_attn(q, k, v, stride=0)
  with pytest.raises(ValueError, match="summary_size"):
    parallel_sparse_attn(q, k, v, stride=4, pattern="fixed", summary_size=5)
  with pytest.raises(ValueError, match="multiple"):
    parallel_sparse_attn(jnp.ones((1, 20, 3, 8)), k, v, stride=4)
