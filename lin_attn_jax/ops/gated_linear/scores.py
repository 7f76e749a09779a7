"""Decay-weighted score matrices over a whole sequence, for the quadratic forms.

``decay_scores(x, y, g, mask)`` is ``x_i . (exp(G_i - G_j) * y_j)``: i reads
the state after its own token; with ``strict=True`` it is ``x_i .
(exp(G_{i-1} - G_j) * y_j)`` for ``j < i``: i reads the state before its
token (RWKV-6's output, RWKV-7's state read). The whole sequence is treated
as one chunk of the chunk form's intra-chunk stage (``chunk.py``, steps 1
and 2): log-decays are summed inside sub-chunks and over whole sub-chunks,
never as differences of sums, and every ``exp`` is of a sum of gates <= 0. That keeps per-channel decays accurate near the diagonal with
strong gates, where a difference of two long prefix sums would lose digits.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import pad_time, split_chunks
from lin_attn_jax.ops.gated_linear.chunk import (_intra_chunk_scores,
                                                 _sub_chunk_log_decays)


def decay_scores(x, y, g, mask, *, strict=False, sub_chunk_size=16):
  """Causal decay-weighted scores where ``mask``, else 0.

  Args:
    x, y: ``[B, T, H, K]`` float32; g: ``[B, T, H, G]`` log-decay (``G`` 1
      or ``K``); mask: ``[B, 1 or H, T, T]`` bool.
    strict: read the state before token i (0 on the diagonal).
    sub_chunk_size: tokens per sub-chunk of the decay factors (speed only).
  Returns:
    ``[B, H, T, T]``.
  """
  t = x.shape[1]
  c = min(sub_chunk_size, t)
  padded = -(-t // c) * c

  def one_chunk(z):                                             # [B,1,S,c,...]
    return split_chunks(split_chunks(pad_time(z, c), padded), c, axis=2)

  decays = _sub_chunk_log_decays(one_chunk(g))
  scores = _intra_chunk_scores(one_chunk(x), one_chunk(y), decays,
                               strict=strict)                   # [B,1,H,Tp,Tp]
  return jnp.where(mask, scores[:, 0, :, :t, :t], 0.0)
