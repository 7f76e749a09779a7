"""The decoding cache of PaTH attention, and prefill into it.

A PaTH logit is ``q_t^T H_t ... H_{j+1} k_j``: the key of token ``j`` as
seen from token ``t`` has crossed every reflection after it. The cache
holds the keys in that form (as flash-linear-attention's
``prepare_k_cache`` makes them): after token ``t``, entry ``j`` is ``H_t
... H_{j+1} k_j``. A new token applies its reflection to every entry (a
rank-one update, ``k <- k - beta (k . w) w``) and is stored as it is. With
a forget gate each entry also holds ``c_t - c_j``, the log-gates summed
from after its token to the last one seen, and a new token adds its own
log-gate to every entry. So a step costs ``O(S (K + V))`` per key head for
a cache of ``S`` entries, as softmax attention's does, and the entries
are never recomputed from the original keys.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.path_attn.householder import (block_transforms,
                                                    cross_block_keys,
                                                    exclusive_suffix_sums)
from lin_attn_jax.ops.path_attn.inputs import default_scale, validate
from lin_attn_jax.ops.softmax_attn.cache import new_positions

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


@dataclasses.dataclass(frozen=True)
class PaTHCache:
  """The tokens seen so far, as later tokens see them (a pytree)."""
  k: jax.Array            # [B, S, Hkv, K] keys crossed by every later H_s
  v: jax.Array            # [B, S, Hkv, V] values
  log_gate: jax.Array | None  # [B, S, H] float32 gate since the entry, or None
  position: jax.Array     # [B, S] int32 position of each entry, -1 = empty
  length: jax.Array       # [B] int32 tokens seen (position of the next one)
  doc_start: jax.Array    # [B] int32 position where the current document began


jax.tree_util.register_dataclass(
    PaTHCache,
    data_fields=["k", "v", "log_gate", "position", "length", "doc_start"],
    meta_fields=[])


def init_path_cache(batch: int, heads_kv: int, dim_k: int, dim_v: int, *,
                    max_length: int, gate_heads: int | None = None,
                    dtype=_F32) -> PaTHCache:
  """An empty cache of ``max_length`` entries.

  Args:
    batch, heads_kv, dim_k, dim_v: ``B``, ``Hkv``, ``K``, ``V``.
    max_length: the entries; a step past them raises ``ValueError`` outside
      ``jit`` (under ``jit`` the length cannot be inspected and such a
      token is not stored).
    gate_heads: ``H``, the query heads, for an op with a forget gate (then
      the steps must be given ``g``); None for none.
    dtype: dtype of the stored keys and values. Every step updates every
      stored key, so a low-precision cache rounds them once per token.
  """
  for name, value in (("batch", batch), ("heads_kv", heads_kv),
                      ("dim_k", dim_k), ("dim_v", dim_v),
                      ("max_length", max_length)):
    checks.positive_int(name, value)
  checks.positive_int("gate_heads", gate_heads, allow_none=True)
  return PaTHCache(
      k=jnp.zeros((batch, max_length, heads_kv, dim_k), dtype),
      v=jnp.zeros((batch, max_length, heads_kv, dim_v), dtype),
      log_gate=(None if gate_heads is None
                else jnp.zeros((batch, max_length, gate_heads), _F32)),
      position=jnp.full((batch, max_length), -1, jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      doc_start=jnp.zeros((batch,), jnp.int32))


def check_cache(cache: PaTHCache, b: int, h: int, hkv: int, dk: int, dv: int,
                g, tokens: int):
  """Validates ``cache`` against a call of ``tokens`` new tokens."""
  if not isinstance(cache, PaTHCache):
    raise ValueError(f"cache must be a PaTHCache (init_path_cache), got "
                     f"{type(cache).__name__}")
  checks.check_shape("cache.k", cache.k, (b, cache.k.shape[1], hkv, dk),
                     "[B, S, Hkv, K] of the keys")
  checks.check_shape("cache.v", cache.v, (b, cache.k.shape[1], hkv, dv),
                     "[B, S, Hkv, V] of the values")
  if (g is None) != (cache.log_gate is None):
    raise ValueError("g must be given exactly when the cache has a forget "
                     "gate (init_path_cache(gate_heads=H)); got g "
                     f"{'None' if g is None else checks.shape_of(g)} and a "
                     f"cache {'without' if cache.log_gate is None else 'with'}"
                     " a gate")
  if cache.log_gate is not None:
    checks.check_shape("cache.log_gate", cache.log_gate,
                       (b, cache.k.shape[1], h), "[B, S, H]")
  seen = tokens_seen(cache)
  size = cache.k.shape[1]
  if seen is not None and seen + tokens > size:
    raise ValueError(f"cache is full: it holds max_length = {size} tokens, "
                     f"has seen {seen} and was given {tokens} more")


def tokens_seen(cache: PaTHCache):
  """The most tokens any row has seen, when the length is concrete."""
  length = checks.concrete(cache.length)
  if length is None or not length.size:
    return None
  return int(length.max())


def path_attn_extend(q, k, v, w, beta, cache: PaTHCache, *, g=None,
                     scale=None, segment_ids=None, reset=None):
  """Appends ``T`` tokens to the cache; each attends to what it can see.

  The multi-token form of ``path_attn_step`` (prefill, or a block of tokens
  after earlier ones): the UT transform of the new tokens' reflections
  (``householder.block_transforms``, one ``[T, T]`` solve by blocked
  substitution) gives their queries moved back to the block's start,
  where they meet the cached keys, and their own ``[T, T]`` logits; then
  the block's product ``I - W^T R`` is applied to every cached key and the
  new keys are stored moved to the block's end. Cost ``O(T (S + T))``.

  Args:
    q: ``[B, T, H, K]``; k, w: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``;
      beta: ``[B, T, Hkv]``.
    cache: from ``init_path_cache`` or a previous call.
    g: ``[B, T, H]`` log forget gates ``<= 0`` (exactly when the cache has
      a gate).
    scale: multiplies the logits and the gate's bias, ``K ** -0.5`` when
      None.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, h, hkv, dk, dv = validate(q, k, v, w, beta, g, segment_ids)
  check_cache(cache, b, h, hkv, dk, dv, g, t)
  checks.check_reset(reset, b)
  scale = default_scale(scale, dk)
  gq = h // hkv
  now = cache.length                                            # [B]
  pos, _, doc_start = new_positions(cache, t, segment_ids, reset)

  q_b = jnp.asarray(q, _F32).reshape(b, t, hkv, gq, dk).transpose(
      0, 2, 3, 1, 4)                                            # [B,h,g,T,K]
  k_b, v_b, w_b = (jnp.asarray(x, _F32).transpose(0, 2, 1, 3)
                   for x in (k, v, w))                          # [B,h,T,*]
  beta_b = jnp.asarray(beta, _F32).transpose(0, 2, 1)           # [B, h, T]
  q_start, k_end, r, logits = block_transforms(q_b, k_b, w_b, beta_b)
  cached_k = jnp.asarray(cache.k, _F32).transpose(0, 2, 1, 3)   # [B,h,S,K]
  cached_v = jnp.asarray(cache.v, _F32).transpose(0, 2, 1, 3)   # [B,h,S,V]
  z_old = _mm("bhgik,bhjk->bhgij", q_start, cached_k)           # [B,h,g,T,S]
  z_new = logits                                                # [B,h,g,T,T]
  if g is not None:
    g_b = jnp.asarray(g, _F32).reshape(b, t, hkv, gq).transpose(0, 2, 3, 1)
    gate_in = jnp.cumsum(g_b, axis=-1)                          # [B,h,g,T]
    old_gate = cache.log_gate.reshape(b, -1, hkv, gq).transpose(0, 2, 3, 1)
    z_old = z_old + gate_in[..., :, None] + old_gate[..., None, :]
    z_new = z_new + gate_in[..., :, None] - gate_in[..., None, :]
  i = pos[:, :, None]                                           # [B, T, 1]
  old_pos = cache.position[:, None, :]                          # [B, 1, S]
  see_old = (old_pos >= doc_start[:, :, None]) & (old_pos >= 0)
  see_new = (pos[:, None, :] <= i) & (pos[:, None, :] >= doc_start[:, :, None])
  s = jnp.concatenate(
      [jnp.where(see_old[:, None, None], scale * z_old, -jnp.inf),
       jnp.where(see_new[:, None, None], scale * z_new, -jnp.inf)], axis=-1)
  p = jax.nn.softmax(s, axis=-1)                                # [B,h,g,T,S+T]
  o = _mm("bhgij,bhjv->bihgv", p,
          jnp.concatenate([cached_v, v_b], axis=2))             # [B,T,h,g,V]

  # The cached keys cross the block; the new ones are at its end.
  moved = cross_block_keys(cached_k, w_b, r).transpose(0, 2, 1, 3)
  new_gate = None
  if g is not None:
    total = jnp.sum(g_b, axis=-1)                               # [B, h, g]
    new_gate = cache.log_gate + total.reshape(b, 1, h)          # [B, S, H]
    gate_out = exclusive_suffix_sums(g_b, axis=-1)              # [B,h,g,T]
    gate_out = gate_out.transpose(0, 3, 1, 2).reshape(b, t, h)  # [B, T, H]
  size = cache.k.shape[1]
  hits = pos[:, :, None] == jnp.arange(size)[None, None]        # [B, T, S]
  written = jnp.any(hits, axis=1)                               # [B, S]
  src = jnp.argmax(hits, axis=1)                                # [B, S]

  def store(old, new):
    picked = jnp.take_along_axis(
        new, src.reshape(src.shape + (1,) * (new.ndim - 2)), axis=1)
    mask = written.reshape(written.shape + (1,) * (new.ndim - 2))
    return jnp.where(mask, picked.astype(old.dtype), old)

  new_cache = PaTHCache(
      k=store(moved.astype(cache.k.dtype), k_end.transpose(0, 2, 1, 3)),
      v=store(cache.v, v),
      log_gate=None if g is None else store(new_gate, gate_out),
      position=store(cache.position, pos), length=now + t,
      doc_start=doc_start[:, -1])
  return o.reshape(b, t, h, dv).astype(v.dtype), new_cache
