"""Decoding with a KV cache: one token, or a block of tokens, at a time.

The cache is the softmax family's full ``KVCache`` (``init_kv_cache`` with
``max_length``): token ``t`` in slot ``t``, each entry with its position,
so the entries are in position order, which the stick needs (it is broken
from the nearest key backwards). A ring buffer (a window) has no such
order and is refused. A step appends the token, then breaks the query's
stick over every visible entry: the logits of all ``S`` entries, their
softplus, and the suffix sums of those over the entries (a cumulative sum
from the newest entry back). There is no running summary to carry instead:
each query breaks its own stick over the keys. A step costs ``O(S)`` for
a buffer of ``S = max_length`` entries (those not written yet are masked):
``O(t)`` in the ``t`` tokens seen when the buffer is sized to the sequence,
as softmax attention's step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.softmax_attn.cache import (KVCache, check_extend,
                                                 tokens_seen)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale
from lin_attn_jax.ops.softmax_attn.step import check_step
from lin_attn_jax.ops.stickbreaking_attn.inputs import check_attend_current
from lin_attn_jax.ops.stickbreaking_attn.parallel import causal_visibility
from lin_attn_jax.ops.stickbreaking_attn.sticks import break_sticks

_F32 = jnp.float32


def _check_cache(cache: KVCache, b: int, t: int):
  """``S``, after refusing a ring buffer and a cache that cannot take ``t``
  more tokens (when its length is concrete)."""
  if cache.window_size is not None:
    raise ValueError(f"cache must be a full KV cache (init_kv_cache with "
                     f"max_length): stick-breaking attention breaks the "
                     f"stick over keys in position order, which a ring "
                     f"buffer of window_size = {cache.window_size} does not "
                     f"keep")
  size = cache.k.shape[1]
  checks.check_shape("cache.length", cache.length, (b,), "[B]")
  seen = tokens_seen(cache)
  if seen is not None and seen + t > size:
    raise ValueError(f"cache is full: it holds max_length = {size} tokens, "
                     f"has seen {seen} and was given {t} more")
  return size


def _attend_and_store(q, k, v, cache: KVCache, starts, *, scale,
                      attend_current):
  """Appends ``T`` tokens and breaks each query's stick over the entries it
  sees. ``q [B, T, H, K]``, ``k [B, T, Hkv, K]``, ``v [B, T, Hkv, V]``,
  ``starts [B, T]`` bool (a document starts at the token)."""
  b, t, h, dk = q.shape
  hkv, dv = k.shape[2], v.shape[-1]
  size = cache.k.shape[1]
  now = cache.length                                            # [B]
  pos = now[:, None] + jnp.arange(t, dtype=jnp.int32)[None]     # [B, T]
  doc_start = jnp.maximum(
      cache.doc_start[:, None],
      jax.lax.cummax(jnp.where(starts, pos, -1), axis=1))       # [B, T]

  # The entries, then the new tokens: both in position order, and the
  # entries (positions < now, or -1 where empty) before the new tokens.
  keys = jnp.concatenate([cache.k, k.astype(cache.k.dtype)], 1)  # [B,S+T,h,K]
  values = jnp.concatenate([cache.v, v.astype(cache.v.dtype)], 1)
  key_pos = jnp.concatenate([cache.position, pos], axis=1)      # [B, S+T]
  i, j = pos[:, :, None], key_pos[:, None, :]                   # [B, T, S+T]
  visible = (causal_visibility(i, j, attend_current)
             & (j >= doc_start[:, :, None]) & (j >= 0))
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)    # [B,T,h,g,K]
  z = scale * jnp.einsum("bthgk,bjhk->bhgtj", qg, jnp.asarray(keys, _F32),
                         preferred_element_type=_F32)           # [B,h,g,T,S+T]
  log_a, _ = break_sticks(z, visible[:, None, None])
  o = jnp.einsum("bhgtj,bjhv->bthgv", jnp.exp(log_a),
                 jnp.asarray(values, _F32),
                 preferred_element_type=_F32).reshape(b, t, h, dv)

  # Slot s takes new token s - now (a full cache: slot = position).
  src = jnp.arange(size, dtype=jnp.int32)[None] - now[:, None]  # [B, S]
  written = (src >= 0) & (src < t)
  take = jnp.clip(src, 0, t - 1)

  def store(old, new):
    picked = jnp.take_along_axis(
        new, take.reshape(take.shape + (1,) * (new.ndim - 2)), axis=1)
    mask = written.reshape(written.shape + (1,) * (new.ndim - 2))
    return jnp.where(mask, picked.astype(old.dtype), old)

  new_cache = KVCache(k=store(cache.k, k), v=store(cache.v, v),
                      position=store(cache.position, pos), length=now + t,
                      doc_start=doc_start[:, -1], window_size=None)
  return o.astype(v.dtype), new_cache


def stickbreaking_attn_extend(q, k, v, cache: KVCache, *, scale=None,
                              attend_current=False, segment_ids=None,
                              reset=None):
  """Appends ``T`` tokens to the cache; each breaks its stick over what it
  sees (prefill, or a block of tokens after earlier ones).

  The queries see the cached entries of their document and the new tokens
  before them (up to themselves with ``attend_current``). Dense over the
  ``S + T`` entries: cost and memory ``O(T (S + T))``.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    cache: a full cache from ``init_kv_cache(..., max_length=...)`` or a
      previous call.
    scale, attend_current: as in ``parallel_stickbreaking_attn``.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, _, _, dk, _ = check_extend(q, k, v, cache, segment_ids, reset)
  check_attend_current(attend_current)
  _check_cache(cache, b, t)
  starts = reset_flags(segment_ids, b, t)                       # [B, T]
  if reset is not None:
    starts = starts.at[:, 0].set(jnp.asarray(reset))
  return _attend_and_store(q, k, v, cache, starts,
                           scale=default_scale(scale, dk),
                           attend_current=attend_current)


def stickbreaking_attn_step(q, k, v, cache: KVCache, *, scale=None,
                            attend_current=False, reset=None):
  """Appends one token to the cache and breaks its query's stick over the
  visible entries, nearest first.

  Args:
    q: ``[B, H, K]``; k: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``.
    cache: a full cache from ``init_kv_cache(..., max_length=...)`` or a
      previous step.
    scale, attend_current: as in ``parallel_stickbreaking_attn``.
    reset: ``[B]`` bool, True where this token starts a new document (the
      entries before it become invisible).
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_kv_cache(1, 2, 8, 8, max_length=16)
    >>> o, cache = stickbreaking_attn_step(
    ...     jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)), jnp.ones((1, 2, 8)),
    ...     cache)
    >>> o.shape
    (1, 4, 8)
  """
  b, _, _, dk = check_step(q, k, v, cache, reset)
  check_attend_current(attend_current)
  _check_cache(cache, b, 1)
  starts = (jnp.zeros((b, 1), bool) if reset is None
            else jnp.asarray(reset).reshape(b, 1))
  o, cache = _attend_and_store(q[:, None], k[:, None], v[:, None], cache,
                               starts, scale=default_scale(scale, dk),
                               attend_current=attend_current)
  return o[:, 0], cache
