"""Argument checks of log-linear attention, and its Fenwick-tree levels.

Token ``s`` reaches query ``t`` (``s <= t``, one document, positions ``p``
counted from the document's start) at level

    level(t, s) = min(bits(p_t XOR p_s), L - 1)      (0 for s = t)

``bits(x)`` the number of binary digits of ``x``: the Fenwick-tree bucket
of ``s`` seen from ``t``, the buckets doubling in size with the level, and
all buckets from ``L - 1`` up held in the top level. Equivalently ``s``
is in a level ``<= l < L - 1`` iff ``p_t >> l == p_s >> l``: the tokens
of levels ``0..l`` are those of ``t``'s aligned block of ``2^l`` positions
(``block_terms``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import document_index, reset_flags

_F32 = jnp.float32


def default_scale(scale, dk: int) -> float:
  return dk ** -0.5 if scale is None else scale


def _check_offset(offset, batch: int):
  """An int ``>= 0`` or a ``[B]`` integer array (values checked when
  concrete)."""
  if isinstance(offset, (int, np.integer)) and not isinstance(offset, bool):
    if offset < 0:
      raise ValueError(f"offset must be >= 0, got {offset}")
    return
  if not hasattr(offset, "shape") or not jnp.issubdtype(
      jnp.result_type(offset), jnp.integer):
    raise ValueError(f"offset must be an int or a [B] integer array, got "
                     f"{offset!r}")
  checks.check_shape("offset", offset, (batch,), "[B]")
  values = checks.concrete(offset)
  if values is not None and np.any(values < 0):
    raise ValueError(f"offset must be >= 0, got a minimum of "
                     f"{int(values.min())}")


def _check_gates(g, level_scales, lead, layout):
  checks.check_float("g", g)
  checks.check_shape("g", g, lead, layout)
  checks.check_nonpositive("g", g)
  checks.check_float("level_scales", level_scales)
  checks.check_rank("level_scales", level_scales, len(lead) + 1,
                    layout[:-1] + ", L]")
  if checks.shape_of(level_scales)[:-1] != tuple(lead):
    raise ValueError(f"level_scales must have shape {tuple(lead)} + (L,) "
                     f"{layout[:-1]}, L], got "
                     f"{checks.shape_of(level_scales)}")
  return checks.shape_of(level_scales)[-1]


def validate(q, k, v, g, level_scales, initial_state, segment_ids, offset):
  """Checks a sequence call; returns ``(B, T, H, K, V, L)``."""
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  levels = _check_gates(g, level_scales, (b, t, h), "[B, T, H]")
  checks.check_state("initial_state", initial_state, (b, h, levels, dk, dv),
                     "[B, H, L, K, V]")
  checks.check_segment_ids(segment_ids, b, t)
  _check_offset(offset, b)
  return b, t, h, dk, dv, levels


def validate_step(q, k, v, g, level_scales, state, reset, offset):
  """Checks a decoding step; returns ``(B, H, K, V, L)``."""
  b, h, dk, dv = checks.check_qkv_step(q, k, v)
  levels = _check_gates(g, level_scales, (b, h), "[B, H]")
  checks.check_state("state", state, (b, h, levels, dk, dv),
                     "[B, H, L, K, V]")
  checks.check_reset(reset, b)
  _check_offset(offset, b)
  return b, h, dk, dv, levels


def bit_length(x):
  """Binary digits of ``x >= 0`` (int32): 0 for 0, ``floor(log2 x) + 1``
  otherwise."""
  x = jnp.asarray(x, jnp.int32)
  return 32 - jax.lax.clz(x)


def merge_level(position, levels: int):
  """The level a token at ``position`` merges levels ``0..m`` into before
  it enters (the carry of a binary counter): ``ctz(p) + 1``, and the top
  level ``L - 1`` at a document's first token or above it."""
  position = jnp.asarray(position, jnp.int32)
  lowest = bit_length(position & -position)                 # ctz(p) + 1
  return jnp.where(position == 0, levels - 1,
                   jnp.minimum(lowest, levels - 1))


