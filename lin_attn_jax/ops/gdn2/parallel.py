"""The whole sequence as one chunk of the WY form (README.md).

With the erase key ``e = b * k`` and the written value ``u = w * v``:

    A[i, j] = e_i . (exp(G_i - G_j) * k_j)          j < i, same document
    P[i, j] = q_i . (exp(G_i - G_j) * k_j)          j <= i, same document
    (I + A) [W | U] = [exp(G) * E | w * V]          (W only for S_0)
    o = (exp(G) * Q) S_0 + P (U - W S_0)

the delta-rule core's parallel form (``delta_rule/parallel.py``) with the
row key of ``A`` and of the right-hand side ``e`` instead of ``beta * k``.
Memory and the triangular solve are quadratic in T: this form is for
checking and for short sequences.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunk_scores import sequence_scores
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.delta_rule.chunk import solve_unit_lower
from lin_attn_jax.ops.gdn2.inputs import core_inputs, default_scale, validate

_F32 = jnp.float32


def parallel_gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None,
                  output_final_state=False, segment_ids=None,
                  use_qk_l2norm=False):
  """Quadratic form. Shapes as in ``chunk_gdn2``."""
  bs, t, _, hv, dk, dv = validate(q, k, v, g, b, w, initial_state,
                                  segment_ids)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, g, b, w, hv, use_qk_l2norm)
  qf = scale * q                                                # [B,T,HV,K]
  doc = document_index(segment_ids, bs, t)                      # [B, T]
  mask = (jnp.tril(jnp.ones((t, t), dtype=bool))
          & same_document_mask(doc, doc)[:, None])              # [B, 1, T, T]
  strict = mask & ~jnp.eye(t, dtype=bool)
  scores = sequence_scores(qf, k, g, mask)                      # [B, HV, T, T]
  a = sequence_scores(erase, k, g, strict)                      # [B, HV, T, T]

  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  from_start = jnp.exp(jnp.cumsum(g, axis=1))                   # [B, T, HV, K]
  rhs = [written]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, _F32)
    rhs.insert(0, jnp.where(first_doc, erase * from_start, 0.0))
  rhs = jnp.moveaxis(jnp.concatenate(rhs, axis=-1), 1, 2)       # [B,HV,T,*]
  wu = solve_unit_lower(a, rhs)
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
    to_end = reverse_exclusive_cumsum(g, axis=1)                # [B, T, HV, K]
    to_end = jnp.where((doc == last_doc)[:, :, None, None], to_end, -jnp.inf)
    final_state = jnp.einsum("bjhk,bhjv->bhkv", k * jnp.exp(to_end), u)
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(jnp.sum(g, axis=1))[..., None]            # [B, HV, K, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o.astype(v.dtype), final_state
