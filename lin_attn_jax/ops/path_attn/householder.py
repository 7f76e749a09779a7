"""Products of Householder-like reflections over a block of tokens.

For a block of ``C`` tokens with ``H_s = I - beta_s w_s w_s^T`` (rows ``w_s``
of ``W [C, K]``), the UT transform writes the block's product as

    H_C H_{C-1} ... H_1 = I - W^T R,    R = (I + A)^{-1} diag(beta) W,
    A = strictly_lower(diag(beta) W W^T)           (A_ij = beta_i w_i . w_j)

(``R``'s row ``r_s`` depends only on the tokens up to ``s``, so ``H_i ...
H_1 = I - sum_{s <= i} w_s r_s^T``). With the same inverse, a key moved to
the end of its block and a query moved back to the start of its block are

    H_C ... H_{j+1} k_j = k_j - sum_n (T U)_nj w_n,
        U_sj = beta_s w_s . k_j for s > j (0 otherwise),  T = (I + A)^{-1}
    q_i^T H_i ... H_1 = q_i^T - sum_{s <= i} (q_i . w_s) r_s^T

and the logits inside the block, ``q_i^T H_i ... H_{j+1} k_j`` for ``j <=
i``, are ``q_i . k_j - sum_{n <= i} (q_i . w_n) (T U)_nj``. One
unit-lower-triangular solve per block (``solve_unit_lower``: matmuls, no
LAPACK) gives ``R`` and ``T U`` together. The derivation is in this
folder's README.md.

Letters: h key/value head, g query head in its group, i query row, j key
column, n and s tokens of the block, k and l key channels.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.delta_rule.chunk import solve_unit_lower

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def block_transforms(q, k, w, beta):
  """The UT transform of each block and what the attention needs of it.

  Args:
    q: ``[..., h, g, C, K]`` queries; k, w: ``[..., h, C, K]``; beta:
      ``[..., h, C]``; all float32. A token with ``beta = 0`` (padding) is
      the identity.
  Returns:
    ``(q_start [..., h, g, C, K], k_end [..., h, C, K], r [..., h, C, K],
    logits [..., h, g, C, C])``: every query moved back to the block's
    start, every key moved to the block's end, the rows of ``R`` (the
    block's product is ``I - W^T R``), and the logits ``q_i^T H_i ...
    H_{j+1} k_j``, valid for ``j <= i`` (the rest is not zero: mask it).
  """
  c, dk = w.shape[-2], w.shape[-1]
  strictly_lower = jnp.tril(jnp.ones((c, c), bool), -1)
  bw = beta[..., None] * w                                      # [..., h,C,K]
  a = jnp.where(strictly_lower, _mm("...ik,...jk->...ij", bw, w), 0.0)
  u = jnp.where(strictly_lower, _mm("...sk,...jk->...sj", bw, k), 0.0)
  solved = solve_unit_lower(a, jnp.concatenate([bw, u], axis=-1))
  r, tu = solved[..., :dk], solved[..., dk:]                    # [..,C,K/C]
  k_end = k - _mm("...nj,...nk->...jk", tu, w)                  # [..., h,C,K]
  lower = jnp.tril(jnp.ones((c, c), bool))
  qw = jnp.where(lower, _mm("...hgik,...hnk->...hgin", q, w), 0.0)
  q_start = q - _mm("...hgin,...hnk->...hgik", qw, r)           # [..,h,g,C,K]
  logits = (_mm("...hgik,...hjk->...hgij", q, k)
            - _mm("...hgin,...hnj->...hgij", qw, tu))           # [..,h,g,C,C]
  return q_start, k_end, r, logits


def cross_block(x, w, r):
  """``x`` (rows ``[..., C', K]``, queries or keys as row vectors) times a
  block's product ``I - W^T R``: ``x - (x W^T) R``. Carries a query back
  across a block (``q^T H_C ... H_1``); for keys (column vectors) use
  ``cross_block_keys``."""
  return x - _mm("...in,...nk->...ik", _mm("...ik,...nk->...in", x, w), r)


def cross_block_keys(x, w, r):
  """Keys (rows ``[..., C', K]``) moved across a block: ``(I - W^T R) x_j``
  for each row, i.e. ``x - (x R^T) W``."""
  return x - _mm("...in,...nk->...ik", _mm("...ik,...nk->...in", x, r), w)


def exclusive_suffix_sums(g, axis: int):
  """``sum_{s > j} g_s`` along ``axis``: the gate between each token and
  the end of its block (a sum of log-gates, no difference of sums)."""
  flipped = jnp.flip(g, axis)
  inclusive = jnp.cumsum(flipped, axis=axis)
  shifted = jnp.concatenate(
      [jnp.zeros_like(jnp.take(inclusive, jnp.arange(1), axis=axis)),
       jnp.take(inclusive, jnp.arange(g.shape[axis] - 1), axis=axis)],
      axis=axis)
  return jnp.flip(shifted, axis)
