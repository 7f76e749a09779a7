"""Which key position ``j`` a query at position ``i`` may attend to.

Every function takes integer position arrays (numpy or jax) that broadcast against each
other (``i [..., Tq, 1]`` and ``j [..., 1, Tk]`` for a dense mask, blocks of
positions in the blockwise forms) and returns a boolean array. Positions are
sequence positions, so one rule serves the dense form, the blockwise form and
copies of rows or columns gathered out of order.

- causal: ``j <= i``; without it every ``j``.
- window ``w``: ``i - w < j <= i`` (the query and the ``w - 1`` keys before
  it); without causality ``|i - j| < w``.
- global positions (Longformer): a global query attends to every key and a
  global key is attended by every query, still subject to causality and to
  document boundaries. Without a window the pattern is already full and
  global positions change nothing.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Rules of the blockwise passes; a pair of blocks carries one of these ids.
BASE = 0           # causal + window
GLOBAL_KEY = 1     # a copy of a global key, outside the query's window
GLOBAL_QUERY = 2   # a copy of a global query, keys outside its window that
                   # are not global (those are counted by GLOBAL_KEY)


def _everything(i, j):
  """All True; a numpy constant, so numpy positions give a numpy mask."""
  return np.ones(np.broadcast_shapes(np.shape(i), np.shape(j)), bool)


def causal_mask(i, j, causal: bool):
  if causal:
    return j <= i
  return _everything(i, j)


def window_mask(i, j, window_size, causal: bool):
  """``j`` inside the window of ``i`` (all True without a window)."""
  if window_size is None:
    return _everything(i, j)
  if causal:
    return i - j < window_size
  return abs(i - j) < window_size


def is_global(j, global_flags: np.ndarray):
  """Looks positions up in a static ``[T]`` bool table (False for j < 0)."""
  if not global_flags.any():
    return jnp.zeros(jnp.shape(j), bool)
  table = jnp.asarray(global_flags)
  return jnp.where(j >= 0, table[jnp.clip(j, 0, table.shape[0] - 1)], False)


def global_flags_table(global_positions: np.ndarray, length: int) -> np.ndarray:
  flags = np.zeros((length,), bool)
  flags[global_positions] = True
  return flags


def dense_mask(i, j, *, causal, window_size, global_flags):
  """The whole pattern: causal and (in window or either end global)."""
  allowed = window_mask(i, j, window_size, causal)
  if window_size is not None and global_flags.any():
    allowed = allowed | is_global(i, global_flags) | is_global(j, global_flags)
  return causal_mask(i, j, causal) & allowed


class WindowGlobalRule:
  """The rule ids above as one callable ``(i, j, rule_id) -> bool``.

  Each allowed pair ``(i, j)`` is counted by exactly one rule: BASE inside
  the window, GLOBAL_KEY for a global ``j`` outside it, GLOBAL_QUERY for a
  global ``i`` and a non-global ``j`` outside it.
  """

  def __init__(self, *, causal: bool, window_size, global_flags: np.ndarray):
    self.causal = causal
    self.window_size = window_size
    self.global_flags = global_flags

  def __call__(self, i, j, rule_id):
    ok = causal_mask(i, j, self.causal)
    inside = window_mask(i, j, self.window_size, self.causal)
    base = ok & inside
    if self.window_size is None or not self.global_flags.any():
      return base
    outside = ok & ~inside
    global_query = outside & ~is_global(j, self.global_flags)
    return jnp.where(rule_id == BASE, base,
                     jnp.where(rule_id == GLOBAL_KEY, outside, global_query))
