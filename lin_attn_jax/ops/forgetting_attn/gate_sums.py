"""Sums of the log forget gate: per token, and per pair of tokens.

The decay bias of query ``i`` on key ``j <= i`` is ``D_ij = sum_{l = j + 1
.. i} g_l = c_i - c_j`` with ``c_t = sum_{l <= t} g_l``. Only pairs in one
document are ever attended, so ``c`` restarts at every document start: the
difference is the same, and ``|c|`` stays bounded by one document's gates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import reset_flags

_F32 = jnp.float32


def gate_cumsum(g, segment_ids=None):
  """``c [B, T, H]`` float32: the inclusive sum of ``g [B, T, H]`` from the
  start of each token's document.

  Float32 whatever g's dtype. ``c_i - c_j`` is then exact to about ``eps *
  |c_i|`` (``eps = 2^-24``): relative to the document's gate mass so far,
  not to the difference (``pair_sums`` is exact relative to it).
  """
  g = jnp.asarray(g, _F32)
  if segment_ids is None:
    return jnp.cumsum(g, axis=1)
  b, t = g.shape[:2]
  starts = jnp.broadcast_to(reset_flags(segment_ids, b, t)[..., None],
                            g.shape)                            # [B, T, H]

  def combine(left, right):
    left_start, left_sum = left
    right_start, right_sum = right
    return (left_start | right_start,
            jnp.where(right_start, right_sum, left_sum + right_sum))

  return jax.lax.associative_scan(combine, (starts, g), axis=1)[1]


def pair_sums(g):
  """``D [B, H, T, T]`` float32: ``D_ij = sum_{l = j + 1 .. i} g_l`` for
  ``j <= i`` (0 on the diagonal), ``-inf`` for ``j > i``.

  Each entry is its own sum of gates (a cumulative sum over ``l`` of the
  gates with ``l > j``), so it is exact relative to itself, however long the
  sequence. ``[T, T]`` per head: the reference form's.
  """
  g = jnp.moveaxis(jnp.asarray(g, _F32), 1, 2)                  # [B, H, T]
  t = g.shape[-1]
  later = jnp.tril(jnp.ones((t, t), bool), -1)                  # l > j
  terms = jnp.where(later, g[..., :, None], 0.0)                # [B,H,l,j]
  sums = jnp.cumsum(terms, axis=-2)                             # [B,H,i,j]
  causal = jnp.tril(jnp.ones((t, t), bool))
  return jnp.where(causal, sums, -jnp.inf)
