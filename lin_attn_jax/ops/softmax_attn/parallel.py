"""The reference form: all ``[T, T]`` scores, masked, softmax, times v.

    o_i = sum_j softmax_j(scale * q_i . k_j + mask_ij) v_j

The mask is causality, the window, global positions (``masks.dense_mask``)
and document boundaries. Every query sees at least itself, so no row is
empty.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.softmax_attn import masks
from lin_attn_jax.ops.softmax_attn.inputs import default_scale, validate

_F32 = jnp.float32


def masked_softmax_attention(q, k, v, mask, scale):
  """Dense attention under an explicit mask.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, S, Hkv, K]``; v: ``[B, S, Hkv, V]``.
    mask: bool, broadcastable to ``[B, T, S]``; every row has a True entry.
    scale: multiplies the scores.
  Returns:
    ``o [B, T, H, V]`` float32.
  """
  b, t, h, dk = q.shape
  hkv = k.shape[2]
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)   # [B,T,h,g,K]
  s = scale * jnp.einsum("bihgk,bjhk->bhgij", qg, jnp.asarray(k, _F32),
                         preferred_element_type=_F32)          # [B,h,g,T,S]
  mask = jnp.broadcast_to(mask, (b,) + mask.shape[-2:])[:, None, None]
  p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
  o = jnp.einsum("bhgij,bjhv->bihgv", p, jnp.asarray(v, _F32),
                 preferred_element_type=_F32)                  # [B,T,h,g,V]
  return o.reshape(b, t, h, v.shape[-1])


def parallel_softmax_attn(q, k, v, *, scale=None, causal=True,
                          window_size=None, segment_ids=None,
                          global_positions=None):
  """Softmax attention with ``[T, T]`` scores; the reference of the family.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv`` (query head ``h`` reads k/v head
      ``h // (H // Hkv)``).
    scale: score scale, ``K ** -0.5`` when None.
    causal: each query sees only keys at or before it.
    window_size: ``w``: each query sees itself and the ``w - 1`` keys
      before it (``|i - j| < w`` when not causal); None for no window.
    segment_ids: ``[B, T]`` int; no attention across a change of id.
    global_positions: static positions (Longformer global tokens) that
      attend to, and are attended by, every position regardless of the
      window (not across documents, nor into the future when causal).
  Returns:
    ``o [B, T, H, V]`` in v's dtype.

  Example:
    >>> q = jnp.ones((1, 10, 4, 8)); k = v = jnp.ones((1, 10, 2, 8))
    >>> parallel_softmax_attn(q, k, v, window_size=3).shape
    (1, 10, 4, 8)
  """
  b, t, h, hkv, dk, dv, glob = validate(q, k, v, segment_ids, window_size,
                                        global_positions)
  pos = jnp.arange(t)
  mask = masks.dense_mask(pos[:, None], pos[None, :], causal=causal,
                          window_size=window_size,
                          global_flags=masks.global_flags_table(glob, t))
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)
    mask = mask[None] & same_document_mask(doc, doc)           # [B, T, T]
  o = masked_softmax_attention(q, k, v, mask, default_scale(scale, dk))
  return o.astype(v.dtype)
