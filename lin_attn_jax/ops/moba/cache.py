"""MoBA's decoding cache, and the multi-token call that fills it (prefill).

The cache holds, per row, every key and value seen (slot ``t`` for the
token at position ``t``, as the softmax family's full cache), the position
where the current document began, the sum of the keys of each complete
block of that document (float32, slot ``m`` for its ``m``-th block) and the
running sum of the keys of its current, incomplete block (float32). The
sums are what a decoding step scores blocks with (``step.py``); the keys and
values are what it attends to. Blocks of earlier documents are never read
again, so a new document reuses the slots of the sums from 0.

Floats per row: ``S Hkv (K + V)`` for the keys and values, ``(S // C + 1)
Hkv K`` for the sums (``S = max_length``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.moba import blocks
from lin_attn_jax.ops.moba.inputs import check_options
from lin_attn_jax.ops.moba.parallel import masked_attention, moba_mask
from lin_attn_jax.ops.softmax_attn.cache import check_extend, new_positions
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class MoBACache:
  """What MoBA needs to continue a sequence (a pytree); ``block_size`` is
  static."""
  k: jax.Array            # [B, S, Hkv, K] keys, slot t = position t
  v: jax.Array            # [B, S, Hkv, V] values
  block_sums: jax.Array   # [B, S // C, Hkv, K] float32, complete blocks of
                          # the current document, slot m = its m-th block
  current_sum: jax.Array  # [B, Hkv, K] float32, keys of the current block
  length: jax.Array       # [B] int32 tokens seen (position of the next one)
  doc_start: jax.Array    # [B] int32 position where the current document began
  block_size: int = 1


jax.tree_util.register_dataclass(
    MoBACache,
    data_fields=["k", "v", "block_sums", "current_sum", "length",
                 "doc_start"],
    meta_fields=["block_size"])


def init_moba_cache(batch: int, heads_kv: int, dim_k: int, dim_v: int, *,
                    max_length: int, block_size: int,
                    dtype=jnp.float32) -> MoBACache:
  """An empty cache.

  Args:
    batch, heads_kv, dim_k, dim_v: ``B``, ``Hkv``, ``K``, ``V``.
    max_length: ``S``, the tokens it can hold; a call past it raises
      ``ValueError`` outside ``jit`` (under ``jit`` such tokens are not
      stored).
    block_size: MoBA's ``C``, the model's.
    dtype: of the stored keys and values (the sums are float32).
  """
  checks.positive_int("max_length", max_length)
  checks.positive_int("block_size", block_size)
  return MoBACache(
      k=jnp.zeros((batch, max_length, heads_kv, dim_k), dtype),
      v=jnp.zeros((batch, max_length, heads_kv, dim_v), dtype),
      block_sums=jnp.zeros((batch, max_length // block_size, heads_kv,
                            dim_k), _F32),
      current_sum=jnp.zeros((batch, heads_kv, dim_k), _F32),
      length=jnp.zeros((batch,), jnp.int32),
      doc_start=jnp.zeros((batch,), jnp.int32),
      block_size=block_size)


def check_room(cache: MoBACache, tokens: int) -> None:
  """Raises when a concrete cache cannot take ``tokens`` more."""
  length = checks.concrete(cache.length)
  size = cache.k.shape[1]
  if length is not None and length.size and int(length.max()) + tokens > size:
    raise ValueError(f"cache is full: it holds max_length = {size} tokens, "
                     f"has seen {int(length.max())} and was given {tokens} "
                     f"more")


def document_sums(keys, doc_start, length, block_size: int):
  """``(block_sums, current_sum)`` of the document that starts at
  ``doc_start [B]`` and runs to ``length [B]``, from the stored keys
  ``[B, S, Hkv, K]`` (float32)."""
  b, s = keys.shape[:2]
  keys = jnp.asarray(keys, _F32)
  m = jnp.arange(s // block_size)
  complete = doc_start[:, None] + (m[None] + 1) * block_size <= length[:, None]
  slots = (doc_start[:, None, None] + m[None, :, None] * block_size
           + jnp.arange(block_size))                            # [B, NB, C]
  gathered = keys[jnp.arange(b)[:, None, None], jnp.minimum(slots, s - 1)]
  sums = jnp.where(complete[..., None, None], jnp.sum(gathered, axis=2), 0.0)
  current_first = blocks.block_starts(length, doc_start, block_size)
  pos = jnp.arange(s)[None]
  in_current = (pos >= current_first[:, None]) & (pos < length[:, None])
  current = jnp.sum(jnp.where(in_current[..., None, None], keys, 0.0),
                    axis=1)                                     # [B, Hkv, K]
  return sums, current


def moba_extend(q, k, v, cache: MoBACache, *, top_k: int, scale=None,
                segment_ids=None, reset=None):
  """Appends ``T`` tokens to the cache; each attends as in
  ``parallel_moba`` to the tokens of its document so far.

  The multi-token form of ``moba_step`` (prefill, or a block of tokens
  after earlier ones): the new queries select among, and attend to, the
  blocks of their document whether they lie in the cache, among the new
  tokens or across both. It runs the definition's mask on the cache's
  slots (``O(T S)`` work and memory, as ``softmax_attn_extend``) and
  recomputes the block sums of the last document from the stored keys
  (``O(S K)``).

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    cache: from ``init_moba_cache`` or a previous call.
    top_k, scale: as in ``parallel_moba``.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, _, _, dk, _ = check_extend(q, k, v, cache, segment_ids, reset)
  check_options(cache.block_size, top_k)
  check_room(cache, t)
  c, s = cache.block_size, cache.k.shape[1]
  now = cache.length                                            # [B]
  pos, starts, doc_start = new_positions(cache, t, segment_ids, reset)
  # Document 0 continues the cache's; every start opens the next one.
  doc = jnp.cumsum(starts.astype(jnp.int32), axis=1)            # [B, T]
  rows = jnp.arange(b)[:, None]

  def written(old, new):
    return old.at[rows, pos].set(new.astype(old.dtype), mode="drop")

  keys, values = written(cache.k, k), written(cache.v, v)
  slot = jnp.arange(s, dtype=jnp.int32)[None]                   # [1, S]
  cached = (slot >= cache.doc_start[:, None]) & (slot < now[:, None])
  slot_doc = written(jnp.where(cached, 0, -1), doc)             # [B, S]
  slot_doc_start = written(
      jnp.broadcast_to(cache.doc_start[:, None], (b, s)), doc_start)
  mask = moba_mask(q, keys, q_pos=pos, q_doc=doc,
                   q_start=blocks.block_starts(pos, doc_start, c),
                   k_doc=slot_doc,
                   k_start=blocks.block_starts(slot, slot_doc_start, c),
                   block_size=c, top_k=top_k)
  o = masked_attention(q, keys, values, mask, default_scale(scale, dk))

  length = now + t
  sums, current = document_sums(written(jnp.asarray(cache.k, _F32),
                                        jnp.asarray(k, _F32)),
                                doc_start[:, -1], length, c)
  new_cache = MoBACache(k=keys, v=values, block_sums=sums,
                        current_sum=current, length=length,
                        doc_start=doc_start[:, -1], block_size=c)
  return o.astype(v.dtype), new_cache
