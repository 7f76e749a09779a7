"""Argument checks of the Sparse Transformer forms."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import check_grouped_qkv
from lin_attn_jax.ops.sparse_attn import patterns


def validate(q, k, v, segment_ids, pattern, stride, summary_size):
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  checks.check_segment_ids(segment_ids, b, t)
  patterns.check_pattern(pattern, stride, summary_size)
  return b, t, dk
