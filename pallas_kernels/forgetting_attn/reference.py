"""Forgetting attention by its definition, in plain ``jnp``: the ``[T, T]``
scores, float32.

    o_i = sum_j softmax_j(scale q_i . k_j + c_i - c_j) v_j

over the keys ``j <= i`` of ``i``'s document with ``i - j < window_size``;
``c`` is the cumulative log forget gate of every query head. It documents
what the kernels compute, checks them in the tests, and runs wherever XLA
does (memory ``O(T^2)`` per head); its gradient is JAX's autodiff.

Letters: b batch, h query head, i query position, j key position, k key
channel, v value channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def allowed_pairs(length: int, segment_ids=None, window_size=None):
  """``[B or 1, T, T]`` bool: key ``j`` is visible to query ``i`` (``j <=
  i``, ``i - j < window_size``, one document: a run of equal ids)."""
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  mask = j <= i
  if window_size is not None:
    mask = mask & (i - j < window_size)
  mask = jnp.asarray(mask)[None]
  if segment_ids is None:
    return mask
  ids = jnp.asarray(segment_ids)
  starts = jnp.pad(ids[:, 1:] != ids[:, :-1], ((0, 0), (1, 0)))
  doc = jnp.cumsum(starts.astype(jnp.int32), axis=1)               # [B, T]
  return mask & (doc[:, :, None] == doc[:, None, :])


def forgetting_attention_reference(q, k, v, c, *, scale=None,
                                   segment_ids=None, window_size=None):
  """Arguments as ``forgetting_attention``; ``o [B, T, H, V]`` in ``v``'s
  dtype, computed in float32 (every matmul at the highest precision)."""
  b, t, h, dk = q.shape
  groups = h // k.shape[2]
  scale = dk ** -0.5 if scale is None else scale
  out_dtype = v.dtype
  q, k, v, c = (jnp.asarray(x, _F32) for x in (q, k, v, c))
  k = jnp.repeat(k, groups, axis=2)                             # [B,T,H,K]
  v = jnp.repeat(v, groups, axis=2)                             # [B,T,H,V]
  ct = jnp.swapaxes(c, 1, 2)                                    # [B, H, T]
  s = (scale * jnp.einsum("bihk,bjhk->bhij", q, k, precision=_HIGHEST)
       + (ct[:, :, :, None] - ct[:, :, None, :]))               # [B,H,T,T]
  mask = allowed_pairs(t, segment_ids, window_size)[:, None]    # [B,1,T,T]
  p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
  o = jnp.einsum("bhij,bjhv->bihv", p, v, precision=_HIGHEST)   # [B,T,H,V]
  return o.astype(out_dtype)
