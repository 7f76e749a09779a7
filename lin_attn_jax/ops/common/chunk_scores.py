"""Intra-chunk score matrices for the forms that need them explicitly.

The delta-rule chunk forms (WY representation) solve a triangular system in
the ``[C, C]`` matrix of key-key scores of each chunk, so unlike the
gated-linear-attention chunk form they cannot stream the intra-chunk part;
these stages build the matrices

    A[i, j] = x_i . (exp(G_i - G_j) * y_j)          j <= i
    A[i, j] = x_i . (exp(G_{i-1} - G_j) * y_j)      j < i   (strict)

(the strict kind reads the state before token i: RWKV-6's output, RWKV-7's
state read) for a log-decay ``g`` that is a scalar per head or one per key
channel. A scalar decay gives the ``[C, C]`` factor ``exp(sum_{j < m <= i}
g_m)`` directly (``segsum``). A decay per key channel would need a ``[C, C,
K]`` factor, so each chunk is cut into sub-chunks of ``c`` tokens:

- same sub-chunk: the ``[c, c, K]`` factor ``exp(sum_{j < m <= i} g_m)``,
  each exponent summed from its own gates (``segsum``) and -inf above the
  diagonal before ``exp``; the diagonal (the sub-diagonal when strict) is an
  empty sum, exactly 0 with no gradient;
- sub-chunk s after sub-chunk r: ``exp(G_i - G_j)`` factors into the decay
  from the start of s to i, the decay of the whole sub-chunks strictly
  between, and the decay after j to the end of r.

Every factor is ``exp`` of a sum of gates <= 0, so strong gates underflow to
0 where the true value is negligible and never overflow, and no sum is the
difference of two others: such a difference is exact in value where it is
0, but its gradient is two large terms that cancel only up to rounding,
which swamps the small gradients of strong gates.

Letters: b batch, n chunk, s and r sub-chunk, i and j position in a
sub-chunk, h head, k key channel, g gate width (1 or K).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                             split_chunks)
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum, segsum

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def exclusive_local(local):
  """Log-decay from the sub-chunk start to i - 1: ``local`` shifted by one."""
  return jnp.concatenate([jnp.zeros_like(local[:, :, :, :1]),
                          local[:, :, :, :-1]], axis=3)


class SubChunkDecays(NamedTuple):
  """Log-decays of gates ``g_s: [B, N, S, c, H, G]``, each summed directly."""
  gates: jax.Array        # [B,N,S,c,H,G] g itself
  local: jax.Array        # [B,N,S,c,H,G] sub-chunk start to i, inclusive
  to_sub_end: jax.Array   # [B,N,S,c,H,G] after i to the sub-chunk end
  sub_total: jax.Array    # [B,N,S,H,G]   each whole sub-chunk
  before_sub: jax.Array   # [B,N,S,H,G]   whole sub-chunks before s in its chunk
  after_sub: jax.Array    # [B,N,S,H,G]   whole sub-chunks after s
  chunk_total: jax.Array  # [B,N,H,G]


def sub_chunk_log_decays(g_s) -> SubChunkDecays:
  """The log-decays of ``g_s: [B, N, S, c, H, G]``."""
  sub_total = jnp.sum(g_s, axis=3)                              # [B,N,S,H,G]
  before_sub = jnp.concatenate(
      [jnp.zeros_like(sub_total[:, :, :1]),
       jnp.cumsum(sub_total, axis=2)[:, :, :-1]], axis=2)    # [B,N,S,H,G]
  return SubChunkDecays(
      gates=g_s, local=jnp.cumsum(g_s, axis=3),
      to_sub_end=reverse_exclusive_cumsum(g_s, axis=3),
      sub_total=sub_total, before_sub=before_sub,
      after_sub=reverse_exclusive_cumsum(sub_total, axis=2),
      chunk_total=jnp.sum(sub_total, axis=2))


def _sum_strictly_between(x, axis: int):
  """``out[..., s, r, ...] = sum_{r < m < s} x[..., m, ...]`` over ``axis``.

  An explicit masked sum over a short axis (the sub-chunks of one chunk), so
  each entry is summed from its own terms only.
  """
  x = jnp.moveaxis(x, axis, -1)                                 # [..., M]
  idx = jnp.arange(x.shape[-1])
  between = ((idx[None, None, :] > idx[None, :, None])
             & (idx[None, None, :] < idx[:, None, None]))        # [s, r, m]
  out = jnp.sum(jnp.where(between, x[..., None, None, :], 0.0), axis=-1)
  return jnp.moveaxis(out, (-2, -1), (axis, axis + 1))


def _pair_sums(g, axis, strict):
  """``sum_{j < m <= i} g_m`` (``j < m < i`` when strict) over ``axis``.

  Returns the ``[..., i, j]`` sums (``axis`` moved before them) with -inf
  where the sum is empty of pairs (above the diagonal, and on it when
  strict); the diagonal (sub-diagonal when strict) is an empty sum, 0
  without a gradient.
  """
  pair = segsum(g, axis=axis)
  if strict:
    pair = jnp.concatenate([jnp.full_like(pair[..., :1, :], -jnp.inf),
                            pair[..., :-1, :]], axis=-2)
  return pair


def _scalar_decay_scores(x, y, g_s, strict):
  """A scalar decay per head needs no sub-chunks: ``(x y^T) * exp(pairs)``."""
  x, y, g = (merge_chunks(z, axis=2) for z in (x, y, g_s))      # [B,N,C,H,*]
  decay = jnp.exp(_pair_sums(g[..., 0], 2, strict))             # [B,N,H,C,C]
  return _mm("bnihk,bnjhk->bnhij", x, y) * decay


def intra_chunk_scores(x, y, decays: SubChunkDecays, strict=False):
  """Causal decay-weighted scores inside each chunk, ``[B, N, H, C, C]``.

  Args:
    x, y: ``[B, N, S, c, H, K]`` float32 (queries and keys).
    decays: ``sub_chunk_log_decays`` of the gates.
    strict: row i reads the state before token i (0 on the diagonal).
  """
  b, n, subs, c, h, _ = x.shape
  if decays.local.shape[-1] == 1:
    return _scalar_decay_scores(x, y, decays.gates, strict)
  x_local = exclusive_local(decays.local) if strict else decays.local
  # Same sub-chunk; when strict, row i takes row i - 1.
  decay = jnp.exp(_pair_sums(decays.gates, 3, strict))  # [B,N,S,H,K,i,j]
  diag = jnp.einsum("bnsihk,bnsjhk,bnshkij->bnhsij", x, y, decay)
  # Sub-chunk s after r.
  x_from_start = x * jnp.exp(x_local)                           # [B,N,S,c,H,K]
  y_to_end = y * jnp.exp(decays.to_sub_end)                     # [B,N,S,c,H,K]
  between = _sum_strictly_between(decays.sub_total, axis=2)     # [B,N,s,r,H,G]
  later = (jnp.arange(subs)[:, None] > jnp.arange(subs)[None, :])
  between = jnp.exp(jnp.where(later[:, :, None, None], between, -jnp.inf))
  off = _mm("bnsihk,bnsrhk,bnrjhk->bnhsirj", x_from_start, between, y_to_end)
  eye = jnp.eye(subs, dtype=_F32)[:, None, :, None]             # [s, i, r, j]
  scores = off + diag[:, :, :, :, :, None, :] * eye     # [B,N,H,s,i,r,j]
  return scores.reshape(b, n, h, subs * c, subs * c)


def sequence_scores(x, y, g, mask, *, strict=False, sub_chunk_size=8):
  """``intra_chunk_scores`` over a whole sequence taken as one chunk.

  Args:
    x, y: ``[B, T, H, K]`` float32; g: ``[B, T, H, G]`` log-decay;
      mask: ``[B, 1 or H, T, T]`` bool.
    strict: row i reads the state before token i.
    sub_chunk_size: tokens per sub-chunk (speed only).
  Returns:
    ``[B, H, T, T]``, 0 where ``mask`` is False.
  """
  t = x.shape[1]
  c = min(sub_chunk_size, t)
  padded = -(-t // c) * c

  def one_chunk(z):                                             # [B,1,S,c,...]
    return split_chunks(split_chunks(pad_time(z, c), padded), c, axis=2)

  scores = intra_chunk_scores(one_chunk(x), one_chunk(y),
                              sub_chunk_log_decays(one_chunk(g)),
                              strict=strict)                    # [B,1,H,Tp,Tp]
  return jnp.where(mask, scores[:, 0, :, :t, :t], 0.0)
