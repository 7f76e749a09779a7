"""One decoding step of PaTH attention with its cache (``cache.py``).

The new token's reflection ``H_t = I - beta_t w_t w_t^T`` is applied to
every cached key (``k_j <- k_j - beta_t (k_j . w_t) w_t``), its log-gate
is added to every entry's gate, and its key and value are stored as they
are; then its query attends to the visible entries (at or after the
start of its document). ``O(S (K + V))`` per key head for a cache of
``S`` entries: the cost of a softmax attention step plus one rank-one
update of the cached keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.path_attn.cache import PaTHCache, check_cache
from lin_attn_jax.ops.path_attn.inputs import default_scale, validate_step

_F32 = jnp.float32


def path_attn_step(q, k, v, w, beta, cache: PaTHCache, *, g=None, scale=None,
                   reset=None):
  """Appends one token to the cache and attends to the visible entries.

  Args:
    q: ``[B, H, K]``; k, w: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``; beta:
      ``[B, Hkv]``.
    cache: from ``init_path_cache`` or a previous step.
    g: ``[B, H]`` log forget gates ``<= 0`` (exactly when the cache has a
      gate).
    scale: multiplies the logits and the gate's bias, ``K ** -0.5`` when
      None.
    reset: ``[B]`` bool, True where this token starts a new document (the
      entries before it become invisible).
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_path_cache(1, 2, 8, 8, max_length=16)
    >>> w = jnp.ones((1, 2, 8)) / 8 ** 0.5
    >>> o, cache = path_attn_step(jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)),
    ...                           jnp.ones((1, 2, 8)), w, jnp.ones((1, 2)),
    ...                           cache)
    >>> o.shape
    (1, 4, 8)
  """
  b, h, hkv, dk, dv = validate_step(q, k, v, w, beta, g)
  check_cache(cache, b, h, hkv, dk, dv, g, 1)
  checks.check_reset(reset, b)
  scale = default_scale(scale, dk)
  now = cache.length                                            # [B]
  doc_start = cache.doc_start
  if reset is not None:
    doc_start = jnp.where(jnp.asarray(reset), now, doc_start)
  w_t = jnp.asarray(w, _F32)                                    # [B, Hkv, K]
  beta_t = jnp.asarray(beta, _F32)                              # [B, Hkv]
  keys = jnp.asarray(cache.k, _F32)                             # [B,S,Hkv,K]
  along = jnp.einsum("bjhk,bhk->bjh", keys, w_t,
                     preferred_element_type=_F32)               # [B, S, Hkv]
  keys = keys - (beta_t[:, None] * along)[..., None] * w_t[:, None]
  size = cache.k.shape[1]
  write = jnp.arange(size)[None, :] == now[:, None]             # [B, S]
  keys = jnp.where(write[..., None, None], jnp.asarray(k, _F32)[:, None],
                   keys)                                        # [B,S,Hkv,K]
  values = jnp.where(write[..., None, None], v[:, None].astype(cache.v.dtype),
                     cache.v)                                   # [B,S,Hkv,V]
  position = jnp.where(write, now[:, None], cache.position)     # [B, S]
  visible = ((position >= doc_start[:, None]) & (position <= now[:, None])
             & (position >= 0))                                 # [B, S]
  qg = jnp.asarray(q, _F32).reshape(b, hkv, h // hkv, dk)       # [B, h, g, K]
  z = jnp.einsum("bhgk,bjhk->bhgj", qg, keys,
                 preferred_element_type=_F32)                   # [B, h, g, S]
  log_gate = None
  if g is not None:
    log_gate = jnp.where(write[..., None], 0.0,
                         cache.log_gate + jnp.asarray(g, _F32)[:, None])
    z = z + log_gate.reshape(b, size, hkv, h // hkv).transpose(0, 2, 3, 1)
  s = jnp.where(visible[:, None, None], scale * z, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("bhgj,bjhv->bhgv", p, values,
                 preferred_element_type=_F32).reshape(b, h, dv)  # [B, H, V]
  new_cache = PaTHCache(k=keys.astype(cache.k.dtype), v=values,
                        log_gate=log_gate, position=position,
                        length=now + 1, doc_start=doc_start)
  return o.astype(v.dtype), new_cache
