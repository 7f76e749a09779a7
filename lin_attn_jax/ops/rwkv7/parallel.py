"""RWKV-7's quadratic form: the whole sequence as one chunk (README.md).

With ``x_i = S_{i-1}^T a_i`` the value the rank-one term reads,

    S_i = D_i S_0 + sum_{j <= i} exp(G_i - G_j) * (b_j x_j^T + k_j v_j^T)

so, with the strictly causal scores ``A_ab[i, j] = a_i . (exp(G_{i-1} - G_j)
* b_j)`` (and ``A_ak`` likewise) and the causal ``P_rb``, ``P_rk``:

    (I - A_ab) X = A_ak V + (exp(G_{i-1}) * A) S_0
    o = P_rb X + P_rk V + (exp(G_i) * R) S_0

Memory and the triangular solve are quadratic in T: this form is for
checking and for short sequences.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunk_scores import sequence_scores
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.delta_rule.chunk import solve_unit_lower
from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate

_F32 = jnp.float32


def parallel_rwkv7(r, w, k, v, a, b, *, scale=None, initial_state=None,
                   output_final_state=False, segment_ids=None):
  """Quadratic form. Shapes as in ``chunk_rwkv7``."""
  bs, t, h, dk, dv = validate(r, w, k, v, a, b, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  rf, wf, kf, vf, af, bf = (jnp.asarray(x, _F32) for x in (r, w, k, v, a, b))
  rf = scale * rf
  doc = document_index(segment_ids, bs, t)                      # [B, T]
  mask = (jnp.tril(jnp.ones((t, t), dtype=bool))
          & same_document_mask(doc, doc)[:, None])              # [B, 1, T, T]
  strict = mask & ~jnp.eye(t, dtype=bool)
  a_b = sequence_scores(af, bf, wf, strict, strict=True)        # [B, H, T, T]
  a_k = sequence_scores(af, kf, wf, strict, strict=True)
  r_b = sequence_scores(rf, bf, wf, mask)
  r_k = sequence_scores(rf, kf, wf, mask)

  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  log_from_start = jnp.cumsum(wf, axis=1)                       # [B, T, H, K]
  log_before = jnp.concatenate([jnp.zeros_like(wf[:, :1]),
                                log_from_start[:, :-1]], axis=1)
  rhs = [jnp.einsum("bhij,bjhv->bhiv", a_k, vf)]                # [B, H, T, V]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, _F32)
    a_from_start = jnp.where(first_doc, af * jnp.exp(log_before), 0.0)
    rhs.insert(0, jnp.moveaxis(a_from_start, 1, 2))             # [B, H, T, K]
  wx = solve_unit_lower(-a_b, jnp.concatenate(rhs, axis=-1))
  x = wx[..., -dv:]                                             # [B, H, T, V]
  if initial_state is not None:
    x = x + jnp.einsum("bhik,bhkv->bhiv", wx[..., :dk], s0)
  o = (jnp.einsum("bhij,bhjv->bihv", r_b, x)
       + jnp.einsum("bhij,bjhv->bihv", r_k, vf))                # [B, T, H, V]
  if initial_state is not None:
    r_from_start = jnp.where(first_doc, rf * jnp.exp(log_from_start), 0.0)
    o = o + jnp.einsum("bihk,bhkv->bihv", r_from_start, s0)

  final_state = None
  if output_final_state:
    last_doc = doc[:, -1:]                                      # [B, 1]
    to_end = reverse_exclusive_cumsum(wf, axis=1)               # [B, T, H, K]
    to_end = jnp.exp(jnp.where((doc == last_doc)[:, :, None, None], to_end,
                               -jnp.inf))
    final_state = (jnp.einsum("bjhk,bhjv->bhkv", bf * to_end, x)
                   + jnp.einsum("bjhk,bjhv->bhkv", kf * to_end, vf))
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(jnp.sum(wf, axis=1))[..., None]           # [B, H, K, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o.astype(v.dtype), final_state
