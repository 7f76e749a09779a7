"""The whole sequence as one chunk of the WY form (README.md).

    A[i, j] = beta_i k_i . (exp(G_i - G_j) * k_j)   j < i, same document
    P[i, j] = q_i . (exp(G_i - G_j) * k_j)          j <= i, same document
    (I + A) [W | U] = diag(beta) [exp(G) * K | V]   (W only for S_0)
    o = (exp(G) * Q) S_0 + P (U - W S_0)

The decay-weighted scores are ``common.chunk_scores.sequence_scores`` (the
chunk form's score stage over the whole sequence), so ``G_i - G_j`` is always
a sum of the gates between j and i. Memory and the triangular solve are
quadratic in T: this form is for checking and for short sequences.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunk_scores import sequence_scores
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.delta_rule.chunk import solve_unit_lower
from lin_attn_jax.ops.delta_rule.inputs import (default_scale,
                                                expand_query_key, validate)

_F32 = jnp.float32


def parallel_delta_rule(q, k, v, beta, g=None, *, scale=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None, use_qk_l2norm=False):
  """Quadratic form. Shapes as in ``chunk_delta_rule``."""
  b, t, h, hv, dk, dv, g = validate(q, k, v, beta, g, initial_state,
                                    segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [B,T,HV,K]
  qf = scale * q
  vf = jnp.asarray(v, _F32)
  beta_t = jnp.moveaxis(jnp.asarray(beta, _F32), 1, 2)          # [B, HV, T]
  if g is None:
    g = jnp.zeros((b, t, hv, 1), _F32)
  doc = document_index(segment_ids, b, t)                       # [B, T]
  mask = (jnp.tril(jnp.ones((t, t), dtype=bool))
          & same_document_mask(doc, doc)[:, None])              # [B, 1, T, T]
  strict = mask & ~jnp.eye(t, dtype=bool)
  scores = sequence_scores(qf, k, g, mask)                      # [B, HV, T, T]
  a = sequence_scores(k, k, g, strict) * beta_t[..., None]      # [B, HV, T, T]

  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  from_start = jnp.exp(jnp.cumsum(g, axis=1))                   # [B, T, HV, G]
  rhs = [vf]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, _F32)
    rhs.insert(0, jnp.where(first_doc, k * from_start, 0.0))
  rhs = jnp.moveaxis(jnp.concatenate(rhs, axis=-1), 1, 2)       # [B,HV,T,*]
  wu = solve_unit_lower(a, beta_t[..., None] * rhs)
  u = wu[..., -dv:]                                             # [B, HV, T, V]
  if initial_state is not None:
    u = u - jnp.einsum("bhjk,bhkv->bhjv", wu[..., :dk], s0)
  o = jnp.einsum("bhij,bhjv->bihv", scores, u)                  # [B, T, HV, V]
  if initial_state is not None:
    q_from_start = jnp.where(first_doc, qf * from_start, 0.0)
    o = o + jnp.einsum("bihk,bhkv->bihv", q_from_start, s0)

  final_state = None
  if output_final_state:
    last_doc = doc[:, -1:]                                      # [B, 1]
    to_end = reverse_exclusive_cumsum(g, axis=1)                # [B, T, HV, G]
    to_end = jnp.where((doc == last_doc)[:, :, None, None], to_end, -jnp.inf)
    final_state = jnp.einsum("bjhk,bhjv->bhkv", k * jnp.exp(to_end), u)
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(jnp.sum(g, axis=1))[..., None]            # [B, HV, G, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o.astype(v.dtype), final_state
