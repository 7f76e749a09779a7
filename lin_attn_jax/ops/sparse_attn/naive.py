"""The Sparse Transformer's reference: dense attention under the pattern's
mask."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.softmax_attn.inputs import default_scale
from lin_attn_jax.ops.softmax_attn.parallel import masked_softmax_attention
from lin_attn_jax.ops.sparse_attn import patterns
from lin_attn_jax.ops.sparse_attn.inputs import validate


def sparse_attn_reference(q, k, v, *, stride, pattern="strided",
                          summary_size=1, causal=True, scale=None,
                          segment_ids=None):
  """The dense masked form: ``[T, T]`` scores under ``sparse_attn_mask``.

  Arguments and result as in ``parallel_sparse_attn`` (without
  ``block_size``).
  """
  b, t, dk = validate(q, k, v, segment_ids, pattern, stride, summary_size)
  mask = jnp.asarray(patterns.sparse_attn_mask(
      t, pattern=pattern, stride=stride, summary_size=summary_size,
      causal=causal))
  if segment_ids is not None:
    doc = document_index(segment_ids, b, t)
    mask = mask[None] & same_document_mask(doc, doc)
  return masked_softmax_attention(q, k, v, mask,
                                  default_scale(scale, dk)).astype(v.dtype)
