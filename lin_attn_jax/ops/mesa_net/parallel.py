"""The quadratic form: the whole sequence as one chunk.

``H^kk_i p`` for every token at once through ``[T, T]`` decay-weighted
scores (``P_ij = exp(sum_{j < m <= i} g_m)``, summed exactly by
``segsum``, masked to ``j <= i`` in one document before ``exp``):

    H^kk_i p = sum_{j <= i, same document} P_ij beta_j (k_j . p) k_j
               + [no document start up to i] exp(G_i) H^kk_0^T p

then ``x = (H^kk + diag(lamb))^{-1} q`` by CG (``cg.py``) and the output
and final state from the core's ``parallel_gated_linear`` on the query
``x``, keys ``beta k`` and values ``[k | v]`` (scale 1).
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.decay import segsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.gated_linear import parallel_gated_linear
from lin_attn_jax.ops.mesa_net.cg import solve
from lin_attn_jax.ops.mesa_net.inputs import CG_STEPS, query_key, validate

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def parallel_mesa_net(q, k, v, g, beta, lamb, *, initial_state=None,
                      output_final_state=False, segment_ids=None,
                      cg_steps=CG_STEPS, use_qk_l2norm=False):
  """MesaNet with ``[T, T]`` scores in every CG step; arguments and result
  as in ``naive_recurrent_mesa_net``."""
  b, t, h, dk, dv = validate(q, k, v, g, beta, lamb, initial_state,
                             segment_ids, cg_steps)
  q, k = query_key(q, k, use_qk_l2norm)
  g, beta = jnp.asarray(g, _F32), jnp.asarray(beta, _F32)
  doc = document_index(segment_ids, b, t)                       # [B, T]
  causal = jnp.tril(jnp.ones((t, t), dtype=bool))
  mask = causal & same_document_mask(doc, doc)[:, None]         # [B,1,T,T]
  pairs = jnp.exp(jnp.where(mask, segsum(g, axis=1), -jnp.inf))
  pairs = pairs * jnp.moveaxis(beta, 1, 2)[:, :, None, :]       # [B,H,i,j]
  k_h = jnp.moveaxis(k, 1, 2)                                   # [B,H,T,K]
  lamb = jnp.asarray(lamb, _F32)[:, None, :]                    # [H, 1, K]
  read = None
  if initial_state is not None:
    h_kk0 = jnp.asarray(initial_state, _F32)[..., :dk]          # [B,H,K,K]
    read = jnp.where((doc == 0)[:, None, :, None],
                     jnp.exp(jnp.cumsum(jnp.moveaxis(g, 1, 2), axis=2))
                     [..., None], 0.0)                          # [B,H,T,1]

  def matvec(p):                                                # [B,H,T,K]
    scores = _mm("bhik,bhjk->bhij", p, k_h) * pairs
    out = _mm("bhij,bhjk->bhik", scores, k_h) + lamb * p
    if read is not None:
      out = out + _mm("bhik,bhkl->bhil", read * p, h_kk0)
    return out

  x = jnp.moveaxis(solve(matvec, jnp.moveaxis(q, 1, 2), cg_steps), 2, 1)
  values = jnp.concatenate([k, jnp.asarray(v, _F32)], axis=-1)
  o, state = parallel_gated_linear(
      x, beta[..., None] * k, values, g, scale=1.0,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids)
  return o[..., dk:].astype(v.dtype), state