def level_of(p_query, p_key, levels: int):
  """``min(bits(p_query XOR p_key), L - 1)``, the level of a pair."""
  return jnp.minimum(bit_length(jnp.bitwise_xor(p_query, p_key)), levels - 1)


def positions(segment_ids, offset, batch: int, length: int):
  """``[B, T]`` int32: each token's position in its document, the first
  document of a row starting at ``offset`` (an int or ``[B]``), the others
  at 0."""
  index = jnp.arange(length, dtype=jnp.int32)[None]            # [1, T]
  reset = reset_flags(segment_ids, batch, length)               # [B, T]
  start = jax.lax.cummax(jnp.where(reset, index, 0), axis=1)    # [B, T]
  offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32), (batch,))
  return index - start + jnp.where(start == 0, offset[:, None], 0)


def max_position(offset, length: int):
  """An upper bound of the positions of a call when ``offset`` is concrete
  (``offset + T - 1``), else None."""
  values = checks.concrete(offset)
  if values is None:
    return None
  return int(np.max(values)) + length - 1


def cumulative(levels_state):
  """Fenwick level states ``[B, H, L, K, V]`` -> block states ``F_l =
  sum_{j <= l} S_j``."""
  return jnp.cumsum(jnp.asarray(levels_state, _F32), axis=2)


def fenwick(block_states):
  """The inverse of ``cumulative``: ``S_0 = F_0``, ``S_l = F_l -
  F_{l-1}``."""
  return jnp.concatenate([block_states[:, :, :1],
                          jnp.diff(block_states, axis=2)], axis=2)


def block_terms(q, level_scales, segment_ids, offset, initial_state, *,
                terms: int):
  """The op as ``terms`` gated-linear problems (the mapping onto the core).

  With ``w_l = lambda^(l) - lambda^(l+1)`` for ``l < n - 1`` and ``w_{n-1}
  = lambda^(n-1)`` (``n = terms``), summation by parts gives

      o_t = sum_l lambda_t^(level(t,s)) ... = sum_{l<n} (w_l,t q_t)^T F_l,t

  ``F_l,t`` the gated-linear state of the tokens in ``t``'s aligned block
  of ``2^l`` positions (its document for the top term): the core's state
  with segment ids that change where the block or the document does.

  Returns:
    ``(q_terms [n, B, T, H, K] float32, ids [n, B, T] int32, initial
    states [n, B, H, K, V] or None)``.
  """
  b, t = q.shape[:2]
  lam = jnp.moveaxis(jnp.asarray(level_scales, _F32)[..., :terms], -1, 0)
  weights = jnp.concatenate([lam[:-1] - lam[1:], lam[-1:]], axis=0)
  q_terms = weights[..., None] * jnp.asarray(q, _F32)[None]    # [n,B,T,H,K]
  pos = positions(segment_ids, offset, b, t)                    # [B, T]
  doc = document_index(segment_ids, b, t)                       # [B, T]
  shifts = jnp.arange(terms - 1, dtype=jnp.int32)[:, None, None]
  blocks = 2 * (pos[None] >> shifts) + (doc[None] & 1)          # [n-1, B, T]
  ids = jnp.concatenate([blocks, doc[None]], axis=0)            # [n, B, T]
  if initial_state is None:
    return q_terms, ids, None
  block = jnp.moveaxis(cumulative(initial_state)[:, :, :terms], 2, 0)
  first = jnp.broadcast_to(jnp.asarray(offset, jnp.int32), (b,))
  inside = (first[None] % (1 << shifts[:, :, 0])) != 0          # [n-1, B]
  inside = jnp.concatenate([inside, jnp.ones((1, b), bool)], axis=0)
  return q_terms, ids, jnp.where(inside[..., None, None, None], block, 0.0)


def term_count(levels: int, offset, length: int, has_state: bool) -> int:
  """How many block terms a call needs: all ``L`` with an initial state
  or a traced ``offset``; else ``bits(max position) + 1`` at most (the
  blocks above hold every position of the call, so their terms are the
  top's)."""
  top = None if has_state else max_position(offset, length)
  if top is None:
    return levels
  return min(levels, max(top, 0).bit_length() + 1)
