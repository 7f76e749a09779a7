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


def sum_strictly_between(x, axis: int):
  """``out[..., s, r, ...] = sum_{r < m < s} x[..., m, ...]`` over ``axis``.

  For a short axis (sub-chunks of one chunk): an explicit masked sum, so each
  entry is summed from its own terms only. The new axes ``s, r`` replace
  ``axis``.
  """
  x = jnp.moveaxis(x, axis, -1)  # [..., M]
  n = x.shape[-1]
  idx = jnp.arange(n)
  between = ((idx[None, None, :] > idx[None, :, None])
             & (idx[None, None, :] < idx[:, None, None]))  # [s, r, m]
  out = jnp.sum(jnp.where(between, x[..., None, None, :], 0.0), axis=-1)
  return jnp.moveaxis(out, (-2, -1), (axis, axis + 1))


def reverse_exclusive_cumsum(x, axis: int):
  """``out[m] = sum_{m' > m} x[m']`` along ``axis``."""
  inclusive = jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis=axis), axis)
  shifted = jnp.moveaxis(jnp.moveaxis(inclusive, axis, 0)[1:], 0, axis)
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, 1)
  return jnp.pad(shifted, widths)


def pairwise_sums(x, axis: int):
  """``out[..., i, j, ...] = sum_{j < m <= i} x[..., m, ...]`` for ``j <= i``.

  For a short axis (a sub-chunk): one matmul with a constant 0/1 tensor, so
  each entry is a sum of its own terms (exact relative to the result, unlike
  ``cumsum[i] - cumsum[j]``) and the gradient reaches ``x_m`` only through
  the pairs that span m. Entries with ``j > i`` are 0: mask them before any
  ``exp``. The new axes ``i, j`` replace ``axis``.
  """
  n = x.shape[axis]
  idx = jnp.arange(n)
  spans = ((idx[None, None, :] > idx[None, :, None])
           & (idx[None, None, :] <= idx[:, None, None])).astype(x.dtype)
  x = jnp.moveaxis(x, axis, -1)                                 # [..., m]
  out = jnp.einsum("...m,ijm->...ij", x, spans,
                   precision=jax.lax.Precision.HIGHEST)
  return jnp.moveaxis(out, (-2, -1), (axis, axis + 1))
