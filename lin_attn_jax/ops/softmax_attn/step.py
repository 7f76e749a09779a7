"""Decoding with a KV cache: one token in, one output out.

Full attention keeps a fixed-size cache of ``max_length`` entries; token
``t`` goes to slot ``t``. Sliding-window attention keeps a ring buffer of
``w`` entries; token ``t`` goes to slot ``t mod w``, overwriting token
``t - w``, which has just left the window. Each entry remembers its position,
so the visible entries are found from positions alone: at or after the start
of the current document, at or before the current token, and inside the
window. The cost of a step is ``O(entries)``: ``O(t)`` for full attention,
``O(w)`` for a window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.cache import KVCache, tokens_seen
from lin_attn_jax.ops.softmax_attn.inputs import (check_heads,
                                                  check_values_from_keys,
                                                  default_scale)

_F32 = jnp.float32


def check_step(q, k, v, cache, reset):
  """Checks one new token for a cache of keys and values (``cache.k [B, S,
  Hkv, K]``, ``cache.v [B, S, Hkv, V]``): q ``[B, H, K]``, k and v of the
  cache's heads and widths, ``reset [B]`` or None. Returns ``(B, H, Hkv,
  K)``."""
  checks.check_rank("q", q, 3, "[B, H, K]")
  checks.check_rank("k", k, 3, "[B, Hkv, K]")
  checks.check_rank("v", v, 3, "[B, Hkv, V]")
  for name, x in (("q", q), ("k", k), ("v", v)):
    checks.check_float(name, x)
  b, h, dk = checks.shape_of(q)
  hkv = cache.k.shape[2]
  checks.check_shape("k", k, (b, hkv, dk), "[B, Hkv, K] of the cache")
  checks.check_shape("k", k, (b,) + cache.k.shape[2:],
                     "[B, Hkv, K] of the cache")
  checks.check_shape("v", v, (b,) + cache.v.shape[2:],
                     "[B, Hkv, V] of the cache")
  check_heads(h, hkv, checks.shape_of(q), checks.shape_of(k))
  checks.check_reset(reset, b)
  return b, h, hkv, dk


def _check_step(q, k, v, cache: KVCache, reset):
  b, h, hkv, dk = check_step(q, k, v, cache, reset)
  size = cache.k.shape[1]
  seen = tokens_seen(cache)
  if seen is not None and seen >= size:
    raise ValueError(f"cache is full: it holds max_length = {size} tokens "
                     f"and has seen {seen}")
  return b, h, hkv, dk, size


def softmax_attn_step(q, k, v, cache: KVCache, *, scale=None, reset=None,
                      bias=None, values_from_keys: int | None = None):
  """Appends one token to the cache and attends to the visible entries.

  Args:
    q: ``[B, H, K]``; k: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``.
    cache: from ``init_kv_cache`` or a previous step.
    scale: score scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document (the
      entries before it become invisible).
    bias: optional ``[B, H, S]`` float32 (one per query head), added to the
      scores of the cache's entries (this token's among them, in its slot)
      before the mask.
    values_from_keys: ``V``: the values are the first ``V`` channels of
      the keys, and ``v``, ``cache.v`` are zero-width (``[..., 0]``) and not
      read (a latent cache that stores each entry once: multi-head latent
      attention's absorbed decoding). None: the values are ``v``.
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_kv_cache(1, 2, 8, 8, window_size=4)
    >>> o, cache = softmax_attn_step(jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)),
    ...                              jnp.ones((1, 2, 8)), cache)
    >>> o.shape
    (1, 4, 8)
  """
  b, h, hkv, dk, size = _check_step(q, k, v, cache, reset)
  check_values_from_keys(values_from_keys, dk)
  scale = default_scale(scale, dk)
  now = cache.length                                            # [B]
  doc_start = cache.doc_start
  if reset is not None:
    doc_start = jnp.where(jnp.asarray(reset), now, doc_start)
  # Full cache: slot t, not stored past the capacity. Ring buffer: t mod w.
  slot = now % size if cache.window_size is not None else now   # [B]
  write = (jnp.arange(size)[None, :] == slot[:, None])          # [B, S]
  keys = jnp.where(write[..., None, None], k[:, None].astype(cache.k.dtype),
                   cache.k)                                     # [B, S, Hkv, K]
  values = jnp.where(write[..., None, None], v[:, None].astype(cache.v.dtype),
                     cache.v)                                   # [B, S, Hkv, V]
  position = jnp.where(write, now[:, None], cache.position)     # [B, S]

  visible = ((position >= doc_start[:, None]) & (position <= now[:, None])
             & (position >= 0))                                 # [B, S]
  if cache.window_size is not None:
    visible &= position > (now - cache.window_size)[:, None]
  qg = jnp.asarray(q, _F32).reshape(b, hkv, h // hkv, dk)       # [B, h, g, K]
  s = scale * jnp.einsum("bhgk,bjhk->bhgj", qg, keys,
                         preferred_element_type=_F32)           # [B, h, g, S]
  if bias is not None:
    s = s + jnp.asarray(bias, _F32).reshape(s.shape)
  s = jnp.where(visible[:, None, None], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)
  read = values if values_from_keys is None else keys[..., :values_from_keys]
  o = jnp.einsum("bhgj,bjhv->bhgv", p, read,
                 preferred_element_type=_F32).reshape(b, h, -1)  # [B, H, V]
  new_cache = KVCache(k=keys, v=values, position=position, length=now + 1,
                      doc_start=doc_start, window_size=cache.window_size)
  return o.astype(v.dtype), new_cache
