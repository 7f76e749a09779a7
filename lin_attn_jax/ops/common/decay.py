"""Cumulative log-decays that stay exact where it matters.

Differences of a long cumulative sum lose precision (``G_i - G_j`` for two
values near -1e4 keeps only ~4 significant digits of the difference), so the
forms below never subtract two long prefix sums: ``segsum`` sums exactly the
terms between ``j`` and ``i``, and the chunk form works with sums local to a
sub-chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.chunking import merge_chunks, split_chunks


def segsum(x, axis: int = -1):
  """Pairwise segment sums ``out[..., i, j] = sum_{m=j+1}^{i} x[..., m]``.

  Args:
    x: ``[..., T]`` (``axis`` is moved last first).
  Returns:
    ``[..., T, T]`` with ``-inf`` where ``j > i`` (so ``exp`` of it is a
    causal decay matrix with exact zeros above the diagonal). The -inf is
    written before any ``exp``: entries above the diagonal never exist as
    positive exponents.
  """
  x = jnp.moveaxis(x, axis, -1)
  length = x.shape[-1]
  rows = jnp.broadcast_to(x[..., :, None], x.shape + (length,))  # [..., i, j] = x_i
  strictly_lower = jnp.tril(jnp.ones((length, length), dtype=bool), -1)
  sums = jnp.cumsum(jnp.where(strictly_lower, rows, 0.0), axis=-2)
  lower = jnp.tril(jnp.ones((length, length), dtype=bool))
  return jnp.where(lower, sums, -jnp.inf)


def reverse_exclusive_cumsum(x, axis: int):
  """``out[m] = sum_{m' > m} x[m']`` along ``axis``."""
  inclusive = jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis=axis), axis)
  shifted = jnp.moveaxis(jnp.moveaxis(inclusive, axis, 0)[1:], 0, axis)
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, 1)
  return jnp.pad(shifted, widths)


def pairwise_sums(x, axis: int):
  """``out[..., i, j, ...] = sum_{j < m <= i} x[..., m, ...]`` for ``j < i``.

  For a short axis (a block of tokens): a cumulative sum over i of ``x_i``
  masked to ``j < i``, so each entry is a sum of its own terms only (exact
  relative to the result, unlike ``cumsum[i] - cumsum[j]``) and the gradient
  reaches ``x_m`` only through the pairs that span m. Entries with
  ``j >= i`` are 0: mask them before any ``exp``. The new axes ``i, j``
  replace ``axis`` (i first).
  """
  n = x.shape[axis]
  x = jnp.moveaxis(x, axis, -1)                                 # [..., m]
  strict = jnp.tril(jnp.ones((n, n), dtype=bool), -1)           # [i, j]: j < i
  terms = jnp.where(strict, x[..., :, None], 0.0)               # [..., i, j]
  out = jnp.cumsum(terms, axis=-2)
  return jnp.moveaxis(out, (-2, -1), (axis, axis + 1))


def shift(x, d: int, axis: int):
  """``out[i] = x[i - d]`` along ``axis``, 0 for ``i < d``."""
  if d == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (d, 0)
  kept = jax.lax.slice_in_dim(x, 0, x.shape[axis] - d, axis=axis)
  return jnp.pad(kept, widths)


def chunk_log_decays(g_c, sub: int, axis: int):
  """Log-decay sums over each chunk of ``g_c`` (tokens of a chunk on
  ``axis``), summed in sub-chunks of ``sub`` tokens and then over whole
  sub-chunks, so no long prefix sum is subtracted from another.

  Returns:
    ``(to_here, to_end, total)``: from the chunk start to i (i included) and
    from after i to the chunk end, both shaped like ``g_c``, and the whole
    chunk (``axis`` removed).
  """
  axis = axis % g_c.ndim
  g_s = split_chunks(g_c, sub, axis=axis)                       # [.., S, c, ..]
  local = jnp.cumsum(g_s, axis=axis + 1)
  local_to_end = reverse_exclusive_cumsum(g_s, axis=axis + 1)
  sub_total = jax.lax.index_in_dim(local, sub - 1, axis=axis + 1)  # [.., S, 1, ..]
  before_sub = shift(jnp.cumsum(sub_total, axis=axis), 1, axis=axis)
  after_sub = reverse_exclusive_cumsum(sub_total, axis=axis)
  to_here = merge_chunks(local + before_sub, axis=axis)
  to_end = merge_chunks(local_to_end + after_sub, axis=axis)
  total = jnp.sum(sub_total, axis=(axis, axis + 1))
  return to_here, to_end, total
