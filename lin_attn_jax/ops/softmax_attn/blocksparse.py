"""Block-sparse softmax attention with an online softmax, and merging passes.

A *pass* attends a set of query rows to a set of key columns. Rows and
columns are gathered copies of sequence positions (in order, out of order,
or only some of them), each carrying its position (``-1`` for padding), so a
mask rule written in positions applies to any of them. Rows and columns come
in blocks of ``C``; the pass lists the (query block, key block, rule id)
triples that can hold an allowed entry, and every other block pair is
skipped. Per row it returns the normalised output and the log-sum-exp

    lse_r = log sum_{c allowed} exp(s_rc),   o_r = sum_c exp(s_rc - lse_r) v_c,

so passes that cover disjoint parts of one query's keys merge exactly
(``merge_passes``). An optional bias per row and query head ``a_r`` and per
column and query head ``b_c`` makes the scores ``s_rc = scale q_r . k_c +
a_r - b_c`` (the Forgetting Transformer's decay bias, ``a = b`` the
cumulative log forget gate); it is added before the mask, so no ``exp``
ever sees a masked entry.

Schedule: the key blocks of each query block are one list; the lists are
packed into ``S`` slots (first fit, longest first, slot capacity the longest
list), and round ``l`` of a ``lax.scan`` computes the ``l``-th pair of every
slot. A query block sits in a single slot, so no two pairs of a round update
the same rows. Full causal attention packs block rows ``n`` and ``N - 1 - n``
into one slot, so the scan does the ``N (N + 1) / 2`` useful pairs and no
more.

Forward per round (flash-attention): scores of the ``[C, C]`` block, masked
to -inf before any ``exp``, a running maximum ``m`` and sum ``l`` per row,
and the output accumulator rescaled by ``exp(m_old - m_new)``. The backward
pass (``custom_vjp``) keeps only ``o`` and ``lse`` and recomputes each
block's probabilities, so no ``[rows, columns]`` array exists in either
direction; memory is linear in the number of rows and columns.

Letters: b batch, s slot, h key/value head, g query head in a group, i query
row in a block, j key column in a block, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """Static tables ``[L, S]``: round ``l`` computes, in slot ``s``, query
  block ``q_block[l, s]`` against key block ``k_block[l, s]`` under rule
  ``rule[l, s]``. Idle entries point at the dummy query block ``NQ``."""
  q_block: np.ndarray
  k_block: np.ndarray
  rule: np.ndarray
  active: np.ndarray


def make_schedule(q_block, k_block, rule, num_q_blocks: int) -> Schedule:
  """Packs the block pairs of a pass into slots (see the module docstring)."""
  q_block, k_block, rule = (np.asarray(x, np.int32).reshape(-1)
                            for x in (q_block, k_block, rule))
  order = np.argsort(q_block, kind="stable")
  q_block, k_block, rule = q_block[order], k_block[order], rule[order]
  blocks, starts, counts = np.unique(q_block, return_index=True,
                                     return_counts=True)
  if blocks.size == 0:
    empty = np.zeros((1, 1), np.int32)
    return Schedule(empty + num_q_blocks, empty, empty, empty.astype(bool))
  capacity = int(counts.max())
  loads: list[int] = []
  members: list[list[int]] = []
  for idx in np.argsort(-counts, kind="stable"):
    n = int(counts[idx])
    for slot, load in enumerate(loads):
      if load + n <= capacity:
        loads[slot] += n
        members[slot].append(idx)
        break
    else:
      loads.append(n)
      members.append([idx])
  slots = len(loads)
  tables = np.zeros((3, capacity, slots), np.int32)
  tables[0] = num_q_blocks
  active = np.zeros((capacity, slots), bool)
  for slot, idxs in enumerate(members):
    row = 0
    for idx in idxs:
      part = slice(starts[idx], starts[idx] + counts[idx])
      rows = slice(row, row + counts[idx])
      tables[0, rows, slot] = q_block[part]
      tables[1, rows, slot] = k_block[part]
      tables[2, rows, slot] = rule[part]
      active[rows, slot] = True
      row += counts[idx]
  return Schedule(tables[0], tables[1], tables[2], active)


@dataclasses.dataclass(frozen=True, eq=False)
class BlockLayout:
  """Query rows and key columns cut into blocks of ``C``, for a scan over
  block pairs.

  Query-side arrays get one extra all-padding block (index ``NQ``), the
  dummy that absorbs a schedule's idle slots. Query heads are split as
  ``(h, g)``: key/value head and query head within its group.

  Attributes:
    b, c: batch and block size.
    nq, nk: query and key blocks.
    hkv, g: key/value heads and query heads per group.
    pos_q: static ``[NQ+1, C]`` query positions (``-1`` = padding).
    pos_k: static ``[NK, C]`` key positions.
  """
  b: int
  c: int
  nq: int
  nk: int
  hkv: int
  g: int
  pos_q: np.ndarray
  pos_k: np.ndarray

  @classmethod
  def of(cls, q, k, q_pos, k_pos, block_size: int) -> "BlockLayout":
    """From ``q [B, Rq, H, K]``, ``k [B, Rk, Hkv, K]`` and the static
    positions of their rows (``[Rq]``, ``[Rk]``)."""
    c = block_size
    b, rq, h = q.shape[:3]
    rk, hkv = k.shape[1], k.shape[2]
    nq, nk = rq // c, rk // c
    # Numpy, not arrays: arrays made here would be closed over by a
    # custom_vjp, which fails where its backward is traced apart from its
    # forward (inside a differentiated shard_map).
    pos_q = np.concatenate([np.asarray(q_pos), np.full((c,), -1)]).reshape(
        nq + 1, c)
    return cls(b, c, nq, nk, hkv, h // hkv, pos_q,
               np.asarray(k_pos).reshape(nk, c))

  def q_blocks(self, x):          # [B, Rq, H, W] -> [B,NQ+1,h,g,C,W]
    x = jnp.pad(x, ((0, 0), (0, self.c), (0, 0), (0, 0)))
    return x.reshape(self.b, self.nq + 1, self.c, self.hkv, self.g,
                     x.shape[-1]).transpose(0, 1, 3, 4, 2, 5)

  def k_blocks(self, x):          # [B, Rk, Hkv, W] -> [B,NK,h,C,W]
    return x.reshape(self.b, self.nk, self.c, self.hkv,
                     x.shape[-1]).transpose(0, 1, 3, 2, 4)

  def from_k_blocks(self, x):     # [B,NK,h,C,W] -> [B,Rk,Hkv,W]
    return x.transpose(0, 1, 3, 2, 4).reshape(
        self.b, self.nk * self.c, self.hkv, x.shape[-1])

  def row_blocks(self, x):        # [B, Rq, H] -> [B,NQ+1,h,g,C]
    x = jnp.pad(x, ((0, 0), (0, self.c), (0, 0)))
    return x.reshape(self.b, self.nq + 1, self.c, self.hkv,
                     self.g).transpose(0, 1, 3, 4, 2)

  def from_row_blocks(self, x):   # [B,NQ+1,h,g,C,...] -> [B,Rq,H,...]
    x = jnp.moveaxis(x[:, :self.nq], 4, 2)                    # [B,N,C,h,g,...]
    return x.reshape((self.b, self.nq * self.c, self.hkv * self.g)
                     + x.shape[5:])

  def key_row_blocks(self, x):    # [B, Rk, H] -> [B,NK,h,g,C]
    return x.reshape(self.b, self.nk, self.c, self.hkv,
                     self.g).transpose(0, 1, 3, 4, 2)

  def from_key_row_blocks(self, x):  # [B,NK,h,g,C] -> [B, Rk, H]
    return x.transpose(0, 1, 4, 2, 3).reshape(
        self.b, self.nk * self.c, self.hkv * self.g)

  def doc_blocks(self, doc_q, doc_k):
    """``([B, NQ+1, C], [B, NK, C])`` document blocks, or Nones."""
    if doc_q is None:
      return None, None
    doc_q = jnp.pad(doc_q, ((0, 0), (0, self.c)))
    return (doc_q.reshape(self.b, self.nq + 1, self.c),
            doc_k.reshape(self.b, self.nk, self.c))

  def mask(self, qi, ki, act, doc_q, doc_k, allowed):
    """``[B or 1, S, 1, 1, C, C]`` entries of a round's pairs that are
    allowed, in use and in one document.

    Args:
      qi, ki, act: ``[S]`` query block, key block and in-use flag of each
        slot.
      doc_q, doc_k: the ``doc_blocks``, or Nones.
      allowed: ``(i [S, C, 1], j [S, 1, C]) -> [S, C, C]`` bool, on the
        positions of the rows and columns.
    """
    i = jnp.asarray(self.pos_q)[qi][:, :, None]                 # [S, C, 1]
    j = jnp.asarray(self.pos_k)[ki][:, None, :]                 # [S, 1, C]
    mask = allowed(i, j) & (i >= 0) & (j >= 0) & act[:, None, None]
    if doc_q is None:
      return mask[None, :, None, None]
    same = doc_q[:, qi][..., :, None] == doc_k[:, ki][..., None, :]
    return (mask[None] & same)[:, :, None, None]                # [B,S,1,1,C,C]


RuleFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def blocksparse_attention(q, k, v, doc_q, doc_k, *, q_pos, k_pos, pairs,
                          rule: RuleFn, block_size: int, scale: float,
                          q_offset=0, q_bias=None, k_bias=None):
  """One pass of block-sparse softmax attention.

  Args:
    q: ``[B, Rq, H, K]`` query rows, ``Rq`` a multiple of ``block_size``.
    k, v: ``[B, Rk, Hkv, K]`` and ``[B, Rk, Hkv, V]`` key columns, ``Rk`` a
      multiple of ``block_size``; ``H`` a multiple of ``Hkv``.
    doc_q, doc_k: ``[B, Rq]`` and ``[B, Rk]`` document indices of the rows
      and columns, or both None (one document).
    q_pos, k_pos: static ``[Rq]`` and ``[Rk]`` positions, ``-1`` = padding.
    pairs: static ``(q_block, k_block, rule_id)`` arrays of the block pairs
      to compute.
    rule: ``(i, j, rule_id) -> bool`` on broadcastable position arrays.
    block_size: ``C``.
    scale: multiplies the scores.
    q_offset: added to the query positions before ``rule`` (an int, traced
      or not: a device's first position when the sequence is split).
    q_bias, k_bias: ``[B, Rq, H]`` and ``[B, Rk, H]`` float32 (one per
      query head), both or neither: ``q_bias_r - k_bias_c`` is added to the
      scores. Differentiated like q, k and v (recomputed per block in the
      backward pass).
  Returns:
    ``(o [B, Rq, H, V] float32, lse [B, Rq, H] float32)``; rows with no
    allowed key get ``o = 0`` and ``lse = -inf``.
  """
  lay = BlockLayout.of(q, k, q_pos, k_pos, block_size)
  b, nq, hkv, g, c = lay.b, lay.nq, lay.hkv, lay.g, lay.c
  dv = v.shape[-1]
  sched = make_schedule(*pairs, num_q_blocks=nq)
  tables = (sched.q_block, sched.k_block, sched.rule, sched.active)
  if (q_bias is None) != (k_bias is None):
    raise ValueError("q_bias and k_bias go together: give both or neither")

  def bias_blocks(bq, bk):
    if bq is None:
      return None, None
    return lay.row_blocks(bq), lay.key_row_blocks(bk)

  def block_mask(qi, ki, ri, act, dq_b, dk_b, q_offset):
    """``[B or 1, S, 1, 1, C, C]`` allowed entries of the round's pairs."""
    return lay.mask(qi, ki, act, dq_b, dk_b,
                    lambda i, j: rule(i + q_offset, j, ri[:, None, None]))

  def scores(qs, ks, mask, bias_q, bias_k):
    s = scale * _mm("bshgik,bshjk->bshgij", qs, ks)            # [B,S,h,g,C,C]
    if bias_q is not None:
      s = s + (bias_q[..., :, None] - bias_k[..., None, :])
    return jnp.where(mask, s, -jnp.inf)

  def round_bias(bq_b, bk_b, qi, ki):
    """The round's row and column biases ``[B,S,h,g,C]``, or Nones."""
    if bq_b is None:
      return None, None
    return bq_b[:, qi], bk_b[:, ki]

  def forward(q, k, v, bq, bk, doc_q, doc_k, q_offset):
    qb, kb, vb = lay.q_blocks(q), lay.k_blocks(k), lay.k_blocks(v)
    bq_b, bk_b = bias_blocks(bq, bk)
    dq_b, dk_b = lay.doc_blocks(doc_q, doc_k)
    m0 = jnp.full((b, nq + 1, hkv, g, c), -jnp.inf, _F32)
    l0 = jnp.zeros((b, nq + 1, hkv, g, c), _F32)
    acc0 = jnp.zeros((b, nq + 1, hkv, g, c, dv), _F32)

    def one_round(carry, xs):
      m, l, acc = carry
      qi, ki, ri, act = xs                                      # [S]
      s = scores(qb[:, qi], kb[:, ki],
                 block_mask(qi, ki, ri, act, dq_b, dk_b, q_offset),
                 *round_bias(bq_b, bk_b, qi, ki))
      m_old = m[:, qi]                                          # [B,S,h,g,C]
      m_new = jnp.maximum(m_old, jnp.max(s, axis=-1))
      # A row with nothing allowed yet keeps m = -inf; shift it by 0 instead
      # so that exp(-inf - shift) is 0, never NaN.
      shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
      p = jnp.exp(s - shift[..., None])                         # [B,S,h,g,C,C]
      rescale = jnp.exp(m_old - shift)                          # [B,S,h,g,C]
      l_new = rescale * l[:, qi] + jnp.sum(p, axis=-1)
      acc_new = (rescale[..., None] * acc[:, qi]
                 + _mm("bshgij,bshjv->bshgiv", p, vb[:, ki]))   # [B,S,h,g,C,V]
      return (m.at[:, qi].set(m_new), l.at[:, qi].set(l_new),
              acc.at[:, qi].set(acc_new)), None

    (m, l, acc), _ = jax.lax.scan(one_round, (m0, l0, acc0),
                                  tuple(jnp.asarray(x) for x in tables))
    o = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None],
                  0.0)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
    return lay.from_row_blocks(o), lay.from_row_blocks(lse)

  def backward(q, k, v, bq, bk, doc_q, doc_k, q_offset, o, lse, do, dlse):
    qb, kb, vb = lay.q_blocks(q), lay.k_blocks(k), lay.k_blocks(v)
    bq_b, bk_b = bias_blocks(bq, bk)
    dq_b, dk_b = lay.doc_blocks(doc_q, doc_k)
    do_b = lay.q_blocks(do)                                   # [B,N+1,h,g,C,V]
    # d lse_r / d s_rc = p_rc, so dlse enters as a shift of the row term.
    delta = lay.row_blocks(jnp.sum(do * o, axis=-1) - dlse)     # [B,N+1,h,g,C]
    lse_b = lay.row_blocks(jnp.where(jnp.isfinite(lse), lse, 0.0))

    def one_round(carry, xs):
      dq, dk_, dv_, dbq, dbk = carry
      qi, ki, ri, act = xs
      qs, ks, vs, dos = qb[:, qi], kb[:, ki], vb[:, ki], do_b[:, qi]
      s = scores(qs, ks, block_mask(qi, ki, ri, act, dq_b, dk_b, q_offset),
                 *round_bias(bq_b, bk_b, qi, ki))
      p = jnp.exp(s - lse_b[:, qi][..., None])                  # [B,S,h,g,C,C]
      dp = _mm("bshgiv,bshjv->bshgij", dos, vs)
      ds = p * (dp - delta[:, qi][..., None])
      dq = dq.at[:, qi].add(scale * _mm("bshgij,bshjk->bshgik", ds, ks))
      dk_ = dk_.at[:, ki].add(scale * _mm("bshgij,bshgik->bshjk", ds, qs))
      dv_ = dv_.at[:, ki].add(_mm("bshgij,bshgiv->bshjv", p, dos))
      if dbq is not None:
        # d s_rc / d a_r = 1 and d s_rc / d b_c = -1.
        dbq = dbq.at[:, qi].add(jnp.sum(ds, axis=-1))          # [B,S,h,g,C]
        dbk = dbk.at[:, ki].add(-jnp.sum(ds, axis=-2))
      return (dq, dk_, dv_, dbq, dbk), None

    init = (jnp.zeros_like(qb), jnp.zeros_like(kb), jnp.zeros_like(vb),
            None if bq_b is None else jnp.zeros_like(bq_b),
            None if bk_b is None else jnp.zeros_like(bk_b))
    (dq, dk_, dv_, dbq, dbk), _ = jax.lax.scan(
        one_round, init, tuple(jnp.asarray(x) for x in tables))
    if dbq is not None:
      dbq, dbk = lay.from_row_blocks(dbq), lay.from_key_row_blocks(dbk)
    return (lay.from_row_blocks(dq), lay.from_k_blocks(dk_),
            lay.from_k_blocks(dv_), dbq, dbk)

  @jax.custom_vjp
  def attend(q, k, v, bq, bk, doc_q, doc_k, q_offset):
    return forward(q, k, v, bq, bk, doc_q, doc_k, q_offset)

  def attend_fwd(q, k, v, bq, bk, doc_q, doc_k, q_offset):
    o, lse = forward(q, k, v, bq, bk, doc_q, doc_k, q_offset)
    return (o, lse), (q, k, v, bq, bk, doc_q, doc_k, q_offset, o, lse)

  def attend_bwd(res, cotangents):
    do, dlse = cotangents
    return backward(*res, do, dlse) + (None, None, None)

  attend.defvjp(attend_fwd, attend_bwd)
  bias = [None if x is None else jnp.asarray(x, _F32)
          for x in (q_bias, k_bias)]
  return attend(jnp.asarray(q, _F32), jnp.asarray(k, _F32),
                jnp.asarray(v, _F32), *bias, doc_q, doc_k,
                jnp.asarray(q_offset, jnp.int32))


