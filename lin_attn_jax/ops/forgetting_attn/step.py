"""Decoding with a cache: one token in, one output out.

The cache (``cache.ForgettingCache``) holds what softmax decoding holds,
the keys and values of the visible tokens with their positions (a full
cache of ``max_length`` entries, or a ring buffer of ``w`` for a window),
and for every entry ``j`` and query head its decay to the latest token,
``r_j = sum_{l = j + 1 .. t} g_l``: ``S (Hkv (K + V) + H)`` numbers per row
for ``S`` entries. A step at token ``t`` adds ``g_t`` to every ``r_j``,
writes its key, value and ``r_t = 0`` into its slot, and attends with the
scores ``scale q_t . k_j + r_j``. Cost ``O(S H K)``, as for softmax
attention: ``O(t)`` per token with a full cache, ``O(w)`` with a window.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.forgetting_attn.cache import (ForgettingCache,
                                                    check_cache_heads)
from lin_attn_jax.ops.forgetting_attn.inputs import check_gate
from lin_attn_jax.ops.softmax_attn.cache import store_tokens
from lin_attn_jax.ops.softmax_attn.step import softmax_attn_step


def forgetting_attn_step(q, k, v, g, cache: ForgettingCache, *, scale=None,
                         reset=None):
  """Appends one token to the cache and attends to the visible entries.

  Args:
    q: ``[B, H, K]``; k: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``.
    g: ``[B, H]`` log forget gates ``<= 0`` of this token.
    cache: from ``init_forgetting_cache`` or a previous step.
    scale: score scale, ``K ** -0.5`` when None.
    reset: ``[B]`` bool, True where this token starts a new document (the
      entries before it become invisible).
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_forgetting_cache(1, 4, 2, 8, 8, window_size=4)
    >>> o, cache = forgetting_attn_step(
    ...     jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)), jnp.ones((1, 2, 8)),
    ...     jnp.full((1, 4), -0.1), cache)
    >>> o.shape
    (1, 4, 8)
  """
  checks.check_rank("q", q, 3, "[B, H, K]")
  check_gate(g, checks.shape_of(q)[:2], "[B, H] of q")
  check_cache_heads(cache, checks.shape_of(q)[1])
  gate = jnp.asarray(g, jnp.float32)[:, None]                   # [B, 1, H]
  log_decay = store_tokens(cache.kv, cache.log_decay + gate,
                           jnp.zeros_like(gate))                # [B, S, H]
  o, kv = softmax_attn_step(q, k, v, cache.kv, scale=scale, reset=reset,
                            bias=jnp.swapaxes(log_decay, 1, 2))
  return o, ForgettingCache(kv, log_decay)
