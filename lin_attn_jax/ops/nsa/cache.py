"""The decoding cache of native sparse attention, and prefill.

A selected block may be any earlier block of the document, so the cache
keeps every key and value (a store indexed by position, ``max_length``
entries); beside it the compressed blocks so far (their means, float32,
and the last position of each, in order; ``max_length // l`` slots) and,
with a window, the window branch's own ring buffer of ``min(w,
max_length)`` entries (``softmax_attn``'s ``KVCache``, so that a step of
the window branch is ``softmax_attn``'s, ``O(w)``; it repeats the store's
last ``w`` entries). The block being filled needs nothing more: its
tokens are the last entries of the store, and when its last token
arrives its mean is pooled from there into the next slot.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.nsa import attention, blocks
from lin_attn_jax.ops.nsa.inputs import check_gates, check_options
from lin_attn_jax.ops.softmax_attn.cache import (KVCache, check_extend,
                                                 init_kv_cache, new_positions,
                                                 softmax_attn_extend)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class NSACache:
  """What native sparse attention needs to go on decoding (a pytree).

  ``block_size`` and ``window_size`` are static.
  """
  k: jax.Array            # [B, S, Hkv, K] key of position s at index s
  v: jax.Array            # [B, S, Hkv, V] value of position s at index s
  k_cmp: jax.Array        # [B, S // l, Hkv, K] float32 complete-block means
  v_cmp: jax.Array        # [B, S // l, Hkv, V] float32
  block_end: jax.Array    # [B, S // l] int32 last position of a block, -1
  num_blocks: jax.Array   # [B] int32 complete blocks so far (slots in use)
  length: jax.Array       # [B] int32 tokens seen (position of the next one)
  doc_start: jax.Array    # [B] int32 position where the current document began
  window: KVCache | None  # the window branch's ring buffer, or None
  block_size: int = 64
  window_size: int | None = None


jax.tree_util.register_dataclass(
    NSACache, data_fields=["k", "v", "k_cmp", "v_cmp", "block_end",
                           "num_blocks", "length", "doc_start", "window"],
    meta_fields=["block_size", "window_size"])


def init_nsa_cache(batch: int, heads_kv: int, dim_k: int, dim_v: int, *,
                   max_length: int, block_size: int = 64,
                   window_size: int | None = None,
                   dtype=jnp.float32) -> NSACache:
  """An empty cache for up to ``max_length`` tokens per row.

  Args:
    batch, heads_kv, dim_k, dim_v: ``B``, ``Hkv``, ``K``, ``V``.
    max_length: capacity of the store; a call past it raises
      ``ValueError`` outside ``jit`` (under ``jit`` the length cannot be
      inspected, and tokens past it are not stored).
    block_size: ``l``, as in the sequence forms.
    window_size: ``w`` of the window branch, None for none; its ring
      buffer holds ``min(w, max_length)`` entries.
    dtype: dtype of the stored keys and values (the block means are
      float32).
  """
  checks.positive_int("max_length", max_length)
  check_options(block_size, 1, window_size)
  n = max_length // block_size
  window = None
  if window_size is not None:
    # A ring of min(w, max_length) entries: no more tokens are stored.
    window = dataclasses.replace(
        init_kv_cache(batch, heads_kv, dim_k, dim_v,
                      window_size=min(window_size, max_length), dtype=dtype),
        window_size=window_size)
  return NSACache(
      k=jnp.zeros((batch, max_length, heads_kv, dim_k), dtype),
      v=jnp.zeros((batch, max_length, heads_kv, dim_v), dtype),
      k_cmp=jnp.zeros((batch, n, heads_kv, dim_k), _F32),
      v_cmp=jnp.zeros((batch, n, heads_kv, dim_v), _F32),
      block_end=jnp.full((batch, n), -1, jnp.int32),
      num_blocks=jnp.zeros((batch,), jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      doc_start=jnp.zeros((batch,), jnp.int32),
      window=window,
      block_size=block_size, window_size=window_size)


def _check_room(cache: NSACache, t):
  length = checks.concrete(cache.length)
  if length is not None and length.size and int(length.max()) + t > (
      cache.k.shape[1]):
    raise ValueError(f"cache is full: it holds max_length = "
                     f"{cache.k.shape[1]} tokens, has seen "
                     f"{int(length.max())} and was given {t} more")


def nsa_extend(q, k, v, g_cmp, g_slc, g_swa, cache: NSACache, *,
               block_counts=16, scale=None, segment_ids=None, reset=None,
               chunk_size=None):
  """Appends ``T`` tokens to the cache; each attends as in ``parallel_nsa``.

  The multi-token form of ``nsa_step`` (prefill, or a block of tokens after
  earlier ones). The new keys and values go into the store, the blocks
  they complete are pooled into the next slots, the queries run the
  compressed and selected branches against the store in chunks
  (``attention.over_chunks``: ``O(T (N + n l))`` work for ``N`` slots), and
  the window branch is ``softmax_attn_extend`` on the ring buffer
  (``O(T (w + T))``).

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    g_cmp, g_slc, g_swa: ``[B, T, H]``; ``g_swa`` only with a window.
    cache: from ``init_nsa_cache`` or a previous call.
    block_counts, scale: as in ``parallel_nsa``.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
    chunk_size: queries per chunk (speed only), as in ``chunk_nsa``.
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, h, hkv, dk, dv = check_extend(q, k, v, cache, segment_ids, reset)
  gates = (g_cmp, g_slc, g_swa)
  check_gates(gates, (b, t, h), "[B, T, H]", cache.window_size)
  _check_room(cache, t)
  checks.positive_int("block_counts", block_counts)
  checks.positive_int("chunk_size", chunk_size, allow_none=True)
  scale = default_scale(scale, dk)
  l, slots = cache.block_size, cache.block_end.shape[1]

  now = cache.length                                            # [B]
  pos, _, doc_start = new_positions(cache, t, segment_ids, reset)

  rows = jnp.arange(b)[:, None]
  k_store = cache.k.at[rows, pos].set(k.astype(cache.k.dtype), mode="drop")
  v_store = cache.v.at[rows, pos].set(v.astype(cache.v.dtype), mode="drop")
  # The blocks the new tokens complete (at most one per l tokens), pooled
  # from the store into the slots after the last one in use.
  is_end = blocks.is_block_end(pos, doc_start, l)               # [B, T]
  k_cmp, v_cmp, block_end = cache.k_cmp, cache.v_cmp, cache.block_end
  if slots:
    new_end = blocks.compact_ends(is_end, pos, t // l + 1)      # [B, M]
    slot = jnp.where(new_end >= 0,
                     cache.num_blocks[:, None] + jnp.arange(t // l + 1),
                     slots)
    k_cmp, v_cmp = (
        old.at[rows, slot].set(blocks.pool_blocks(store, new_end, l),
                               mode="drop")
        for old, store in ((k_cmp, k_store), (v_cmp, v_store)))
    block_end = block_end.at[rows, slot].set(new_end, mode="drop")

  chunk = (attention.chunk_length(t, h, hkv, dk, dv, block_size=l,
                                  block_counts=block_counts)
           if chunk_size is None else chunk_size)
  o_cmp, o_slc = attention.over_chunks(
      jnp.asarray(q, _F32), pos, doc_start, k_store, v_store, k_cmp, v_cmp,
      block_end, chunk=chunk, block_size=l, block_counts=block_counts,
      scale=scale)
  o_swa, window = None, None
  if cache.window is not None:
    o_swa, window = softmax_attn_extend(
        jnp.asarray(q, _F32), k, jnp.asarray(v, _F32), cache.window,
        scale=scale, segment_ids=segment_ids, reset=reset)
  new_cache = NSACache(
      k=k_store, v=v_store, k_cmp=k_cmp, v_cmp=v_cmp, block_end=block_end,
      num_blocks=cache.num_blocks + jnp.sum(is_end, axis=1, dtype=jnp.int32),
      length=now + t, doc_start=doc_start[:, -1], window=window,
      block_size=l, window_size=cache.window_size)
  return blocks.mix((o_cmp, o_slc, o_swa), gates, v.dtype), new_cache
