"""The KV cache of softmax decoding (see ``step.py``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.softmax_attn.inputs import (check_grouped_qkv,
                                                  check_values_from_keys,
                                                  check_window, default_scale)

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values of the tokens seen so far (a pytree).

  ``window_size`` is static: None for a full cache, ``w`` for a ring buffer
  of ``w`` entries.
  """
  k: jax.Array            # [B, S, Hkv, K] stored keys
  v: jax.Array            # [B, S, Hkv, V] stored values
  position: jax.Array     # [B, S] int32 position of each entry, -1 = empty
  length: jax.Array       # [B] int32 tokens seen (position of the next one)
  doc_start: jax.Array    # [B] int32 position where the current document began
  window_size: int | None = None


jax.tree_util.register_dataclass(
    KVCache, data_fields=["k", "v", "position", "length", "doc_start"],
    meta_fields=["window_size"])


def init_kv_cache(batch: int, heads_kv: int, dim_k: int, dim_v: int, *,
                  max_length: int | None = None, window_size: int | None = None,
                  dtype=jnp.float32) -> KVCache:
  """An empty cache.

  Args:
    batch, heads_kv, dim_k, dim_v: ``B``, ``Hkv``, ``K``, ``V``.
    max_length: capacity of a full-attention cache; a step past it raises
      ``ValueError`` when called outside ``jit`` (under ``jit`` the length
      cannot be inspected and such a token is not stored); ignored with a
      window.
    window_size: ``w`` for sliding-window attention: a ring buffer of ``w``
      entries.
    dtype: dtype of the stored keys and values.
  """
  check_window(window_size)
  if window_size is None:
    if max_length is None:
      raise ValueError("init_kv_cache needs max_length (full attention) or "
                       "window_size (sliding window)")
    checks.positive_int("max_length", max_length)
  size = window_size if window_size is not None else max_length
  return KVCache(
      k=jnp.zeros((batch, size, heads_kv, dim_k), dtype),
      v=jnp.zeros((batch, size, heads_kv, dim_v), dtype),
      position=jnp.full((batch, size), -1, jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      doc_start=jnp.zeros((batch,), jnp.int32),
      window_size=window_size)


def tokens_seen(cache: KVCache):
  """The most tokens any row of a full (not windowed) cache has seen, when
  its length is concrete; None otherwise (a ring buffer never fills)."""
  length = checks.concrete(cache.length)
  if cache.window_size is not None or length is None or not length.size:
    return None
  return int(length.max())


def store_tokens(cache: KVCache, old, new):
  """``old [B, S, ...]``, one value per entry of ``cache``, with the values
  ``new [B, T, ...]`` of the next ``T`` tokens written into the slots they
  take (token ``t`` at slot ``t``, or ``t mod w`` in a ring buffer; where
  several share a slot the latest wins). How ``softmax_attn_extend`` and
  ``softmax_attn_step`` store keys, values and positions, for a cache that
  keeps more per entry."""
  size, t = old.shape[1], new.shape[1]
  pos = cache.length[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
  slot = pos % size if cache.window_size is not None else pos   # [B, T]
  hits = slot[:, :, None] == jnp.arange(size)[None, None]       # [B, T, S]
  latest = jnp.max(jnp.where(hits, jnp.arange(t)[None, :, None], -1),
                   axis=1)                                      # [B, S]
  src = jnp.maximum(latest, 0)
  picked = jnp.take_along_axis(
      new, src.reshape(src.shape + (1,) * (new.ndim - 2)), axis=1)
  written = (latest >= 0).reshape(latest.shape + (1,) * (new.ndim - 2))
  return jnp.where(written, picked.astype(old.dtype), old)


def check_extend(q, k, v, cache, segment_ids, reset):
  """Checks ``T`` new tokens for a cache of keys and values (``cache.k [B,
  S, Hkv, K]``, ``cache.v [B, S, Hkv, V]``): q ``[B, T, H, K]``, k and v
  of the cache's heads and widths, ``segment_ids [B, T]`` and ``reset
  [B]`` (each or None). Returns ``(B, T, H, Hkv, K, V)``."""
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  checks.check_shape("k", k, (b, t) + cache.k.shape[2:],
                     "[B, T, Hkv, K] of the cache")
  checks.check_shape("v", v, (b, t) + cache.v.shape[2:],
                     "[B, T, Hkv, V] of the cache")
  checks.check_reset(reset, b)
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, hkv, dk, dv


def new_positions(cache, t: int, segment_ids, reset):
  """Where ``T`` new tokens go, from ``cache.length [B]`` and
  ``cache.doc_start [B]``.

  Returns:
    ``(pos, starts, doc_start)``, each ``[B, T]``: the tokens' positions,
    whether a document starts at each (a change of ``segment_ids``, or
    ``reset`` at the first), and the position where each one's document
    starts.
  """
  b = cache.length.shape[0]
  pos = cache.length[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
  starts = reset_flags(segment_ids, b, t)                       # [B, T]
  if reset is not None:
    starts = starts.at[:, 0].set(jnp.asarray(reset))
  doc_start = jnp.maximum(
      cache.doc_start[:, None],
      jax.lax.cummax(jnp.where(starts, pos, -1), axis=1))       # [B, T]
  return pos, starts, doc_start


def softmax_attn_extend(q, k, v, cache: KVCache, *, scale=None,
                        segment_ids=None, reset=None, mask_fn=None,
                        bias=None, values_from_keys: int | None = None):
  """Appends ``T`` tokens to the cache; each attends to what it can see.

  The multi-token form of ``softmax_attn_step`` (prefill, or a block of
  tokens after earlier ones): the queries see the entries already in the
  cache and the new tokens up to themselves, within the document and the
  window; then the new keys and values are stored (for a ring buffer, only
  the last ``w`` of them survive). Cost ``O(T (S + T))``.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    cache: from ``init_kv_cache`` or a previous call.
    scale: score scale, ``K ** -0.5`` when None.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
    mask_fn: optional ``(i, j) -> bool`` on absolute positions (broadcasting
      arrays), a further pattern every visible entry must satisfy (the
      Sparse Transformer's strided or fixed patterns). It must allow
      ``i == j``.
    bias: optional ``[B, H, T, S + T]`` float32 (one per query head), added
      to the scores of the cached entries and the new tokens (in that
      order) before the mask.
    values_from_keys: ``V``: the values are the first ``V`` channels of
      the keys; ``v`` and ``cache.v`` are then zero-width and not read (as
      in ``softmax_attn_step``).
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, h, hkv, dk, dv = check_extend(q, k, v, cache, segment_ids, reset)
  check_values_from_keys(values_from_keys, dk)
  if values_from_keys is not None:
    dv = values_from_keys
  size = cache.k.shape[1]
  seen = tokens_seen(cache)
  if seen is not None and seen + t > size:
    raise ValueError(f"cache is full: it holds max_length = {size} tokens, "
                     f"has seen {seen} and was given {t} more")
  scale = default_scale(scale, dk)
  now = cache.length                                            # [B]
  pos, _, doc_start = new_positions(cache, t, segment_ids, reset)

  # keys: [B, S+T, Hkv, K]; values: [B, S+T, Hkv, V]
  keys = jnp.concatenate([cache.k, k.astype(cache.k.dtype)], 1)
  values = jnp.concatenate([cache.v, v.astype(cache.v.dtype)], 1)
  key_pos = jnp.concatenate([cache.position, pos], axis=1)      # [B, S+T]
  i, j = pos[:, :, None], key_pos[:, None, :]                   # [B, T, S+T]
  visible = (j >= doc_start[:, :, None]) & (j <= i) & (j >= 0)
  if cache.window_size is not None:
    visible &= j > i - cache.window_size
  if mask_fn is not None:
    visible &= mask_fn(i, j)
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)  # [B,T,h,g,K]
  s = scale * jnp.einsum("bthgk,bjhk->bhgtj", qg, keys,
                         preferred_element_type=_F32)  # [B,h,g,T,S+T]
  if bias is not None:
    s = s + jnp.asarray(bias, _F32).reshape(s.shape)
  s = jnp.where(visible[:, None, None], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)
  read = values if values_from_keys is None else keys[..., :dv]
  o = jnp.einsum("bhgtj,bjhv->bthgv", p, read,
                 preferred_element_type=_F32).reshape(b, t, h, dv)

  new_cache = KVCache(
      k=store_tokens(cache, cache.k, k), v=store_tokens(cache, cache.v, v),
      position=store_tokens(cache, cache.position, pos), length=now + t,
      doc_start=doc_start[:, -1], window_size=cache.window_size)
  return o.astype(v.dtype), new_cache
