"""Validation of MoBA's inputs and options.

Queries have ``H`` heads, keys and values ``Hkv`` heads with ``H`` a
multiple of ``Hkv`` (query head ``h`` reads key/value head ``h // (H //
Hkv)``), as in the rest of the softmax family.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import check_grouped_qkv


def check_options(block_size, top_k) -> None:
  """``block_size`` (keys per MoBA block) and ``top_k`` (blocks per query,
  its own included): positive ints."""
  checks.positive_int("block_size", block_size)
  checks.positive_int("top_k", top_k)


def validate(q, k, v, segment_ids, block_size, top_k):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V)``."""
  dims = check_grouped_qkv(q, k, v)
  checks.check_segment_ids(segment_ids, dims[0], dims[1])
  check_options(block_size, top_k)
  return dims
