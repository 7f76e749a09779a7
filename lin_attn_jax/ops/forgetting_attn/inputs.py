"""Validation of the Forgetting Transformer's inputs.

q, k and v are those of the softmax family (``softmax_attn/inputs.py``:
``H`` query heads, ``Hkv`` key/value heads, ``H`` a multiple of ``Hkv``);
the log forget gate ``g`` has one value per token and query head, ``<= 0``.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import (check_grouped_qkv,
                                                  check_window)


def check_gate(g, shape, layout: str) -> None:
  """``g`` of ``shape`` (``[B, T, H]``, or ``[B, H]`` for a step), float,
  and ``<= 0`` where concrete."""
  checks.check_rank("g", g, len(shape), layout)
  checks.check_float("g", g)
  checks.check_shape("g", g, shape, layout)
  checks.check_nonpositive("g", g)


def validate(q, k, v, g, segment_ids, window_size):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V)``."""
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  check_gate(g, (b, t, h), "[B, T, H] of q")
  checks.check_segment_ids(segment_ids, b, t)
  check_window(window_size)
  return b, t, h, hkv, dk, dv
