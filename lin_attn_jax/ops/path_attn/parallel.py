"""The definition of PaTH attention: ``[T, T]`` logits, softmax, times v.

PaTH (Yang et al., 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations", arXiv:2505.16381) puts a
data-dependent transformation between every query and key: with ``H_s = I
- beta_s w_s w_s^T`` (``w_s`` unit-norm, ``beta_s`` in (0, 2)),

    z_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j                (j <= i)
    o_i = sum_j softmax_j(scale * (z_ij + c_i - c_j)) v_j

with ``c = cumsum(g)`` the optional forget gate (``g <= 0``, one per query
head; as in flash-linear-attention, the scale multiplies the gate's bias
too). The keys are transformed the way a decoder sees them: a ``lax.scan``
over the tokens keeps every key seen so far transformed by every
reflection after it, and applies each new token's reflection to all of
them before storing the new key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.path_attn.inputs import default_scale, validate

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def parallel_path_attn(q, k, v, w, beta, g=None, *, scale=None,
                       segment_ids=None):
  """PaTH attention with ``[T, T]`` logits, in float32; the reference.

  Args:
    q: ``[B, T, H, K]``.
    k: ``[B, T, Hkv, K]``; ``H`` a multiple of ``Hkv`` (query head ``h``
      reads key/value head ``h // (H // Hkv)``).
    v: ``[B, T, Hkv, V]``.
    w: ``[B, T, Hkv, K]``, the Householder directions (unit-norm in the
      layer; the op does not normalise them).
    beta: ``[B, T, Hkv]``, their strengths (in (0, 2) in the layer).
    g: ``[B, T, H]`` log forget gates ``<= 0``, or None for none.
    scale: multiplies the logits and the gate's bias, ``K ** -0.5`` when
      None.
    segment_ids: ``[B, T]`` int; no attention across a change of id (the
      reflections between two tokens of one document are that document's).
  Returns:
    ``o [B, T, H, V]`` in v's dtype.

  Example:
    >>> q = jnp.ones((1, 6, 4, 8)); k = v = jnp.ones((1, 6, 2, 8))
    >>> w = jnp.ones((1, 6, 2, 8)) / 8 ** 0.5; beta = jnp.ones((1, 6, 2))
    >>> parallel_path_attn(q, k, v, w, beta).shape
    (1, 6, 4, 8)
  """
  b, t, h, hkv, dk, _ = validate(q, k, v, w, beta, g, segment_ids)
  scale = default_scale(scale, dk)
  grouped = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)

  def token(keys, xs):
    i, q_i, k_i, w_i, beta_i = xs
    # Every key seen so far crosses H_i = I - beta_i w_i w_i^T ...
    along = jnp.einsum("bjhk,bhk->bjh", keys, w_i,
                       precision=_HIGHEST)                      # [B, T, Hkv]
    keys = keys - (beta_i[:, None] * along)[..., None] * w_i[:, None]
    # ... and the new key joins them as it is.
    keys = jax.lax.dynamic_update_slice_in_dim(keys, k_i[:, None], i, axis=1)
    z_i = jnp.einsum("bhgk,bjhk->bhgj", q_i, keys,
                     precision=_HIGHEST)                        # [B,h,g,T]
    return keys, z_i

  tokens = (jnp.arange(t),) + tuple(
      jnp.moveaxis(jnp.asarray(x, _F32), 1, 0)
      for x in (grouped, k, w, beta))
  _, z = jax.lax.scan(token, jnp.zeros((b, t, hkv, dk), _F32), tokens)
  z = jnp.moveaxis(z, 0, 3)                                     # [B,h,g,T,T]
  if g is not None:
    c = jnp.cumsum(jnp.asarray(g, _F32), axis=1)                # [B, T, H]
    c = jnp.moveaxis(c.reshape(b, t, hkv, h // hkv), 1, 3)      # [B,h,g,T]
    z = z + c[..., :, None] - c[..., None, :]
  pos = jnp.arange(t)
  mask = (pos[None, :] <= pos[:, None])[None]                   # [1, T, T]
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)
    mask = mask & same_document_mask(doc, doc)                  # [B, T, T]
  p = jax.nn.softmax(jnp.where(mask[:, None, None], scale * z, -jnp.inf),
                     axis=-1)
  o = jnp.einsum("bhgij,bjhv->bihgv", p, jnp.asarray(v, _F32),
                 precision=_HIGHEST)                            # [B,T,h,g,V]
  return o.reshape(b, t, h, -1).astype(v.dtype)
