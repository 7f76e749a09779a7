"""One decoding step of MoBA with its cache (``cache.py``).

For the token at position ``t`` of a document that began at ``d`` (block
``m = floor((t - d) / C)``):

1. its key and value go to slot ``t``;
2. the gates ``q . (sum / C)`` of the document's complete blocks ``0 ..
   m - 1`` (the cached sums; float32, no gradient) pick the ``top_k - 1``
   largest (of equal gates, the earlier block);
3. it attends, with one softmax, to its own block's slots ``d + m C .. t``
   and to the ``C`` slots of each picked block, gathered from the cache;
4. its key joins the running sum, which becomes block ``m``'s sum when
   the token completes the block.

A step costs ``O(H (S / C) K)`` for the gates and ``O(H top_k C (K +
V))`` for the attention (``S = max_length``), whatever ``t`` is; ``top_k =
1`` (causal attention, as in ``parallel_moba``) attends to the whole
document instead, ``O(H S (K + V))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.moba.cache import MoBACache, check_room
from lin_attn_jax.ops.softmax_attn.inputs import default_scale
from lin_attn_jax.ops.softmax_attn.step import check_step

_F32 = jnp.float32


def _check_step(q, k, v, cache: MoBACache, reset, top_k):
  check_step(q, k, v, cache, reset)
  checks.positive_int("top_k", top_k)
  check_room(cache, 1)


def moba_step(q, k, v, cache: MoBACache, *, top_k: int, scale=None,
              reset=None):
  """Appends one token to the cache and attends as MoBA does.

  Args:
    q: ``[B, H, K]``; k: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``.
    cache: from ``init_moba_cache`` (its ``block_size`` is MoBA's ``C``),
      ``moba_extend`` or a previous step.
    top_k, scale: as in ``parallel_moba``.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_moba_cache(1, 2, 8, 8, max_length=16, block_size=4)
    >>> o, cache = moba_step(jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)),
    ...                      jnp.ones((1, 2, 8)), cache, top_k=2)
    >>> o.shape
    (1, 4, 8)
  """
  _check_step(q, k, v, cache, reset, top_k)
  b, h, dk = q.shape
  _, s, hkv, _ = cache.k.shape
  c, g = cache.block_size, h // hkv
  scale = default_scale(scale, dk)
  rows = jnp.arange(b)
  now, doc_start, current = cache.length, cache.doc_start, cache.current_sum
  if reset is not None:
    reset = jnp.asarray(reset)
    doc_start = jnp.where(reset, now, doc_start)
    current = jnp.where(reset[:, None, None], 0.0, current)
  keys = cache.k.at[rows, now].set(k.astype(cache.k.dtype), mode="drop")
  values = cache.v.at[rows, now].set(v.astype(cache.v.dtype), mode="drop")
  block = (now - doc_start) // c                                # [B]
  qg = jnp.asarray(q, _F32).reshape(b, hkv, g, dk)              # [B, h, g, K]

  if top_k == 1:
    slot = jnp.arange(s)[None]
    visible = (slot >= doc_start[:, None]) & (slot <= now[:, None])
    slots, visible = (jnp.broadcast_to(slot[:, None, None], (b, hkv, g, s)),
                      jnp.broadcast_to(visible[:, None, None],
                                       (b, hkv, g, s)))
  else:
    own = doc_start + block * c                                 # [B]
    slots = jnp.broadcast_to((own[:, None] + jnp.arange(c))[:, None, None],
                             (b, hkv, g, c))
    visible = slots <= now[:, None, None, None]                 # [B, h, g, C]
    nb = cache.block_sums.shape[1]
    n = min(top_k - 1, nb)
    if n:
      means = cache.block_sums / c                              # [B, NB, h, K]
      gate = jnp.einsum("bhgk,bmhk->bhgm", jax.lax.stop_gradient(qg), means,
                        preferred_element_type=_F32)            # [B, h, g, NB]
      gate = jnp.where(jnp.arange(nb) < block[:, None, None, None], gate,
                       -jnp.inf)
      top, picked = jax.lax.top_k(gate, n)                      # [B, h, g, n]
      first = doc_start[:, None, None, None] + picked * c
      chosen = (first[..., None] + jnp.arange(c)).reshape(b, hkv, g, n * c)
      slots = jnp.concatenate([slots, chosen], axis=-1)
      visible = jnp.concatenate(
          [visible, jnp.repeat(jnp.isfinite(top), c, axis=-1)], axis=-1)

  # Keys and values of the visible slots: [B, h, g, E, K] and [..., V].
  index = (rows[:, None, None, None], jnp.clip(slots, 0, s - 1),
           jnp.arange(hkv)[None, :, None, None])
  k_seen, v_seen = keys[index], values[index]
  scores = scale * jnp.einsum("bhgk,bhgek->bhge", qg,
                              jnp.asarray(k_seen, _F32),
                              preferred_element_type=_F32)      # [B, h, g, E]
  p = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
  o = jnp.einsum("bhge,bhgev->bhgv", p, jnp.asarray(v_seen, _F32),
                 preferred_element_type=_F32).reshape(b, h, -1)

  current = current + jnp.asarray(k, _F32)
  complete = (now - doc_start) % c == c - 1                     # [B]
  sums = cache.block_sums
  if sums.shape[1]:
    slot_m = jnp.minimum(block, sums.shape[1] - 1)
    sums = sums.at[rows, slot_m].set(
        jnp.where(complete[:, None, None], current, sums[rows, slot_m]))
  current = jnp.where(complete[:, None, None], 0.0, current)
  new_cache = MoBACache(k=keys, v=values, block_sums=sums,
                        current_sum=current, length=now + 1,
                        doc_start=doc_start, block_size=c)
  return o.astype(v.dtype), new_cache
