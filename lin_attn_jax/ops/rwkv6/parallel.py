"""RWKV-6's quadratic form.

    o_i = sum_{j < i, same document} (r_i . (exp(G_{i-1} - G_j) * k_j)) v_j
          + (r_i . (u * k_i)) v_i
          + [no reset in 1..i] (r_i * exp(G_{i-1})) . S_0

The scores are the strictly causal ``sequence_scores``; the final state is
that of gated linear attention.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunk_scores import sequence_scores
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.rwkv6.inputs import bonus, default_scale, validate

_F32 = jnp.float32


def parallel_rwkv6(r, k, v, w, u, *, scale=None, initial_state=None,
                   output_final_state=False, segment_ids=None):
  """Quadratic form. Shapes as in ``chunk_rwkv6``."""
  b, t, h, dk, dv = validate(r, k, v, w, u, initial_state, segment_ids)
  scale = default_scale(scale, dk)
  rf, kf, vf, wf = (jnp.asarray(x, _F32) for x in (r, k, v, w))
  rf = scale * rf
  doc = document_index(segment_ids, b, t)                       # [B, T]
  strict = (jnp.tril(jnp.ones((t, t), dtype=bool), -1)
            & same_document_mask(doc, doc)[:, None])            # [B, 1, T, T]
  scores = sequence_scores(rf, kf, wf, strict, strict=True)     # [B, H, T, T]
  o = jnp.einsum("bhij,bjhv->bihv", scores, vf) + bonus(r, k, v, u, scale)
  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, _F32)
    before = jnp.concatenate([jnp.zeros_like(wf[:, :1]),
                              jnp.cumsum(wf, axis=1)[:, :-1]],
                             axis=1)                            # [B, T, H, K]
    r_from_start = jnp.where(first_doc, rf * jnp.exp(before), 0.0)
    o = o + jnp.einsum("bihk,bhkv->bihv", r_from_start, s0)
  final_state = None
  if output_final_state:
    last_doc = doc[:, -1:]                                      # [B, 1]
    to_end = reverse_exclusive_cumsum(wf, axis=1)               # [B, T, H, K]
    to_end = jnp.where((doc == last_doc)[:, :, None, None], to_end, -jnp.inf)
    final_state = jnp.einsum("bjhk,bjhv->bhkv", kf * jnp.exp(to_end), vf)
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(jnp.sum(wf, axis=1))[..., None]           # [B, H, K, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o.astype(v.dtype), final_state
