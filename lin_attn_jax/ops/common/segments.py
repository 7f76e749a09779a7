"""Packed documents: ``segment_ids`` to reset flags and document indices.

A state reset happens at every position whose id differs from the previous
position's id. Position 0 never resets: ``initial_state`` belongs to the
first document of each row. Ids need not be sorted or distinct across
documents (``[0, 0, 1, 1, 0]`` is three documents).
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time, split_chunks


def reset_flags(segment_ids, batch: int, length: int):
  """``[B, T]`` bool: True where a new document starts (never at t = 0)."""
  if segment_ids is None:
    return jnp.zeros((batch, length), dtype=bool)
  ids = jnp.asarray(segment_ids)
  changed = ids[:, 1:] != ids[:, :-1]
  return jnp.concatenate([jnp.zeros((batch, 1), dtype=bool), changed], axis=1)


def document_index(segment_ids, batch: int, length: int):
  """``[B, T]`` int32: how many resets happened up to and including t.

  Two positions belong to the same document iff their indices are equal.
  """
  return jnp.cumsum(reset_flags(segment_ids, batch, length).astype(jnp.int32),
                    axis=1)


def same_document_mask(doc_q, doc_k):
  """``[..., Tq, Tk]`` bool from ``[..., Tq]`` and ``[..., Tk]`` indices."""
  return doc_q[..., :, None] == doc_k[..., None, :]


def chunk_documents(segment_ids, batch: int, length: int, chunk: int):
  """Document indices per chunk from ``[B, T]`` segment ids, or None.

  Returns:
    ``(doc_c [B, N, C], doc_before [B, N])``: the document of every token
    (T padded to a multiple of ``chunk`` with the last document) and of the
    token before each chunk; None without segment ids.
  """
  if segment_ids is None:
    return None
  doc = pad_time(document_index(segment_ids, batch, length), chunk,
                 mode="edge")
  doc_before = jnp.concatenate([jnp.zeros((batch, 1), doc.dtype),
                                doc[:, :-1]], axis=1)[:, ::chunk]  # [B, N]
  return split_chunks(doc, chunk), doc_before