def merge_passes(parts, length: int):
  """Exact softmax over the union of disjoint key sets, from partial passes.

  Args:
    parts: ``[(o [B, R, H, V], lse [B, R, H], row_pos [R]), ...]``; a
      position appears at most once in each pass (``-1`` = padding row).
    length: ``T``.
  Returns:
    ``o [B, T, H, V]`` float32.
  """
  if len(parts) == 1 and np.array_equal(parts[0][2][:length],
                                        np.arange(length)):
    return parts[0][0][:, :length]
  outs, lses = [], []
  for o, lse, row_pos in parts:
    row_pos = np.asarray(row_pos)
    row_of = np.full((length,), -1, np.int64)                   # [T]
    rows = np.nonzero(row_pos >= 0)[0]
    row_of[row_pos[rows]] = rows
    present = jnp.asarray(row_of >= 0)[None, :, None]           # [1, T, 1]
    take = jnp.asarray(np.maximum(row_of, 0))
    lses.append(jnp.where(present, lse[:, take], -jnp.inf))     # [B, T, H]
    outs.append(o[:, take])                                     # [B, T, H, V]
  lse = jnp.stack(lses)                                         # [P, B, T, H]
  # The result does not depend on the shift; stop_gradient keeps it out of
  # the backward pass.
  top = jax.lax.stop_gradient(jnp.max(lse, axis=0))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  weight = jnp.exp(lse - top)                                   # [P, B, T, H]
  total = jnp.sum(weight, axis=0)
  o = sum(w[..., None] * x for w, x in zip(weight, outs))
  return o / jnp.where(total > 0, total, 1.0)[..., None]
