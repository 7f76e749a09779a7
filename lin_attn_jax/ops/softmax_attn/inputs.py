"""Validation of the softmax family's inputs.

Queries have ``H`` heads, keys and values ``Hkv`` heads with ``H`` a multiple
of ``Hkv`` (grouped-query attention; ``Hkv = 1`` is multi-query attention).
Query head ``h`` reads key/value head ``h // (H // Hkv)``.
"""

from __future__ import annotations

import jax
import numpy as np

from lin_attn_jax.ops.common import checks


def default_scale(scale, dk: int) -> float:
  return dk ** -0.5 if scale is None else scale


def check_grouped_qkv(q, k, v):
  """Validates ``q [B, T, H, K]``, ``k [B, T, Hkv, K]``, ``v [B, T, Hkv, V]``.

  Returns:
    ``(B, T, H, Hkv, K, V)``.
  """
  checks.check_rank("q", q, 4, "[B, T, H, K]")
  checks.check_rank("k", k, 4, "[B, T, Hkv, K]")
  checks.check_rank("v", v, 4, "[B, T, Hkv, V]")
  for name, x in (("q", q), ("k", k), ("v", v)):
    checks.check_float(name, x)
  b, t, h, dk = checks.shape_of(q)
  bk, tk, hkv, dkk = checks.shape_of(k)
  if (bk, tk, dkk) != (b, t, dk):
    raise ValueError(f"k must have shape [B, T, Hkv, K] with B, T, K of q "
                     f"{checks.shape_of(q)}, got {checks.shape_of(k)}")
  if checks.shape_of(v)[:3] != (b, t, hkv):
    raise ValueError(f"v must agree with k on [B, T, Hkv] = {(b, t, hkv)}, "
                     f"got v of shape {checks.shape_of(v)}")
  check_heads(h, hkv, checks.shape_of(q), checks.shape_of(k))
  return b, t, h, hkv, dk, checks.shape_of(v)[3]


def check_heads(h: int, hkv: int, q_shape, k_shape) -> None:
  if hkv < 1 or h % hkv:
    raise ValueError(f"the heads of q (H = {h}) must be a multiple of the "
                     f"heads of k and v (Hkv = {hkv}); q has shape {q_shape}, "
                     f"k has shape {k_shape}")


def check_values_from_keys(values_from_keys, dk: int) -> None:
  """``values_from_keys`` of the cached forms: None, or a width in ``[1,
  K]``."""
  if values_from_keys is None:
    return
  if (isinstance(values_from_keys, bool)
      or not isinstance(values_from_keys, (int, np.integer))
      or not 1 <= values_from_keys <= dk):
    raise ValueError(f"values_from_keys must be None or an integer in [1, K "
                     f"= {dk}], got {values_from_keys!r}")


def check_window(window_size) -> None:
  if window_size is None:
    return
  if (isinstance(window_size, bool)
      or not isinstance(window_size, (int, np.integer)) or window_size < 1):
    raise ValueError(f"window_size must be None or an integer >= 1 (the query "
                     f"and the window_size - 1 keys before it), got "
                     f"{window_size!r}")


def check_block_size(block_size) -> None:
  checks.positive_int("block_size", block_size)


def global_positions_array(global_positions, length: int) -> np.ndarray:
  """Static, sorted, distinct global positions as a numpy int array.

  Raises ``ValueError`` for traced values, non-integers and positions outside
  ``[0, length)``.
  """
  if global_positions is None:
    return np.zeros((0,), np.int64)
  if isinstance(global_positions, jax.core.Tracer):
    raise ValueError("global_positions must be static (a list or a numpy "
                     "array of ints), not a traced array")
  positions = np.asarray(global_positions)
  if positions.ndim != 1:
    raise ValueError(f"global_positions must be a 1-d sequence of positions, "
                     f"got shape {positions.shape}")
  if positions.size and not np.issubdtype(positions.dtype, np.integer):
    raise ValueError(f"global_positions must hold integers, got dtype "
                     f"{positions.dtype}")
  bad = positions[(positions < 0) | (positions >= length)]
  if bad.size:
    raise ValueError(f"global_positions must lie in [0, T) = [0, {length}), "
                     f"got {bad.tolist()}")
  return np.unique(positions.astype(np.int64))


def validate(q, k, v, segment_ids, window_size, global_positions):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V, globals)``."""
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  checks.check_segment_ids(segment_ids, b, t)
  check_window(window_size)
  glob = global_positions_array(global_positions, t)
  return b, t, h, hkv, dk, dv, glob
