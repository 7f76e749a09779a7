r"""The definition: all ``[T, T]`` logits, the sticks broken in log space.

    z_ij = scale q_i . k_j
    log A_ij = log_sigmoid(z_ij) - sum_{l visible, j < l} softplus(z_il)
    o_i = sum_{j visible} A_ij v_j,   rem_i = 1 - sum_j A_ij

with ``j`` visible from ``i`` when ``j < i`` (``j <= i`` with
``attend_current``) and both are in one document (``sticks.py``). There is
no softmax and no position encoding: the order of the keys enters through
the stick alone. Float32 throughout.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.softmax_attn.inputs import default_scale
from lin_attn_jax.ops.stickbreaking_attn.inputs import validate
from lin_attn_jax.ops.stickbreaking_attn.sticks import break_sticks

_F32 = jnp.float32


def causal_visibility(i, j, attend_current: bool):
  """Key position ``j`` is visible from query position ``i``."""
  return j <= i if attend_current else j < i


def parallel_stickbreaking_attn(q, k, v, *, scale=None, attend_current=False,
                                segment_ids=None, output_rem=False):
  """Stick-breaking attention (Tan et al., 2024, arXiv:2410.17980), dense.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv`` (query head ``h`` reads k/v head
      ``h // (H // Hkv)``).
    scale: logit scale, ``K ** -0.5`` when None.
    attend_current: a query also sees its own key (else only earlier
      ones, and a document's first query outputs 0).
    segment_ids: ``[B, T]`` int; a query's stick covers only its document.
    output_rem: also return the remaining stick.
  Returns:
    ``o [B, T, H, V]`` in v's dtype; with ``output_rem``, ``(o, rem [B, T,
    H] float32)``, ``rem_i = 1 - sum_j A_ij`` (the stick no key took).

  Example:
    >>> q = jnp.ones((1, 10, 4, 8)); k = v = jnp.ones((1, 10, 2, 8))
    >>> o, rem = parallel_stickbreaking_attn(q, k, v, output_rem=True)
    >>> o.shape, rem.shape
    ((1, 10, 4, 8), (1, 10, 4))
  """
  b, t, h, hkv, dk, dv = validate(q, k, v, segment_ids, attend_current)
  scale = default_scale(scale, dk)
  pos = jnp.arange(t)
  visible = causal_visibility(pos[:, None], pos[None, :], attend_current)
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)
    visible = visible[None] & same_document_mask(doc, doc)      # [B, T, T]
  visible = jnp.broadcast_to(visible, (b, t, t))[:, None, None]
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)    # [B,T,h,g,K]
  z = scale * jnp.einsum("bihgk,bjhk->bhgij", qg, jnp.asarray(k, _F32),
                         preferred_element_type=_F32)           # [B,h,g,T,T]
  log_a, taken = break_sticks(z, visible)
  o = jnp.einsum("bhgij,bjhv->bihgv", jnp.exp(log_a), jnp.asarray(v, _F32),
                 preferred_element_type=_F32)                   # [B,T,h,g,V]
  o = o.reshape(b, t, h, dv).astype(v.dtype)
  if not output_rem:
    return o
  rem = jnp.exp(-taken).transpose(0, 3, 1, 2).reshape(b, t, h)  # [B, T, H]
  return o, rem
