"""Validation of stick-breaking attention's inputs.

Queries have ``H`` heads, keys and values ``Hkv`` heads with ``H`` a multiple
of ``Hkv`` (grouped-query attention); query head ``h`` reads key/value head
``h // (H // Hkv)``, as in the softmax family (``softmax_attn/inputs.py``).
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import check_grouped_qkv


def check_attend_current(attend_current) -> None:
  if not isinstance(attend_current, bool):
    raise ValueError(f"attend_current must be a bool (whether a query sees "
                     f"its own key), got {attend_current!r}")


def validate(q, k, v, segment_ids, attend_current):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V)``."""
  shape = check_grouped_qkv(q, k, v)
  checks.check_segment_ids(segment_ids, shape[0], shape[1])
  check_attend_current(attend_current)
  return shape
