"""The dense ``[T, T]`` definition of non-causal ReLU linear attention."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import (document_index,
                                              same_document_mask)
from lin_attn_jax.ops.linear_attn.inputs import with_normalizer
from lin_attn_jax.ops.relu_linear_attn.inputs import (RELU_EPS, check_inputs,
                                                      divide, features)

_F32 = jnp.float32


def relu_linear_attn_reference(q, k, v, *, eps: float = RELU_EPS,
                               segment_ids=None, causal=False):
  """``o_i = sum_j s_ij v_j / (sum_j s_ij + eps)``, ``s_ij = relu(q_i) .
  relu(k_j)`` over ``i``'s document.

  Args:
    q, k: ``[B, T, H, K]`` (raw: the op applies the ReLU); v: ``[B, T, H,
      V]``. eps: added to the denominator (1e-15, the reference's).
    segment_ids: ``[B, T]`` or None. causal: must be False.
  Returns:
    ``o [B, T, H, V]`` in v's dtype; scores and sums in float32.
  """
  b, t, _, _, _ = check_inputs(q, k, v, segment_ids, causal)
  s = jnp.einsum("bihk,bjhk->bhij", features(q), features(k),
                 preferred_element_type=_F32)                   # [B, H, T, T]
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)                     # [B, T]
    s = jnp.where(same_document_mask(doc, doc)[:, None], s, 0.0)
  o = jnp.einsum("bhij,bjhv->bihv", s, with_normalizer(v),
                 preferred_element_type=_F32)                   # [B, T, H, V+1]
  return divide(o, v.dtype, eps)
