"""The cache of forgetting-attention decoding (see ``step.py``), and prefill.

A ``ForgettingCache`` is the softmax family's ``KVCache`` (keys, values and
the position of every entry; ``max_length`` entries, or a ring buffer of
``w`` for a window) plus, for every entry ``j`` and query head, its decay
to the latest token ``t``: ``r_j = sum_{l = j + 1 .. t} g_l``, float32. A
new token adds its gate to every ``r_j`` and enters with ``r = 0``; its
bias on entry ``j`` is then ``r_j`` itself. Each ``r_j`` is a sum of its own
gates only, so it stays exact relative to itself over any number of steps
(a cached cumulative gate ``c_t`` would grow with ``t`` and lose the
precision of the small differences that matter).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.forgetting_attn.gate_sums import gate_cumsum
from lin_attn_jax.ops.forgetting_attn.inputs import check_gate
from lin_attn_jax.ops.softmax_attn.cache import (KVCache, init_kv_cache,
                                                 softmax_attn_extend,
                                                 store_tokens)
from lin_attn_jax.ops.softmax_attn.inputs import check_grouped_qkv

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class ForgettingCache:
  """Keys, values and gate decays of the tokens seen so far (a pytree)."""
  kv: KVCache             # keys, values, positions (softmax_attn.cache)
  log_decay: jax.Array    # [B, S, H] float32 r_j: gates after entry j so far


jax.tree_util.register_dataclass(ForgettingCache,
                                 data_fields=["kv", "log_decay"],
                                 meta_fields=[])


def init_forgetting_cache(batch: int, heads: int, heads_kv: int, dim_k: int,
                          dim_v: int, *, max_length: int | None = None,
                          window_size: int | None = None,
                          dtype=jnp.float32) -> ForgettingCache:
  """An empty cache.

  Args:
    batch, heads, heads_kv, dim_k, dim_v: ``B``, ``H`` (query heads, one
      gate each), ``Hkv``, ``K``, ``V``.
    max_length, window_size, dtype: as in ``init_kv_cache`` (``dtype`` of
      the keys and values; the decays are float32).
  """
  checks.positive_int("heads", heads)
  kv = init_kv_cache(batch, heads_kv, dim_k, dim_v, max_length=max_length,
                     window_size=window_size, dtype=dtype)
  return ForgettingCache(kv, jnp.zeros((batch, kv.k.shape[1], heads), _F32))


def check_cache_heads(cache: ForgettingCache, heads: int) -> None:
  if cache.log_decay.shape[-1] != heads:
    raise ValueError(f"q has H = {heads} heads, the cache keeps the gates "
                     f"of {cache.log_decay.shape[-1]} (log_decay of shape "
                     f"{checks.shape_of(cache.log_decay)})")


def forgetting_attn_extend(q, k, v, g, cache: ForgettingCache, *, scale=None,
                           segment_ids=None, reset=None):
  """Appends ``T`` tokens to the cache; each attends to what it can see.

  The multi-token form of ``forgetting_attn_step`` (prefill, or a block of
  tokens after earlier ones): new token ``a`` puts the bias ``r_j + c_a``
  on cached entry ``j`` and ``c_a - c_b`` on new token ``b <= a`` (``c``
  the new tokens' gate sums, ``gate_sums.gate_cumsum``), then the softmax
  family's ``softmax_attn_extend`` attends; the decays then become ``r_j +
  c_last`` and ``c_last - c_b``. Cost ``O(T (S + T))``, as for softmax.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    g: ``[B, T, H]`` log forget gates ``<= 0``.
    cache: from ``init_forgetting_cache`` or a previous call.
    scale: score scale, ``K ** -0.5`` when None.
    segment_ids: ``[B, T]`` int, a new document starts at every change.
    reset: ``[B]`` bool, True where the first token starts a new document.
  Returns:
    ``(o [B, T, H, V] in v's dtype, the updated cache)``.
  """
  b, t, h, _, _, _ = check_grouped_qkv(q, k, v)
  check_gate(g, (b, t, h), "[B, T, H] of q")
  check_cache_heads(cache, h)
  if segment_ids is not None:
    checks.check_segment_ids(segment_ids, b, t)
  c = gate_cumsum(g, segment_ids)                               # [B, T, H]
  cached = cache.log_decay[:, None] + c[:, :, None]             # [B, T, S, H]
  new = c[:, :, None] - c[:, None]                              # [B, T, T, H]
  # Entries b > a get c_a - c_b > 0 here: the extend's mask sets them to
  # -inf before any exp.
  bias = jnp.concatenate([cached, new], axis=2).transpose(0, 3, 1, 2)
  o, kv = softmax_attn_extend(q, k, v, cache.kv, scale=scale,
                              segment_ids=segment_ids, reset=reset,
                              bias=bias)                        # [B,H,T,S+T]
  last = c[:, -1:]                                              # [B, 1, H]
  log_decay = store_tokens(cache.kv, cache.log_decay + last, last - c)
  return o, ForgettingCache(kv, log_decay)
