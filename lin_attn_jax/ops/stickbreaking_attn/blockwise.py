r"""Stick-breaking attention over blocks, in linear memory both ways.

Rows (queries) and columns (keys) come in blocks of ``C``, each carrying
its sequence position (``-1`` for padding), as in the softmax family's
block-sparse passes (``softmax_attn/blocksparse.py``, whose slot schedule
this reuses). A query block walks its key blocks *from the nearest
backwards*, carrying per query the softplus sum of the keys already walked,

    taken_i = sum_{l visible, l in later blocks} softplus(z_il),

so that within key block ``m`` (``sticks.break_sticks``)

    log A_ij = log_sigmoid(z_ij) - taken_i
               - sum_{l visible in block m, l > j} softplus(z_il),

and after it ``taken_i`` grows by the block's softplus sum. The output
accumulates ``sum_j A_ij v_j``; the remaining stick is ``exp(-taken_i)``
after the last block. Every term is a sum of non-negative numbers: no
cancellation, however strong the logits.

Backward (``custom_vjp``): it keeps ``o`` and ``log rem = -taken`` only,
walks the blocks in the same order and recomputes each block's weights, so
no ``[rows, columns]`` array exists in either direction; memory is linear
in the rows and columns. With ``g_ij = A_ij (do_i . v_j)`` (the cotangent
of ``log A_ij``), the logit's cotangent is

    dz_ij = g_ij sigmoid(-z_ij)
            - sigmoid(z_ij) (sum_{j' < j visible} g_ij' + dlogrem_i),

and the prefix sum is that of the key's own block (a cumulative sum) plus
that of the farther blocks, which the walk (nearest first) has not reached:
the row total ``sum_j g_ij = do_i . o_i`` (flash attention's ``delta``)
less the blocks walked so far. Every sum of the backward runs in the
forward's order, and that difference is one of bounded numbers (``|g| <= A
|do| |v|``, ``sum_j A_ij <= 1``), never of softplus sums. Its rounding,
``eps |do_i . o_i|``, would dwarf the true value once the stick is spent
(saturated logits): the farther keys share the stick left after the block,
``exp(-taken_i)``, so the difference is clipped to ``exp(-taken_i) |do_i|
max_j |v_j|``, a bound the exact value keeps, and it is 0 where that stick
is 0.

Letters: b batch, s slot, h key/value head, g query head in a group, i query
row in a block, j key column in a block, k key channel, v value channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.softmax_attn.blocksparse import (BlockLayout,
                                                      make_schedule)
from lin_attn_jax.ops.stickbreaking_attn.sticks import break_sticks

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


def walk_pairs(q_blocks, key_blocks):
  """``(q_block, k_block)`` lists: each query block of ``q_blocks`` with
  its key blocks in walking order (nearest first), ``key_blocks(n)``."""
  qs, ks = [], []
  for n in q_blocks:
    keys = list(key_blocks(n))
    qs += [n] * len(keys)
    ks += keys
  return qs, ks


def stickbreaking_blocks(q, k, v, doc_q, doc_k, *, q_pos, k_pos, pairs,
                         attend_current: bool, block_size: int, scale: float,
                         q_offset=0):
  """Stick-breaking attention of query rows against key columns, by blocks.

  Args:
    q: ``[B, Rq, H, K]`` float32 query rows, ``Rq`` a multiple of
      ``block_size``.
    k, v: ``[B, Rk, Hkv, K]`` and ``[B, Rk, Hkv, V]`` float32 key columns,
      ``Rk`` a multiple of ``block_size``; ``H`` a multiple of ``Hkv``.
    doc_q, doc_k: ``[B, Rq]`` and ``[B, Rk]`` document indices, or both
      None (one document).
    q_pos, k_pos: static ``[Rq]`` and ``[Rk]`` positions, ``-1`` = padding.
    pairs: static ``(q_block, k_block)`` lists: for each query block, the
      key blocks that can hold a visible key, nearest first (positions
      decreasing from block to block, increasing within a block).
    attend_current: a query sees the key at its own position.
    block_size: ``C``.
    scale: multiplies the logits.
    q_offset: added to the query positions (an int, traced or not: a
      device's first position when the sequence is split).
  Returns:
    ``(o [B, Rq, H, V] float32, log_rem [B, Rq, H] float32)``, ``log_rem =
    -sum softplus(z)`` over each query's visible keys (0 for none).
  """
  lay = BlockLayout.of(q, k, q_pos, k_pos, block_size)
  b, nq, hkv, g, c = lay.b, lay.nq, lay.hkv, lay.g, lay.c
  dv = v.shape[-1]
  q_block, k_block = (np.asarray(x, np.int32) for x in pairs)
  sched = make_schedule(q_block, k_block, np.zeros_like(q_block),
                        num_q_blocks=nq)
  tables = (sched.q_block, sched.k_block, sched.active)

  def block_visible(qi, ki, act, dq_b, dk_b, q_offset):
    """``[B or 1, S, 1, 1, C, C]``: the visible entries of the round's
    pairs."""
    if attend_current:
      return lay.mask(qi, ki, act, dq_b, dk_b,
                      lambda i, j: j <= i + q_offset)
    return lay.mask(qi, ki, act, dq_b, dk_b, lambda i, j: j < i + q_offset)

  def block_weights(qs, ks, visible, taken):
    """Logits ``[B,S,h,g,C,C]``, weights ``A`` and the new ``taken``."""
    z = scale * _mm("bshgik,bshjk->bshgij", qs, ks)
    log_a, taken = break_sticks(z, visible, taken)
    return z, jnp.exp(log_a), taken

  def forward(q, k, v, doc_q, doc_k, q_offset):
    qb, kb, vb = lay.q_blocks(q), lay.k_blocks(k), lay.k_blocks(v)
    dq_b, dk_b = lay.doc_blocks(doc_q, doc_k)
    taken0 = jnp.zeros((b, nq + 1, hkv, g, c), _F32)
    acc0 = jnp.zeros((b, nq + 1, hkv, g, c, dv), _F32)

    def one_round(carry, xs):
      taken, acc = carry
      qi, ki, act = xs                                          # [S]
      visible = block_visible(qi, ki, act, dq_b, dk_b, q_offset)
      _, a, taken_new = block_weights(qb[:, qi], kb[:, ki], visible,
                                      taken[:, qi])
      acc_new = acc[:, qi] + _mm("bshgij,bshjv->bshgiv", a, vb[:, ki])
      return (taken.at[:, qi].set(taken_new),
              acc.at[:, qi].set(acc_new)), None

    (taken, acc), _ = jax.lax.scan(one_round, (taken0, acc0),
                                   tuple(jnp.asarray(x) for x in tables))
    return lay.from_row_blocks(acc), lay.from_row_blocks(-taken)

  def backward(q, k, v, doc_q, doc_k, q_offset, o, do, dlog_rem):
    qb, kb, vb = lay.q_blocks(q), lay.k_blocks(k), lay.k_blocks(v)
    dq_b, dk_b = lay.doc_blocks(doc_q, doc_k)
    do_b = lay.q_blocks(do)                             # [B,N+1,h,g,C,V]
    total = lay.row_blocks(jnp.sum(do * o, axis=-1))                # sum_j g_ij
    dlog_rem = lay.row_blocks(dlog_rem)                         # [B,N+1,h,g,C]
    # |do_i . v_j| <= |do_i| max_j |v_j|: [B,N+1,h,g,C].
    dp_bound = (lay.row_blocks(jnp.sqrt(jnp.sum(do * do, axis=-1)))
                * jnp.sqrt(jnp.max(jnp.sum(v * v, axis=-1), axis=1))[
                    :, None, :, None, None])

    def one_round(carry, xs):
      taken, later, dq, dk_, dv_ = carry
      qi, ki, act = xs
      qs, ks, vs, dos = qb[:, qi], kb[:, ki], vb[:, ki], do_b[:, qi]
      visible = block_visible(qi, ki, act, dq_b, dk_b, q_offset)
      z, a, taken_new = block_weights(qs, ks, visible, taken[:, qi])
      cot = a * _mm("bshgiv,bshjv->bshgij", dos, vs)            # g_ij
      block_sum = jnp.sum(cot, axis=-1)                         # [B,S,h,g,C]
      # The farther blocks' g: the row total less the walked ones. Their
      # weights share the stick left after this block, exp(-taken_new),
      # so |farther| <= exp(-taken_new) max |do . v|; the clip keeps the
      # difference's rounding below that scale once the stick is spent.
      bound = jnp.exp(-taken_new) * dp_bound[:, qi]
      farther = jnp.clip(total[:, qi] - later[:, qi] - block_sum, -bound,
                         bound)
      inclusive = jax.lax.cumsum(cot, axis=cot.ndim - 1)
      before = farther[..., None] + jnp.concatenate(            # j' < j
          [jnp.zeros_like(inclusive[..., :1]), inclusive[..., :-1]], axis=-1)
      dz = jnp.where(visible, cot * jax.nn.sigmoid(-z) - jax.nn.sigmoid(z)
                     * (before + dlog_rem[:, qi][..., None]), 0.0)
      dq = dq.at[:, qi].add(scale * _mm("bshgij,bshjk->bshgik", dz, ks))
      dk_ = dk_.at[:, ki].add(scale * _mm("bshgij,bshgik->bshjk", dz, qs))
      dv_ = dv_.at[:, ki].add(_mm("bshgij,bshgiv->bshjv", a, dos))
      later_new = later[:, qi] + block_sum
      return (taken.at[:, qi].set(taken_new), later.at[:, qi].set(later_new),
              dq, dk_, dv_), None

    rows = jnp.zeros((b, nq + 1, hkv, g, c), _F32)
    init = (rows, rows, jnp.zeros_like(qb), jnp.zeros_like(kb),
            jnp.zeros_like(vb))
    (_, _, dq, dk_, dv_), _ = jax.lax.scan(
        one_round, init, tuple(jnp.asarray(x) for x in tables))
    return (lay.from_row_blocks(dq), lay.from_k_blocks(dk_),
            lay.from_k_blocks(dv_))

  @jax.custom_vjp
  def attend(q, k, v, doc_q, doc_k, q_offset):
    return forward(q, k, v, doc_q, doc_k, q_offset)

  def attend_fwd(q, k, v, doc_q, doc_k, q_offset):
    o, log_rem = forward(q, k, v, doc_q, doc_k, q_offset)
    return (o, log_rem), (q, k, v, doc_q, doc_k, q_offset, o)

  def attend_bwd(res, cotangents):
    do, dlog_rem = cotangents
    dq, dk_, dv_ = backward(*res, do, dlog_rem)
    return dq, dk_, dv_, None, None, None

  attend.defvjp(attend_fwd, attend_bwd)
  return attend(jnp.asarray(q, _F32), jnp.asarray(k, _F32),
                jnp.asarray(v, _F32), doc_q, doc_k,
                jnp.asarray(q_offset, jnp.int32))
