"""Chunkwise form: exact scores inside a chunk, states passed between chunks.

The sequence is cut into chunks of ``C`` tokens, each chunk into sub-chunks
of ``c`` tokens (secondary chunking). Four steps, one einsum each:

1. Log-decays: cumulative sums local to each sub-chunk (``L``), the sums
   from each token to its sub-chunk's end, the total of each sub-chunk, and
   sums over whole sub-chunks between two sub-chunks. Each is summed from
   its own gates: no sum is ever subtracted from another.
2. Scores inside a chunk, ``A[i, j] = q_i . (exp(G_i - G_j) * k_j)``:
   - same sub-chunk: the ``[c, c, K]`` factor ``exp(sum_{j < m <= i} g_m)``
     with the exponent set to -inf above the diagonal before ``exp``;
   - sub-chunk s after sub-chunk r: ``exp(G_i - G_j)`` factors into
     ``exp(L_i)`` (start of s to i), ``exp(sum of sub-chunks strictly
     between)`` and ``exp(sum after j to the end of r)``. Every factor is a
     decay <= 1, so strong gates underflow to 0 where the true value is
     negligible, and never overflow.
3. Chunk states: each chunk's own contribution ``sum_j exp(G_end - G_j) k_j
   v_j^T``, then a ``lax.scan`` over chunks for the state entering each chunk.
4. Outputs: intra-chunk ``A v`` plus ``(q_i * exp(G_i)) . S_in``.

With ``strictly_causal=True`` (RWKV-6) the output at i reads the state
before token i: every query-side log-decay is the exclusive sum (up to
i - 1), the diagonal of each sub-chunk is masked out with the upper triangle,
and the rest is unchanged.

Segment ids enter as masks: a pair ``(i, j)`` counts only inside one
document, the entering state reaches ``i`` only if no document started in
the chunk before ``i``, and a token reaches the chunk's end state only if it
is in the chunk's last document.

Letters: b batch, n chunk, s and r sub-chunk, i and j position in a
sub-chunk (or chunk), h head, k key channel, v value channel, g gate width
(1 for a scalar decay per head, K for a decay per key channel).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.chunking import merge_chunks, pad_time, split_chunks
from lin_attn_jax.ops.common.decay import (reverse_exclusive_cumsum, segsum,
                                           sum_strictly_between)
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def _exclusive_local(local):
  """Log-decay from the sub-chunk start to i - 1: ``local`` shifted by one."""
  return jnp.concatenate([jnp.zeros_like(local[:, :, :, :1]),
                          local[:, :, :, :-1]], axis=3)


class SubChunkDecays(NamedTuple):
  """Step 1: log-decays of gates ``g_s: [B, N, S, c, H, G]``.

  Every field is a sum of gates taken directly, never the difference of two
  sums: such a difference is exactly 0 where it should be (the diagonal, the
  last token of a sub-chunk) but its gradient is two large terms that cancel
  only up to rounding, which swamps the small gradients of strong gates.
  """
  gates: jax.Array        # [B,N,S,c,H,G] g itself
  local: jax.Array        # [B,N,S,c,H,G] sub-chunk start to i, inclusive
  to_sub_end: jax.Array   # [B,N,S,c,H,G] after i to the sub-chunk end
  sub_total: jax.Array    # [B,N,S,H,G]   each whole sub-chunk
  before_sub: jax.Array   # [B,N,S,H,G]   whole sub-chunks before s in its chunk
  after_sub: jax.Array    # [B,N,S,H,G]   whole sub-chunks after s
  chunk_total: jax.Array  # [B,N,H,G]


def _sub_chunk_log_decays(g_s) -> SubChunkDecays:
  """Step 1 for ``g_s: [B, N, S, c, H, G]``."""
  local = jnp.cumsum(g_s, axis=3)                               # [B,N,S,c,H,G]
  sub_total = jnp.sum(g_s, axis=3)                              # [B,N,S,H,G]
  before_sub = jnp.concatenate(
      [jnp.zeros_like(sub_total[:, :, :1]),
       jnp.cumsum(sub_total, axis=2)[:, :, :-1]], axis=2)    # [B,N,S,H,G]
  return SubChunkDecays(
      gates=g_s, local=local,
      to_sub_end=reverse_exclusive_cumsum(g_s, axis=3),
      sub_total=sub_total, before_sub=before_sub,
      after_sub=reverse_exclusive_cumsum(sub_total, axis=2),
      chunk_total=jnp.sum(sub_total, axis=2))


def _intra_chunk_scores(q, k, decays: SubChunkDecays, strict=False):
  """Step 2: causal scores inside each chunk, ``[B, N, H, C, C]``.

  Args:
    q, k: ``[B, N, S, c, H, K]`` float32 (q already scaled).
    decays: step 1's log-decays.
    strict: q_i reads the state before token i: ``A[i, j] = q_i .
      (exp(G_{i-1} - G_j) * k_j)`` for ``j < i`` and 0 on the diagonal.
  """
  b, n, subs, c, h, dk = q.shape
  per_channel = decays.local.shape[-1] != 1
  q_local = _exclusive_local(decays.local) if strict else decays.local
  # Same sub-chunk: sum_{j < m <= i} g_m, -inf above the diagonal before exp;
  # when strict, row i takes row i - 1 (sum up to i - 1, -inf on the
  # diagonal, where the exponent would otherwise be -g_i >= 0).
  pair = segsum(decays.gates, axis=3)                           # [B,N,S,H,G,i,j]
  if strict:
    pair = jnp.concatenate([jnp.full_like(pair[..., :1, :], -jnp.inf),
                            pair[..., :-1, :]], axis=-2)
  decay = jnp.exp(pair)
  if per_channel:
    diag = jnp.einsum("bnsihk,bnsjhk,bnshkij->bnhsij", q, k, decay)
  else:
    diag = _mm("bnsihk,bnsjhk->bnhsij", q, k) * jnp.moveaxis(decay[..., 0, :, :],
                                                           3, 2)
  # Sub-chunk s after r: q_i exp(L_i), k_j exp(sum after j to the end of r),
  # and the decay of the sub-chunks strictly between, -inf unless s > r.
  q_from_start = q * jnp.exp(q_local)                           # [B,N,S,c,H,K]
  k_to_end = k * jnp.exp(decays.to_sub_end)                     # [B,N,S,c,H,K]
  between = sum_strictly_between(decays.sub_total, axis=2)      # [B,N,s,r,H,G]
  later = (jnp.arange(subs)[:, None] > jnp.arange(subs)[None, :])
  between = jnp.exp(jnp.where(later[:, :, None, None], between, -jnp.inf))
  if per_channel:
    off = _mm("bnsihk,bnsrhk,bnrjhk->bnhsirj", q_from_start, between, k_to_end)
  else:
    off = _mm("bnsihk,bnrjhk->bnhsirj", q_from_start, k_to_end)
    off = off * jnp.moveaxis(between[..., 0], -1, 2)[:, :, :, :, None, :, None]
  eye = jnp.eye(subs, dtype=_F32)[:, None, :, None]             # [s, i, r, j]
  scores = off + diag[:, :, :, :, :, None, :] * eye             # [B,N,H,s,i,r,j]
  return scores.reshape(b, n, h, subs * c, subs * c)


def chunk_gated_linear(q, k, v, g=None, *, scale=None, initial_state=None,
                       output_final_state=False, segment_ids=None,
                       chunk_size=64, sub_chunk_size=16,
                       strictly_causal=False):
  """Gated linear attention, chunkwise; the training path on every backend.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: natural-log decay ``<= 0``, ``[B, T, H]`` (scalar per head) or
      ``[B, T, H, K]`` (per key channel), or None (no decay).
    scale: query scale, ``K ** -0.5`` when None.
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk ``C`` (speed only, not results).
    sub_chunk_size: tokens per sub-chunk ``c``; must divide ``chunk_size``.
    strictly_causal: ``o_t = S_{t-1}^T q_t``, the state before token t
      (RWKV-6), instead of ``S_t^T q_t``. The final state is the same.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2, 16), -0.1)
    >>> o, s = chunk_gated_linear(q, k, v, g, output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 32))
  """
  b, t, h, dk, dv, g = validate(q, k, v, g, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  checks.check_chunk_size(sub_chunk_size, "sub_chunk_size")
  if chunk_size % min(sub_chunk_size, chunk_size):
    raise ValueError(f"sub_chunk_size ({sub_chunk_size}) must divide "
                     f"chunk_size ({chunk_size})")
  scale = default_scale(scale, dk)
  c = min(sub_chunk_size, chunk_size)
  # A sequence shorter than a chunk only needs enough whole sub-chunks.
  chunk = min(chunk_size, -(-t // c) * c)
  subs = chunk // c
  if g is None:
    g = jnp.zeros((b, t, h, 1), _F32)
  doc = document_index(segment_ids, b, t)                       # [B, T]

  out_dtype = v.dtype
  q, k, g, v = (pad_time(jnp.asarray(x, _F32), chunk) for x in (q, k, g, v))
  doc = pad_time(doc, chunk, mode="edge")
  n = q.shape[1] // chunk

  def sub_chunks(x):                                            # [B,N,S,c,...]
    return split_chunks(split_chunks(x, chunk), c, axis=2)

  q_s, k_s, g_s = sub_chunks(scale * q), sub_chunks(k), sub_chunks(g)

  # Step 1: log-decays local to sub-chunks and over whole sub-chunks.
  decays = _sub_chunk_log_decays(g_s)

  # Step 2: scores inside each chunk, masked to one document.
  doc_c = split_chunks(doc, chunk)                              # [B, N, C]
  scores = _intra_chunk_scores(q_s, k_s, decays,
                               strict=strictly_causal)          # [B,N,H,C,C]
  scores = jnp.where((doc_c[..., :, None] == doc_c[..., None, :])[:, :, None],
                     scores, 0.0)

  # Step 3: each chunk's own state, then the state entering every chunk.
  doc_before = jnp.concatenate([jnp.zeros((b, 1), doc.dtype), doc[:, :-1]],
                               axis=1)[:, ::chunk]              # [B, N]
  doc_last = doc_c[:, :, -1]                                    # [B, N]
  to_end = decays.to_sub_end + decays.after_sub[:, :, :, None]
  in_last_doc = (doc_c == doc_last[..., None])[..., None, None]  # [B,N,C,1,1]
  k_to_end = jnp.where(in_last_doc, merge_chunks(k_s * jnp.exp(to_end), axis=2),
                       0.0)                                     # [B,N,C,H,K]
  v_c = split_chunks(v, chunk)                                  # [B,N,C,H,V]
  own_state = _mm("bnjhk,bnjhv->bnhkv", k_to_end, v_c)          # [B,N,H,K,V]
  passes = (doc_last == doc_before)[..., None, None]            # [B, N, 1, 1]
  chunk_decay = jnp.where(passes, jnp.exp(decays.chunk_total), 0.0)  # [B,N,H,G]

  def carry_state(state, inputs):
    decay, own = inputs                                         # [B,H,G], [B,H,K,V]
    return decay[..., None] * state + own, state

  state0 = (jnp.zeros((b, h, dk, dv), _F32) if initial_state is None
            else jnp.asarray(initial_state, _F32))
  final_state, entering = jax.lax.scan(
      carry_state, state0,
      (jnp.moveaxis(chunk_decay, 1, 0), jnp.moveaxis(own_state, 1, 0)))
  entering = jnp.moveaxis(entering, 0, 1)                       # [B,N,H,K,V]

  # Step 4: outputs.
  q_local = (_exclusive_local(decays.local) if strictly_causal
             else decays.local)
  from_start = q_local + decays.before_sub[:, :, :, None]       # [B,N,S,c,H,G]
  reached = (doc_c == doc_before[..., None])[..., None, None]   # [B,N,C,1,1]
  q_from_start = jnp.where(
      reached, merge_chunks(q_s * jnp.exp(from_start), axis=2), 0.0)
  o = (_mm("bnhij,bnjhv->bnihv", scores, v_c)
       + _mm("bnihk,bnhkv->bnihv", q_from_start, entering))     # [B,N,C,H,V]
  o = merge_chunks(o)[:, :t]
  return o.astype(out_dtype), (final_state if output_final_state else None)
