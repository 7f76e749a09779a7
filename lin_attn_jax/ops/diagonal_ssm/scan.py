"""Shared stages of the diagonal-SSM forms.

All of them compute ``h_t = a_t * h_{t-1} + b_t`` along the time axis of
``[B, T, ...]`` arrays (any trailing shape, real or complex). A document
boundary is a zero ``a_t``: the callers multiply ``a`` by ``keep`` (0 where a
new document starts), so the state entering a document is dropped exactly and
no gradient flows through it. Products of the ``a_t`` are formed directly,
never as ``exp`` of a difference of cumulative logs, so decays that underflow
give exact zeros instead of ``inf - inf``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                              split_chunks)
from lin_attn_jax.ops.common.segments import reset_flags


def keep_flags(segment_ids, batch: int, length: int):
  """``[B, T]`` float32: 0 where a new document starts, 1 elsewhere."""
  return 1.0 - reset_flags(segment_ids, batch, length).astype(jnp.float32)


def expand_like(flags, x):
  """``[B, T]`` -> broadcastable against ``x: [B, T, ...]``."""
  return flags.reshape(flags.shape + (1,) * (x.ndim - flags.ndim))


def combine(earlier, later):
  """Composes two affine maps ``h -> a h + b``: ``earlier``, then ``later``."""
  a1, b1 = earlier
  a2, b2 = later
  return a1 * a2, a2 * b1 + b2


def associative_linear_scan(a, b, initial_state=None):
  """All states of ``h_t = a_t h_{t-1} + b_t`` by a parallel prefix scan.

  Args:
    a, b: ``[B, T, ...]``.
    initial_state: ``h_{-1}``, ``[B, ...]``, or None for zeros.
  Returns:
    ``h``, shaped like ``b``.
  """
  if initial_state is not None:
    b = b.at[:, 0].add(a[:, 0] * initial_state)
  _, h = jax.lax.associative_scan(combine, (a, b), axis=1)
  return h


def chunked_linear_scan(a, b, initial_state, chunk_size: int):
  """All states, chunk by chunk: ``(h [B, T, ...], h_T [B, ...])``.

  1. Inside every chunk, all chunks at once: a ``lax.scan`` over the ``C``
     positions of a chunk, from a zero state, gives the local states and the
     products of ``a`` since the chunk start (each step works on one token
     of every chunk, ``[B, T / C, ...]``).
  2. Between chunks: a ``lax.scan`` over the ``T / C`` chunk ends carries
     the state entering each chunk.
  3. ``h = local + product * entering``.

  ``T / C + C`` sequential steps instead of ``T``, and one pass over the
  data per stage (an associative scan makes ``O(log C)`` passes, which on
  CPU costs more than it saves). The padding at the end has ``a = 1, b = 0``,
  so the last state is ``h_T``.
  """
  length = a.shape[1]
  chunk = min(chunk_size, length)
  pad = (-length) % chunk
  if pad:
    a = jnp.concatenate([a, jnp.ones((a.shape[0], pad) + a.shape[2:], a.dtype)],
                        axis=1)
  b = pad_time(b, chunk)
  # Position in the chunk first: [C, B, N, ...].
  a_c = jnp.moveaxis(split_chunks(a, chunk), 2, 0)
  b_c = jnp.moveaxis(split_chunks(b, chunk), 2, 0)

  def within(carry, ab):
    prod, local = carry
    a_t, b_t = ab
    prod, local = a_t * prod, a_t * local + b_t
    return (prod, local), (prod, local)

  zeros = jnp.zeros_like(b_c[0])
  _, (prod, local) = jax.lax.scan(within, (jnp.ones_like(a_c[0]), zeros),
                                  (a_c, b_c))                  # [C, B, N, ...]

  def across(state, ends):
    prod_end, local_end = ends                                 # [B, ...]
    return prod_end * state + local_end, state

  final, entering = jax.lax.scan(
      across, initial_state,
      (jnp.moveaxis(prod[-1], 1, 0), jnp.moveaxis(local[-1], 1, 0)))
  h = local + prod * jnp.moveaxis(entering, 0, 1)[None]         # [C, B, N, ...]
  return merge_chunks(jnp.moveaxis(h, 0, 2))[:, :length], final
