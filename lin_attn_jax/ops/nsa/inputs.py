"""Validation of native sparse attention's inputs.

Queries have ``H`` heads, keys and values ``Hkv`` heads with ``H`` a
multiple of ``Hkv`` (query head ``h`` reads key/value head ``h // (H //
Hkv)``, as in ``softmax_attn``); the three gates have one value per query
token and head.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import (check_grouped_qkv,
                                                  check_window)

GATES = ("g_cmp", "g_slc", "g_swa")


def check_options(block_size, block_counts, window_size) -> None:
  checks.positive_int("block_size", block_size)
  checks.positive_int("block_counts", block_counts)
  check_window(window_size)


def check_gates(gates, shape, layout: str, window_size) -> None:
  """``gates``: ``(g_cmp, g_slc, g_swa)``, each of ``shape``; ``g_swa``
  is given exactly when there is a window."""
  for name, g in zip(GATES, gates):
    if name == "g_swa":
      if window_size is None and g is not None:
        raise ValueError("g_swa must be None without a window (window_size "
                         "is None: there is no sliding-window branch)")
      if window_size is not None and g is None:
        raise ValueError(f"g_swa must be given with window_size = "
                         f"{window_size} (the sliding-window branch's gate)")
      if g is None:
        continue
    checks.check_rank(name, g, len(shape), layout)
    checks.check_float(name, g)
    checks.check_shape(name, g, shape, layout)


def validate(q, k, v, gates, segment_ids, *, block_size, block_counts,
             window_size):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V)``."""
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  check_gates(gates, (b, t, h), "[B, T, H]", window_size)
  checks.check_segment_ids(segment_ids, b, t)
  check_options(block_size, block_counts, window_size)
  return b, t, h, hkv, dk, dv
