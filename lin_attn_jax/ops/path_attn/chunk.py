"""Blockwise PaTH attention: chunks, carried queries and an online softmax.

The sequence is cut into chunks of ``C`` tokens. Inside each chunk, in
parallel (``householder.block_transforms``): the UT transform of its
reflections, every query moved back to the chunk's start, every key moved
to the chunk's end, and the chunk's own ``[C, C]`` logits. Then, for the
pairs of a query chunk ``m`` and an earlier key chunk ``n``,

    z_ij = (q_i^T H_i ... H_{start m}) (H_{end m-1} ... H_{start m-1})
           ... (H_{end n+1} ... H_{start n+1}) (H_{end n} ... H_{j+1} k_j)

so the query chunk walks back over the key chunks ``m - 1, m - 2, ..., 0``:
at each one it scores the chunk's keys (online softmax) and then crosses
the chunk, ``q <- q - (q W_n^T) R_n``. Never ``[T, T]``.

Schedule: query chunk ``m`` has ``m`` such pairs, in that order. Chunks
``m`` and ``N - 1 - m`` share a slot (``N - 1`` pairs), and a ``lax.scan``
over ``N - 1`` rounds does one pair of every slot per round. The slots run
in groups of ``PAIR_FLOATS`` worth of per-round terms; each group is
rematerialised (``jax.checkpoint``) and its rounds differentiated by JAX,
so the backward pass holds one group's rounds at a time: memory is linear
in ``T`` in both directions (one group of one slot holds ``T / C`` rounds
of one query chunk).

The forget gate's bias ``c_i - c_j`` is carried the same way as a sum of
log-gates, never as a difference of two long cumulative sums: the query's
sum from its chunk's start, plus each crossed chunk's total, plus the
key's sum to its chunk's end.

Cost per query head: ``N (N - 1) / 2`` chunk pairs of ``2 C^2 (3 K + V)``
flops (scores ``2 C^2 K``, values ``2 C^2 V``, crossing ``4 C^2 K``): about
``T^2 (3 K + V)`` against ``T^2 (K + V)`` for causal softmax attention,
plus the chunks' own terms, ``O(T C (K + C))``. The backward pass runs the
rounds again (the rematerialisation) and then their gradients, about
three times the forward's flops.

Letters: b batch, n chunk, s slot, h key/value head, g query head in a
group, i query row, j key column, k key channel, v value channel.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.path_attn import context_parallel as split
from lin_attn_jax.ops.path_attn.householder import (block_transforms,
                                                    cross_block,
                                                    exclusive_suffix_sums)
from lin_attn_jax.ops.path_attn.inputs import default_scale, validate

_F32 = jnp.float32
# Floats of one group's per-round terms per batch row: slots of a query
# chunk's rounds (``N C H (K + V + C)`` floats each) are grouped up to this
# budget. Memory and speed only, never results.
PAIR_FLOATS = 1 << 21


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


@dataclasses.dataclass(frozen=True)
class ChunkTerms:
  """The chunks of a sequence, head-major, float32 (from ``chunk_terms``).

  ``gate_*`` are None without a forget gate and ``doc`` without segment
  ids.
  """
  q_start: jax.Array     # [B, N, h, g, C, K] queries at their chunk's start
  k_end: jax.Array       # [B, N, h, C, K] keys at their chunk's end
  v: jax.Array           # [B, N, h, C, V]
  w: jax.Array           # [B, N, h, C, K]
  r: jax.Array           # [B, N, h, C, K] chunk product I - W^T R
  logits: jax.Array      # [B, N, h, g, C, C] own logits (valid for j <= i)
  gate_in: jax.Array | None     # [B, N, h, g, C] sum of g from chunk start
  gate_out: jax.Array | None    # [B, N, h, g, C] sum of g after j to the end
  gate_total: jax.Array | None  # [B, N, h, g] sum of g over the chunk
  doc: jax.Array | None         # [B, N, C] document index


def chunk_terms(q, k, v, w, beta, g, doc, chunk: int) -> ChunkTerms:
  """The chunk-local terms of ``[B, T, ...]`` inputs, T padded to a
  multiple of ``chunk`` (zeros: a padded token's reflection is the
  identity, its gate 0); ``doc [B, T]`` a document index or None."""
  b, t, h, dk = q.shape
  hkv = k.shape[2]
  gq = h // hkv
  qp, kp, vp, wp, bp = (pad_time(jnp.asarray(x, _F32), chunk)
                        for x in (q, k, v, w, beta))
  n = qp.shape[1] // chunk
  q_c = qp.reshape(b, n, chunk, hkv, gq, dk).transpose(0, 1, 3, 4, 2, 5)

  def key_major(x):                         # [B, Tp, h, W] -> [B, N, h, C, W]
    return x.reshape(b, n, chunk, hkv, x.shape[-1]).transpose(0, 1, 3, 2, 4)

  k_c, v_c, w_c = key_major(kp), key_major(vp), key_major(wp)
  beta_c = bp.reshape(b, n, chunk, hkv).transpose(0, 1, 3, 2)   # [B,N,h,C]
  q_start, k_end, r, logits = block_transforms(q_c, k_c, w_c, beta_c)
  gate_in = gate_out = gate_total = None
  if g is not None:
    gp = pad_time(jnp.asarray(g, _F32), chunk)                   # [B, Tp, H]
    g_c = gp.reshape(b, n, chunk, hkv, gq).transpose(0, 1, 3, 4, 2)
    gate_in = jnp.cumsum(g_c, axis=-1)                           # [B,N,h,g,C]
    gate_out = exclusive_suffix_sums(g_c, axis=-1)
    gate_total = jnp.sum(g_c, axis=-1)                           # [B,N,h,g]
  doc_c = None
  if doc is not None:
    doc_c = pad_time(doc, chunk, mode="edge").reshape(b, n, chunk)
  return ChunkTerms(q_start, k_end, v_c, w_c, r, logits, gate_in, gate_out,
                    gate_total, doc_c)


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """Static slots of the rounds: slot ``s`` runs query chunk ``long[s]``
  against key chunks ``long[s] - 1, ..., 0``, then ``short[s]`` against
  ``short[s] - 1, ..., 0``. Tables ``[R, S]``: in round ``r``, slot ``s``
  works on its short chunk (``which``) or its long one, against key chunk
  ``key``, or idles (``active`` False)."""
  long: np.ndarray       # [S]
  short: np.ndarray      # [S]
  which: np.ndarray      # [R, S] bool, True: the short chunk
  key: np.ndarray        # [R, S]
  active: np.ndarray     # [R, S] bool
  home: np.ndarray       # [N] row of each chunk in [long results; short]


def make_schedule(n: int) -> Schedule:
  """Pairs chunk ``m`` with chunk ``N - 1 - m`` (the middle chunk of an
  odd ``N`` alone): every slot has ``N - 1`` rounds of work, or fewer."""
  slots = (n + 1) // 2
  long = np.arange(n - 1, n - 1 - slots, -1)                    # [S]
  short = np.arange(slots)
  has_short = short < long
  rounds = max(n - 1, 1)
  r = np.arange(rounds)[:, None]
  which = r >= long[None, :]
  key = np.where(which, short[None, :] - 1 - (r - long[None, :]),
                 long[None, :] - 1 - r)
  active = np.where(which, has_short[None, :] & (key >= 0), key >= 0)
  home = np.zeros((n,), np.int64)
  home[long] = np.arange(slots)
  home[short[has_short]] = slots + np.arange(slots)[has_short]
  return Schedule(long, short, which, np.maximum(key, 0), active, home)


def _first_pass(terms: ChunkTerms, scale):
  """Each query chunk against its own keys: ``(m, l, acc)`` of the online
  softmax (every row sees its own key, so ``m`` is finite)."""
  c = terms.logits.shape[-1]
  i = jnp.arange(c)
  s = terms.logits
  if terms.gate_in is not None:
    s = s + terms.gate_in[..., :, None] - terms.gate_in[..., None, :]
  allowed = (i[:, None] >= i[None, :])                          # [C, C]
  if terms.doc is not None:
    same = terms.doc[..., :, None] == terms.doc[..., None, :]   # [B,N,C,C]
    allowed = allowed & same[:, :, None, None]
  s = jnp.where(allowed, scale * s, -jnp.inf)                   # [B,N,h,g,C,C]
  m = jnp.max(s, axis=-1)
  p = jnp.exp(s - m[..., None])
  acc = _mm("bnhgij,bnhjv->bnhgiv", p, terms.v)                 # [B,N,h,g,C,V]
  return m, jnp.sum(p, axis=-1), acc


def _select(which, a, b):
  """``b`` where ``which [G]`` (along the slot axis, 1), else ``a``."""
  return jnp.where(which.reshape((1, -1) + (1,) * (a.ndim - 2)), b, a)


def _rounds(init_long, init_short, doc_long, doc_short, tables, terms,
            scale):
  """The rounds of a group of slots (see the module docstring).

  ``init_*``: per-slot states ``(q [B,G,h,g,C,K], gate [B,G,h,g,C] or None,
  m, l [B,G,h,g,C], acc [B,G,h,g,C,V])``; ``doc_*``: ``[B, G, C]`` or None;
  tables: ``(which, key, active)``, each ``[R, G]``. Returns the final
  ``(long states, short states)``.
  """

  def one_round(carry, xs):
    long, short = carry
    which, kb, active = xs                                      # [G]
    on_short = functools.partial(_select, which)
    q, gate, m, l, acc = jax.tree.map(on_short, long, short)
    k_n, v_n = terms.k_end[:, kb], terms.v[:, kb]               # [B,G,h,C,*]
    z = _mm("bshgik,bshjk->bshgij", q, k_n)                     # [B,G,h,g,C,C]
    if gate is not None:
      z = z + gate[..., :, None] + terms.gate_out[:, kb][..., None, :]
    allowed = active.reshape(1, -1, 1, 1, 1, 1)
    if doc_long is not None:
      doc_q = on_short(doc_long, doc_short)                     # [B, G, C]
      same = doc_q[..., :, None] == terms.doc[:, kb][..., None, :]
      allowed = allowed & same[:, :, None, None]
    s = jnp.where(allowed, scale * z, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])                           # [B,G,h,g,C,C]
    alpha = jnp.exp(m - m_new)
    l_new = alpha * l + jnp.sum(p, axis=-1)
    acc_new = (alpha[..., None] * acc
               + _mm("bshgij,bshjv->bshgiv", p, v_n))           # [B,G,h,g,C,V]
    # Cross key chunk kb: q <- q (I - W^T R).
    q_new = cross_block(q, terms.w[:, kb][:, :, :, None],
                        terms.r[:, kb][:, :, :, None])          # [B,G,h,g,C,K]
    gate_new = (None if gate is None
                else gate + terms.gate_total[:, kb][..., None])
    new = jax.tree.map(functools.partial(_select, active), (q, gate, m, l, acc),
                       (q_new, gate_new, m_new, l_new, acc_new))
    return (jax.tree.map(on_short, new, long),
            jax.tree.map(on_short, short, new)), None

  (long, short), _ = jax.lax.scan(one_round, (init_long, init_short),
                                  tuple(jnp.asarray(x) for x in tables))
  return long, short


def slots_per_group(n_slots: int, rounds: int, chunk: int, heads: int,
                    dim_k: int, dim_v: int) -> int:
  """Slots per group: ``PAIR_FLOATS`` over one slot's terms, ``rounds x C
  x H x (K + V + C)`` floats."""
  per_slot = rounds * chunk * heads * (dim_k + dim_v + chunk)
  return max(1, min(n_slots, PAIR_FLOATS // per_slot))


def attend_chunks(terms: ChunkTerms, scale):
  """The attention of every chunk's queries to every key before them.

  Returns, per chunk (``[B, N, h, g, C, ...]``): ``(o, lse, q_first,
  gate_first)``: the output, the log-sum-exp of its scaled logits, the
  query moved back to the sequence's start (``q_i^T H_i ... H_1``) and its
  gate sum from the start (``c_i``; None without a gate).
  """
  m, l, acc = _first_pass(terms, scale)
  n = m.shape[1]
  state = (terms.q_start, terms.gate_in, m, l, acc)
  if n > 1:
    sched = make_schedule(n)

    def slots_of(ids):                           # [B, N, ...] -> [B, S, ...]
      return jax.tree.map(lambda x: x[:, ids], (state, terms.doc))

    (init_long, doc_long), (init_short, doc_short) = (
        slots_of(sched.long), slots_of(sched.short))
    long, short = _grouped_rounds(
        (init_long, init_short), (doc_long, doc_short),
        (sched.which, sched.key, sched.active), terms, scale)
    state = jax.tree.map(
        lambda a, b: jnp.concatenate([a, b], axis=1)[:, sched.home], long,
        short)
  q_first, gate_first, m, l, acc = state
  o = acc / l[..., None]
  lse = m + jnp.log(l)
  return o, lse, q_first, gate_first


def _grouped_rounds(inits, docs, tables, terms, scale):
  """``_rounds`` over groups of slots, each group rematerialised."""
  rounds, n_slots = tables[0].shape
  _, _, h, g, c, dk = terms.q_start.shape
  group = slots_per_group(n_slots, rounds, c, h * g, dk, terms.v.shape[-1])
  if group >= n_slots:
    return _rounds(*inits, *docs, tables, terms, scale)
  steps = -(-n_slots // group)
  pad = steps * group - n_slots

  def to_groups(x):                 # [B, S, ...] -> [steps, B, G, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((x.shape[0], steps, group) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)

  def from_groups(x):               # [steps, B, G, ...] -> [B, S, ...]
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((x.shape[0], steps * group) + x.shape[3:])[:, :n_slots]

  def table_groups(x):              # [R, S] -> [steps, R, G]; pads idle
    x = np.pad(x, [(0, 0), (0, pad)])
    return np.moveaxis(x.reshape(x.shape[0], steps, group), 1, 0)

  def one_group(xs):
    inits, docs, tables = xs
    return _rounds(*inits, *docs, tables, terms, scale)

  group_tables = tuple(jnp.asarray(table_groups(x)) for x in tables)
  out = jax.lax.map(jax.checkpoint(one_group),
                    (*jax.tree.map(to_groups, (inits, docs)), group_tables))
  return jax.tree.map(from_groups, out)


def blockwise(q, k, v, w, beta, g, doc, *, scale, chunk: int):
  """``chunk_path_attn``'s work on validated inputs, ``doc [B, T]`` a
  document index or None. Returns ``(terms, o [B, T, H, V], lse [B, T,
  H], q_first [B, T, H, K], gate_first [B, T, H] or None)``, float32 (see
  ``attend_chunks``)."""
  b, t, h, _ = q.shape
  c = min(chunk, t)
  terms = chunk_terms(q, k, v, w, beta, g, doc, c)
  outs = attend_chunks(terms, scale)

  def tokens(x):                    # [B, N, h, g, C, ...] -> [B, T, H, ...]
    if x is None:
      return None
    x = jnp.moveaxis(x, 4, 2)                                   # [B,N,C,h,g,..]
    return x.reshape((b, -1, h) + x.shape[5:])[:, :t]

  return (terms,) + tuple(tokens(x) for x in outs)


@context_parallel.splits_sequence(lambda: split.context_parallel_path_attn)
def chunk_path_attn(q, k, v, w, beta, g=None, *, scale=None,
                    segment_ids=None, chunk_size=64):
  """Blockwise PaTH attention; never forms ``[T, T]``.

  Arguments and result as in ``parallel_path_attn``, plus:
    chunk_size: ``C``, tokens per chunk of the UT transform and per block
      of the online softmax (speed and memory only).

  Example:
    >>> q = jnp.ones((1, 70, 4, 8)); k = v = jnp.ones((1, 70, 2, 8))
    >>> w = jnp.ones((1, 70, 2, 8)) / 8 ** 0.5; beta = jnp.ones((1, 70, 2))
    >>> chunk_path_attn(q, k, v, w, beta, chunk_size=16).shape
    (1, 70, 4, 8)
  """
  b, t, _, _, dk, _ = validate(q, k, v, w, beta, g, segment_ids)
  checks.positive_int("chunk_size", chunk_size)
  doc = None if segment_ids is None else document_index(segment_ids, b, t)
  _, o, _, _, _ = blockwise(q, k, v, w, beta, g, doc,
                            scale=default_scale(scale, dk), chunk=chunk_size)
  return o.astype(v.dtype)


def sequence_summary(terms: ChunkTerms, length: int):
  """What the tokens after a sequence need of it.

  Returns ``(keys [B, T, Hkv, K], gate [B, T, H] or None, product [B, Hkv,
  K, K], total [B, H] or None)``: every key moved across every later
  reflection of the sequence (``H_T ... H_{j+1} k_j``, the decoding cache
  after it), the log-gates from after each token to the end, the product
  ``H_T ... H_1`` as a dense matrix, and the sum of all log-gates. A
  ``lax.scan`` back over the chunks carries the dense product of the
  chunks after the current one (``O(K^2)`` per head, ``O(T K)`` work per
  key channel).
  """
  b, n, hkv, c, dk = terms.k_end.shape

  def back(later, xs):
    k_n, w_n, r_n = xs
    keys = _mm("bhjl,bhkl->bhjk", k_n, later)                   # [B, h, C, K]
    # later <- later (I - W_n^T R_n)
    later = later - _mm("bhkn,bhnl->bhkl",
                        _mm("bhkl,bhnl->bhkn", later, w_n), r_n)
    return later, keys

  eye = jnp.broadcast_to(jnp.eye(dk, dtype=_F32), (b, hkv, dk, dk))
  product, keys = jax.lax.scan(
      back, eye, tuple(jnp.moveaxis(x, 1, 0)
                       for x in (terms.k_end, terms.w, terms.r)),
      reverse=True)                                             # [N,B,h,C,K]
  keys = keys.transpose(1, 0, 3, 2, 4).reshape(b, n * c, hkv, dk)[:, :length]
  gate = total = None
  if terms.gate_out is not None:
    after = exclusive_suffix_sums(terms.gate_total, axis=1)     # [B,N,h,g]
    gate = terms.gate_out + after[..., None]                    # [B,N,h,g,C]
    gate = jnp.moveaxis(gate, 4, 2).reshape(b, n * c, -1)[:, :length]
    total = jnp.sum(terms.gate_total, axis=1).reshape(b, -1)    # [B, H]
  return keys, gate, product, total
