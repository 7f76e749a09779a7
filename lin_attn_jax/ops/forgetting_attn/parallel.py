"""The reference form: all ``[T, T]`` scores with their decay bias.

    o_i = sum_{j <= i} softmax_j(scale * q_i . k_j + D_ij) v_j,
    D_ij = sum_{l = j + 1 .. i} g_l

(Lin et al., 2025, "Forgetting Transformer: Softmax Attention with a Forget
Gate", arXiv:2503.02130), within a window and a document when given. Every
query sees itself (``D_ii = 0``), so no row is empty.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.forgetting_attn.gate_sums import pair_sums
from lin_attn_jax.ops.forgetting_attn.inputs import validate
from lin_attn_jax.ops.softmax_attn import masks
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


def parallel_forgetting_attn(q, k, v, g, *, scale=None, window_size=None,
                             segment_ids=None):
  """Forgetting attention with ``[T, T]`` float32 scores; the reference.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv`` (query head ``h`` reads k/v head ``h //
      (H // Hkv)``).
    g: ``[B, T, H]`` log forget gates ``<= 0`` (``log sigmoid`` of the
      gate's logit), one per query head.
    scale: score scale, ``K ** -0.5`` when None (the gate bias is not
      scaled).
    window_size: ``w``: each query sees itself and the ``w - 1`` keys before
      it; None for no window.
    segment_ids: ``[B, T]`` int; no attention across a change of id.
  Returns:
    ``o [B, T, H, V]`` in v's dtype. Scores, softmax and products in
    float32; the bias is ``pair_sums``, each entry summed on its own.

  Example:
    >>> q = jnp.ones((1, 10, 4, 8)); k = v = jnp.ones((1, 10, 2, 8))
    >>> g = jnp.full((1, 10, 4), -0.1)
    >>> parallel_forgetting_attn(q, k, v, g).shape
    (1, 10, 4, 8)
  """
  b, t, h, hkv, dk, dv = validate(q, k, v, g, segment_ids, window_size)
  i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
  mask = (masks.causal_mask(i, j, True)
          & masks.window_mask(i, j, window_size, True))          # [T, T]
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)
    mask = mask[None] & same_document_mask(doc, doc)           # [B, T, T]
  mask = jnp.broadcast_to(mask, (b, t, t))[:, None, None]      # [B,1,1,T,T]
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)   # [B,T,h,g,K]
  s = default_scale(scale, dk) * jnp.einsum(
      "bihgk,bjhk->bhgij", qg, jnp.asarray(k, _F32),
      preferred_element_type=_F32)                             # [B,h,g,T,T]
  decay = pair_sums(g).reshape(b, hkv, h // hkv, t, t)         # [B,h,g,T,T]
  # Masked (-inf) before the softmax's exp: j > i, outside the window, or
  # in another document.
  p = jax.nn.softmax(jnp.where(mask, s + decay, -jnp.inf), axis=-1)
  o = jnp.einsum("bhgij,bjhv->bihgv", p, jnp.asarray(v, _F32),
                 preferred_element_type=_F32)                  # [B,T,h,g,V]
  return o.reshape(b, t, h, dv).astype(v.dtype)
