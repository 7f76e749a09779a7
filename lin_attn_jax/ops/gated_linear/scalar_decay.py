"""Chunk outputs for a scalar decay per head: one ``[C, C]`` decay matrix.

With one log-decay per head and token (simple GLA, RetNet, Mamba-2's SSD,
and no decay at all), the decay between ``j`` and ``i`` does not depend on
the key channel, so the scores inside a chunk are a plain matmul times a
``[C, C]`` decay matrix per head, as in Mamba-2's SSD algorithm
(https://arxiv.org/abs/2405.21060, section 7):

    o_i = sum_{j <= i, same document} (q_i . k_j) exp(sum_{j < m <= i} g_m) v_j
          + [no document starts in the chunk up to i]
            exp(sum_{m <= i} g_m) q_i . S

The pairwise sums are exact sums of their own terms (a constant 0/1 matrix
times the gates: no difference of prefix sums, and the gradient reaches
``g_m`` only through the pairs that span ``m``), the mask is applied before
``exp`` (every exponent is ``<= 0``), and the diagonal has decay 1 with no
gate in it. No secondary chunking is needed: it exists for the ``[c, c, K]``
factors of a per-channel decay. Heads go before positions for the matmuls.

Letters: b batch, n chunk, h head, i and j position in the chunk, k key
channel, v value channel, p a pair ``(i, j)``, m a position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def chunk_pairwise_sums(g):
  """``out[..., i, j] = sum_{j < m <= i} g[..., m]`` (0 for ``j >= i``).

  One matmul with a constant 0/1 matrix ``[C * C, C]``: each entry is a sum
  of its own terms only, accumulated in float32.
  """
  chunk = g.shape[-1]
  i, j, m = np.ogrid[:chunk, :chunk, :chunk]
  spans = ((j < m) & (m <= i)).astype(np.float32).reshape(chunk * chunk, chunk)
  out = jnp.einsum("...m,pm->...p", g, jnp.asarray(spans),
                   precision=jax.lax.Precision.HIGHEST,
                   preferred_element_type=_F32)
  return out.reshape(g.shape[:-1] + (chunk, chunk))


def scalar_decay_outputs(q_c, k_c, v_c, g_c, doc_c, doc_before, entering, *,
                         packed=True):
  """Outputs of every chunk given the state entering it (scalar decay).

  Args:
    q_c, k_c: ``[B, N, C, H, K]`` (q scaled); v_c: ``[B, N, C, H, V]``;
    g_c: ``[B, N, C, H, 1]``; doc_c: ``[B, N, C]`` document index;
    doc_before: ``[B, N]`` document of the token before each chunk;
    entering: ``[B, N, H, K, V]`` state entering each chunk.
    packed: whether there are several documents.
  Returns:
    ``o [B, N, C, H, V]`` float32.
  """
  chunk = q_c.shape[2]
  q, k, v = (jnp.moveaxis(x, 3, 2) for x in (q_c, k_c, v_c))   # [B,N,H,C,*]
  g = jnp.moveaxis(g_c[..., 0], 3, 2)                           # [B,N,H,C]
  mask = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))         # [i, j]
  if packed:
    same_doc = doc_c[:, :, :, None] == doc_c[:, :, None, :]     # [B,N,i,j]
    mask = mask & same_doc[:, :, None]                          # [B,N,1,i,j]
  decay = jnp.exp(jnp.where(mask, chunk_pairwise_sums(g), -jnp.inf))  # [B,N,H,i,j]
  scores = _mm("bnhik,bnhjk->bnhij", q, k) * decay
  o = _mm("bnhij,bnhjv->bnhiv", scores, v)                      # [B,N,H,C,V]
  from_start = jnp.cumsum(g, axis=3)[..., None]                 # [B,N,H,C,1]
  reached = (doc_c == doc_before[..., None])[:, :, None, :, None]
  q_read = jnp.where(reached, q * jnp.exp(from_start), 0.0)     # [B,N,H,C,K]
  o = o + _mm("bnhik,bnhkv->bnhiv", q_read, entering)
  return jnp.moveaxis(o, 2, 3)                                  # [B,N,C,H,V]
