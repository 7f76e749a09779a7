"""Top-k block selection of the blockwise forms, one tile of queries at a
time.

Per query, the gates ``q . mean(k_block)`` of the full blocks of its
document that end before its own block starts, and the indices of the
``top_k - 1`` largest (``jax.lax.top_k``: of equal gates, the lower index,
i.e. the earlier block). The gates are float32 and carry no gradient. A
tile of ``c`` queries holds ``[c, H, NF]`` gates at once, so memory is
``O(c H T / C)`` whatever the length, and the result ``O(T H k)``.

Letters: b batch, i query in a tile, h key/value head, g query head in a
group, n full block, k key channel, r selected block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def select_blocks(q, means, first, doc_of, q_doc, q_start, *, top_k: int,
                  chunk: int):
  """The past blocks each query head selects.

  Args:
    q: ``[B, R, H, K]`` queries, ``R`` a multiple of ``chunk``.
    means: ``[B, NF, Hkv, K]`` the mean key of every full block.
    first, doc_of: ``[B, NF]`` each full block's first position and
      document (``blocks.full_blocks``).
    q_doc, q_start: ``[B, R]`` each query's document and block start (a
      padding row has block start -1: it selects nothing).
    top_k: MoBA's ``k`` (>= 2 here); ``chunk``: queries per tile.
  Returns:
    ``[B, R, H, n]`` int32 full-block indices (-1: none), ``n = min(top_k
    - 1, NF)``.
  """
  b, r, h, dk = q.shape
  nf, hkv = means.shape[1], means.shape[2]
  g, n = h // hkv, min(top_k - 1, nf)
  means = jax.lax.stop_gradient(jnp.asarray(means, _F32))

  def tile(xs):
    q_t, doc_t, start_t = xs                      # [B, c, H, K], [B, c] x 2
    qg = q_t.reshape(b, chunk, hkv, g, dk)
    gate = jnp.einsum("bihgk,bnhk->bihgn", qg, means,
                      preferred_element_type=_F32)              # [B,c,h,g,NF]
    past = ((doc_of[:, None, :] == doc_t[:, :, None])
            & (first[:, None, :] < start_t[:, :, None]))        # [B, c, NF]
    gate = jnp.where(past[:, :, None, None], gate, -jnp.inf)
    values, index = jax.lax.top_k(gate, n)                      # [B,c,h,g,n]
    picked = jnp.where(jnp.isfinite(values), index, -1)
    return picked.reshape(b, chunk, h, n).astype(jnp.int32)

  def tiles(x):                                 # [B, R, ...] -> [N, B, c, ...]
    return jnp.moveaxis(x.reshape((b, r // chunk, chunk) + x.shape[2:]), 1, 0)

  q = jax.lax.stop_gradient(jnp.asarray(q, _F32))
  picked = jax.lax.map(tile, (tiles(q), tiles(q_doc), tiles(q_start)))
  return jnp.moveaxis(picked, 0, 1).reshape(b, r, h, n)         # [B, R, H, n]
