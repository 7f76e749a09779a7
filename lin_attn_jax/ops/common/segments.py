"""Packed documents: ``segment_ids`` to reset flags and document indices.

A state reset happens at every position whose id differs from the previous
position's id. Position 0 never resets: ``initial_state`` belongs to the
first document of each row. Ids need not be sorted or distinct across
documents (``[0, 0, 1, 1, 0]`` is three documents).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time, split_chunks


def reset_flags(segment_ids, batch: int, length: int):
  """``[B, T]`` bool: True where a new document starts (never at t = 0)."""
  if segment_ids is None:
    return jnp.zeros((batch, length), dtype=bool)
  ids = jnp.asarray(segment_ids)
  changed = ids[:, 1:] != ids[:, :-1]
  return jnp.concatenate([jnp.zeros((batch, 1), dtype=bool), changed], axis=1)



def scan_tokens(step, inputs, state, segment_ids):
  """``lax.scan`` of ``step(state, inputs_t) -> (state, o_t)`` over T, with
  the state zeroed where a document starts (the naive forms' loop).

  Args:
    step: the recurrence at one token; ``inputs_t`` holds every input at
      that token, float32 ``[B, ...]``.
    inputs: ``[B, T, ...]`` arrays.
    state: the state before the first token, float32 ``[B, ...]``.
    segment_ids: ``[B, T]`` int or None.
  Returns:
    ``(o [B, T, ...] float32, final state)``.
  """
  bs, t = inputs[0].shape[:2]

  def body(state, xs):
    *inputs_t, reset_t = xs                                     # [B, ...], [B]
    reset_t = reset_t.reshape((bs,) + (1,) * (state.ndim - 1))
    return step(jnp.where(reset_t, 0.0, state), tuple(inputs_t))

  time_major = [jnp.moveaxis(jnp.asarray(x, jnp.float32), 1, 0)
                for x in inputs]                                # [T, B, ...]
  state, o = jax.lax.scan(
      body, state, (*time_major, reset_flags(segment_ids, bs, t).T))
  return jnp.moveaxis(o, 0, 1), state

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
