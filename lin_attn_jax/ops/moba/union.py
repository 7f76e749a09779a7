"""Attention of each tile of queries to the union of the blocks it
selected, with an online softmax.

A tile holds ``c`` queries; per batch row and query head, the full blocks
that some query of the tile selected form its union (at most ``min(NF, c
(top_k - 1))`` blocks, listed in order). Round ``u`` of a loop attends the
tile's queries to the ``u``-th block of each union: one ``[c, C]`` score
block per row and head, masked to the queries that selected that block
(-inf before any ``exp``), folded into a running maximum, sum and output
(flash attention). The loop runs as many rounds as the largest union of
the tile over rows and heads (a data-dependent trip count), so the work is

    sum over tiles of  max_{b, h} |union|  x  B H c C (K + V)

multiply-adds: ``(top_k - 1) T C (K + V)`` per row and head when the
queries of a tile agree, ``min(NF, c (top_k - 1))`` rounds per tile at
worst.

The backward pass (``custom_vjp``) keeps only ``o`` and the log-sum-exp and
recomputes each round's probabilities; the gradients of the blocks'
keys and values are added into ``[B, NF, C, Hkv, *]`` buffers. No array
grows faster than ``T``. The output and log-sum-exp merge with the
own-block pass (``softmax_attn.blocksparse.merge_passes``), so the
backward takes a cotangent of the log-sum-exp too.

Letters: b batch, h query head, i query in a tile, j key in a block, k key
channel, v value channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def selected_block_attention(q, kb, vb, sel, *, scale: float, chunk: int):
  """One pass over the selected blocks.

  Args:
    q: ``[B, R, H, K]`` queries, ``R`` a multiple of ``chunk``.
    kb, vb: ``[B, NF, C, Hkv, K]`` and ``[B, NF, C, Hkv, V]``, the keys and
      values of every full block (``blocks.gather_blocks``).
    sel: ``[B, R, H, n]`` int32 selected block indices (-1: none), from
      ``selection.select_blocks``.
    scale: multiplies the scores; chunk: ``c``, queries per tile.
  Returns:
    ``(o [B, R, H, V], lse [B, R, H])`` float32; a query that selected
    nothing gets ``o = 0``, ``lse = -inf``.
  """
  b, r, h, dk = q.shape
  nf, hkv = kb.shape[1], kb.shape[3]
  dv, n = vb.shape[-1], sel.shape[-1]
  tiles_n = r // chunk
  width = min(nf, chunk * n)
  # Numpy here, arrays inside the traced functions (see blocksparse.py).
  kv_head = np.arange(h) // (h // hkv)                          # [H]

  def rows():
    return jnp.arange(b)[:, None]

  def block_of(x, f):                   # [B,NF,C,Hkv,W], [B, H] -> [B,H,C,W]
    return x[rows(), jnp.maximum(f, 0), :, jnp.asarray(kv_head)[None]]

  def union(sel_t):
    """``(blocks [B, H, W] in order, -1 padded; rounds)`` of a tile."""
    picked = sel_t.transpose(0, 2, 1, 3).reshape(b, h, chunk * n) + 1
    marks = jnp.zeros((b, h, nf + 1), bool).at[
        rows()[..., None], jnp.arange(h)[None, :, None], picked].set(True)
    marks = marks[..., 1:]                                      # [B, H, NF]
    slot = jnp.where(marks, jnp.cumsum(marks, axis=-1) - 1, width)
    listed = jnp.full((b, h, width), -1, jnp.int32).at[
        rows()[..., None], jnp.arange(h)[None, :, None], slot].set(
            jnp.arange(nf, dtype=jnp.int32), mode="drop")
    return listed, jnp.max(jnp.sum(marks, axis=-1))

  def scores(q_t, sel_t, kblk, f):
    """``[B, H, c, C]`` scaled scores, -inf where the query did not select
    block ``f [B, H]``."""
    s = scale * _mm("bihk,bhjk->bhij", q_t, kblk)
    hit = jnp.any(sel_t == f[:, None, :, None], axis=-1) & (f >= 0)[:, None]
    return jnp.where(hit.transpose(0, 2, 1)[..., None], s, -jnp.inf)

  def tiles(x):                         # [B, R, ...] -> [N, B, c, ...]
    return jnp.moveaxis(x.reshape((b, tiles_n, chunk) + x.shape[2:]), 1, 0)

  def untiled(x):                       # [N, B, c, ...] -> [B, R, ...]
    return jnp.moveaxis(x, 0, 1).reshape((b, r) + x.shape[3:])

  def forward(q, kb, vb, sel):
    def tile(xs):
      q_t, sel_t = xs
      listed, rounds = union(sel_t)

      def one_round(u, carry):
        m, l, acc = carry
        f = listed[:, :, u]                                     # [B, H]
        s = scores(q_t, sel_t, block_of(kb, f), f)              # [B,H,c,C]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        # Rows with nothing allowed yet keep m = -inf; shift them by 0.
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - shift[..., None])
        rescale = jnp.exp(m - shift)
        acc = (rescale[..., None] * acc
               + _mm("bhij,bhjv->bhiv", p, block_of(vb, f)))    # [B,H,c,V]
        return m_new, rescale * l + jnp.sum(p, axis=-1), acc

      init = (jnp.full((b, h, chunk), -jnp.inf, _F32),
              jnp.zeros((b, h, chunk), _F32),
              jnp.zeros((b, h, chunk, dv), _F32))
      m, l, acc = jax.lax.fori_loop(0, rounds, one_round, init)
      safe = jnp.where(l > 0, l, 1.0)
      o = jnp.where((l > 0)[..., None], acc / safe[..., None], 0.0)
      lse = jnp.where(l > 0, m + jnp.log(safe), -jnp.inf)
      return o.transpose(0, 2, 1, 3), lse.transpose(0, 2, 1)   # [B,c,H,*]

    o, lse = jax.lax.map(tile, (tiles(q), tiles(sel)))
    return untiled(o), untiled(lse)

  def backward(q, kb, vb, sel, o, lse, do, dlse):
    # d lse / d s = p, so dlse enters as a shift of the row term.
    delta = jnp.sum(do * o, axis=-1) - dlse                     # [B, R, H]
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)

    def tile(carry, xs):
      q_t, sel_t, lse_t, delta_t, do_t = xs
      listed, rounds = union(sel_t)
      lse_t, delta_t = lse_t.transpose(0, 2, 1), delta_t.transpose(0, 2, 1)

      def one_round(u, inner):
        dq_t, dkb, dvb = inner
        f = listed[:, :, u]
        kblk, vblk = block_of(kb, f), block_of(vb, f)
        p = jnp.exp(scores(q_t, sel_t, kblk, f) - lse_t[..., None])
        dp = _mm("bihv,bhjv->bhij", do_t, vblk)                 # [B,H,c,C]
        ds = p * (dp - delta_t[..., None])
        dq_t = dq_t + scale * _mm("bhij,bhjk->bihk", ds, kblk)
        index = (rows(), jnp.maximum(f, 0), slice(None),
                 jnp.asarray(kv_head)[None])
        dkb = dkb.at[index].add(scale * _mm("bhij,bihk->bhjk", ds, q_t))
        dvb = dvb.at[index].add(_mm("bhij,bihv->bhjv", p, do_t))
        return dq_t, dkb, dvb

      dq_t, dkb, dvb = jax.lax.fori_loop(
          0, rounds, one_round, (jnp.zeros_like(q_t),) + carry)
      return (dkb, dvb), dq_t

    (dkb, dvb), dq = jax.lax.scan(
        tile, (jnp.zeros_like(kb), jnp.zeros_like(vb)),
        tuple(tiles(x) for x in (q, sel, lse, delta, do)))
    return untiled(dq), dkb, dvb

  @jax.custom_vjp
  def attend(q, kb, vb, sel):
    return forward(q, kb, vb, sel)

  def attend_fwd(q, kb, vb, sel):
    o, lse = forward(q, kb, vb, sel)
    return (o, lse), (q, kb, vb, sel, o, lse)

  def attend_bwd(res, cotangents):
    do, dlse = cotangents
    dq, dkb, dvb = backward(*res, do, dlse)
    return dq, dkb, dvb, None

  attend.defvjp(attend_fwd, attend_bwd)
  return attend(jnp.asarray(q, _F32), jnp.asarray(kb, _F32),
                jnp.asarray(vb, _F32), jnp.asarray(sel, jnp.int32))
