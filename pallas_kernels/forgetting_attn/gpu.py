"""Triton (GPU) kernels of forgetting attention: forward, dq, dk/dv.

Triton programs have no scratch memory that persists across grid steps, so
each program walks the blocks of the other kind in a ``fori_loop`` with its
accumulators in registers, as JAX's and flash-linear-attention's Triton
attention kernels do:

- ``forward``: grid ``(query blocks, B, H)``, a query block ``[block_q, K]``
  against the key blocks from its first visible one
  (``layout.key_bounds``) to the diagonal; ``o`` and the log-sum-exp.
- ``dq``: the same with ``dq_block_q`` queries per program, stepping over
  ``backward_block_k`` keys; ``dq`` and ``dc``'s row sums.
- ``dkv``: grid ``(key blocks, B, Hkv)``, a key block against every query
  head of its group in turn, each over the query blocks from the diagonal
  to the last that sees the key block (``layout.query_bounds``); ``dk`` and
  ``dv`` summed over the group in registers, ``dc``'s column sums per query
  head.

Token arrays keep the public layout ``[B, T, H, F]``: a block of one head
is a strided load, the whole sequence of keys (or queries) of one head is
the program's block and the loop reads ``block`` rows of it at a time.
Per-token values are vectors (``[B, H, T]``, ``[B, T]``), read as a column
``x[:, None]`` or a row ``x[None, :]`` where the scores need them. The
query-block axis comes first in the grid, so the programs of one head run
together and share its keys in L2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import compiler
from pallas_kernels.forgetting_attn import block_math as bm
from pallas_kernels.forgetting_attn.layout import Layout, Walk

_F32 = jnp.float32


def _positions(start, n: int, axis: int):
  """int32 ``start + [0, n)`` as a column (``axis`` 0) or a row (1)."""
  shape = (n, 1) if axis == 0 else (1, n)
  return start + lax.broadcasted_iota(jnp.int32, shape, axis)


def _documents(refs, documents: bool):
  """``(doc ref or None, outputs)`` of the refs after a kernel's other
  inputs."""
  return (refs[0], refs[1:]) if documents else (None, refs)


def _call(kernel, *, grid, inputs, outputs, lay: Layout, name, cost,
          interpret):
  return pl.pallas_call(
      kernel, grid=grid, in_specs=[s for _, s in inputs],
      out_specs=[s for _, s in outputs], out_shape=[x for x, _ in outputs],
      compiler_params=compiler.gpu_params(lay.tiles.num_warps,
                                          lay.tiles.num_stages),
      cost_estimate=cost, interpret=interpret, name=name,
  )(*[x for x, _ in inputs])


def _whole(x):
  """The whole of a small array as every program's block."""
  return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


class _QueryBlock:
  """What a query block's program reads once (``forward`` and ``dq``: grid
  ``(query blocks, B, H)``), and the key blocks it walks."""

  def __init__(self, c_ref, doc_ref, spec: bm.Spec, walk: Walk):
    qb = pl.program_id(0)
    bq = walk.own
    rows = pl.ds(qb * bq, bq)
    self.spec, self.walk, self.doc_ref, self.c_ref = spec, walk, doc_ref, c_ref
    self.c = c_ref[rows][:, None]                               # [bq, 1]
    self.pos = _positions(qb * bq, bq, 0)
    self.doc = None if doc_ref is None else doc_ref[rows][:, None]

  def scores(self, q, k, kb):
    """``(s, visible)`` ``[bq, bk]`` of key block ``kb`` (keys ``k``)."""
    bk = self.walk.step
    cols = pl.ds(kb * bk, bk)
    s = bm.scores(self.spec, q, k, self.c, self.c_ref[cols][None, :])
    mask = bm.visible(
        self.spec, self.pos, _positions(kb * bk, bk, 1), self.doc,
        None if self.doc_ref is None else self.doc_ref[cols][None, :])
    return s, mask

  def walk_keys(self, first_ref, blocks: int, body, init):
    """``body`` over the key blocks this query block sees, from its first
    (``first_ref``: ``layout.key_bounds``) to the one of its last query."""
    qb, b = pl.program_id(0), pl.program_id(1)
    bq, bk = self.walk.own, self.walk.step
    return lax.fori_loop(first_ref[b * blocks + qb],
                         lax.div((qb + 1) * bq - 1, bk) + 1, body, init)


def _forward_kernel(first_ref, q_ref, k_ref, v_ref, c_ref, *refs,
                    spec: bm.Spec, walk: Walk, blocks: int):
  doc_ref, (o_ref, lse_ref) = _documents(refs, spec.documents)
  block = _QueryBlock(c_ref, doc_ref, spec, walk)
  bq, bk = walk.own, walk.step
  q = q_ref[...]                                                # [bq, K]

  def body(kb, carry):
    cols = pl.ds(kb * bk, bk)
    s, mask = block.scores(q, k_ref[cols, :], kb)
    return bm.online_step(spec, s, mask, *carry, v_ref[cols, :])

  init = (jnp.full((bq, 1), -jnp.inf, _F32), jnp.zeros((bq, 1), _F32),
          jnp.zeros((bq, v_ref.shape[-1]), _F32))
  o, lse = bm.finish(*block.walk_keys(first_ref, blocks, body, init))
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = lse[:, 0]


def _query_inputs(arrays, first, spec: bm.Spec, lay: Layout, walk: Walk,
                  blocks=(), rows=()):
  """The inputs of a query-block kernel (grid ``(query blocks, B, H)``), in
  its arguments' order: ``first``, its block of ``q``, every key and value
  of its group, the query blocks of ``blocks`` (``[B, T_pad, H, F]``, as
  q's), the gates' row, the query rows of ``rows`` (``[B, H, T_pad]``)
  and the documents."""
  bq, g, t = walk.own, lay.groups, lay.t_pad
  group = lambda qb, b, h: (b, 0, lax.div(h, g), 0)  # noqa: E731

  def block(name):
    x = arrays[name]
    return x, pl.BlockSpec((None, bq, None, x.shape[-1]), _q_block)

  inputs = [
      (first, _whole(first)), block("q"),
      (arrays["k"], pl.BlockSpec((None, t, None, lay.k_pad), group)),
      (arrays["v"], pl.BlockSpec((None, t, None, lay.v_pad), group)),
      *(block(n) for n in blocks),
      (arrays["c"], pl.BlockSpec((None, None, t),
                                 lambda qb, b, h: (b, h, 0))),
      *((arrays[n], pl.BlockSpec((None, None, bq), _q_row)) for n in rows)]
  if spec.documents:
    inputs.append((arrays["doc"], pl.BlockSpec((None, t),
                                               lambda qb, b, h: (b, 0))))
  return inputs


def _q_block(qb, b, h):
  return (b, qb, h, 0)


def _q_row(qb, b, h):
  return (b, h, qb)


def forward(arrays, first, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
            interpret: bool = False):
  """``(o [B, T_pad, H, V_pad], lse [B, H, T_pad] float32)``; ``arrays``:
  ``q``, ``k``, ``v`` (``[B, T_pad, Hx, F]``), ``c`` (rows) and ``doc`` (or
  None); ``first``: ``layout.key_bounds`` of ``walk``."""
  bq, t = walk.own, lay.t_pad
  blocks = t // bq
  inputs = _query_inputs(arrays, first, spec, lay, walk)
  b, h = lay.batch, lay.heads
  outputs = [
      (jax.ShapeDtypeStruct((b, t, h, lay.v_pad), arrays["v"].dtype),
       pl.BlockSpec((None, bq, None, lay.v_pad), _q_block)),
      (jax.ShapeDtypeStruct((b, h, t), _F32),
       pl.BlockSpec((None, None, bq), _q_row))]
  kernel = functools.partial(_forward_kernel, spec=spec, walk=walk,
                             blocks=blocks)
  return _call(kernel, grid=(blocks, b, h), inputs=inputs, outputs=outputs,
               lay=lay, name="forgetting_attn_fwd", cost=cost,
               interpret=interpret)


def _dq_kernel(first_ref, q_ref, k_ref, v_ref, do_ref, c_ref, lse_ref,
               delta_ref, *refs, spec: bm.Spec, walk: Walk, blocks: int):
  doc_ref, (dq_ref, dc_ref) = _documents(refs, spec.documents)
  block = _QueryBlock(c_ref, doc_ref, spec, walk)
  bq, bk = walk.own, walk.step
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]

  def body(kb, carry):
    dq, dc = carry
    cols = pl.ds(kb * bk, bk)
    k = k_ref[cols, :]
    s, mask = block.scores(q, k, kb)                            # [bq, bk]
    p = bm.probabilities(s, mask, lse)
    ds = bm.score_grads(p, bm.dot(do, v_ref[cols, :], bm.NT, spec), delta)
    return (dq + bm.dot(ds, k, bm.NN, spec),                    # [bq, K]
            dc + jnp.sum(ds, axis=1, keepdims=True))            # [bq, 1]

  init = (jnp.zeros((bq, q_ref.shape[-1]), _F32), jnp.zeros((bq, 1), _F32))
  dq, dc = block.walk_keys(first_ref, blocks, body, init)
  dq_ref[...] = (spec.scale * dq).astype(dq_ref.dtype)
  dc_ref[...] = dc[:, 0]


def dq(arrays, first, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
       interpret: bool = False):
  """``(dq [B, T_pad, H, K_pad], dc row sums [B, H, T_pad] float32)``;
  ``arrays`` as ``forward``'s plus ``do``, ``lse`` and ``delta`` (rows)."""
  bq, t = walk.own, lay.t_pad
  blocks = t // bq
  inputs = _query_inputs(arrays, first, spec, lay, walk, blocks=("do",),
                         rows=("lse", "delta"))
  b, h = lay.batch, lay.heads
  outputs = [
      (jax.ShapeDtypeStruct((b, t, h, lay.k_pad), arrays["q"].dtype),
       pl.BlockSpec((None, bq, None, lay.k_pad), _q_block)),
      (jax.ShapeDtypeStruct((b, h, t), _F32),
       pl.BlockSpec((None, None, bq), _q_row))]
  kernel = functools.partial(_dq_kernel, spec=spec, walk=walk, blocks=blocks)
  return _call(kernel, grid=(blocks, b, h), inputs=inputs, outputs=outputs,
               lay=lay, name="forgetting_attn_dq", cost=cost,
               interpret=interpret)


def _dkv_kernel(last_ref, q_ref, k_ref, v_ref, do_ref, c_ref, lse_ref,
                delta_ref, *refs, spec: bm.Spec, walk: Walk, blocks: int,
                groups: int):
  doc_ref, (dk_ref, dv_ref, dc_ref) = _documents(refs, spec.documents)
  kb, b = pl.program_id(0), pl.program_id(1)
  bk, bq = walk.own, walk.step
  rows = pl.ds(kb * bk, bk)
  k, v = k_ref[...], v_ref[...]                                 # [bk, F]
  pos_k = _positions(kb * bk, bk, 0)
  doc_k = None if doc_ref is None else doc_ref[rows][:, None]
  first, last = lax.div(kb * bk, bq), last_ref[b * blocks + kb]

  def head(g, carry):
    c_k = c_ref[g, rows][:, None]

    def body(qb, carry):
      dk, dv, dc = carry
      cols = pl.ds(qb * bq, bq)
      q, do = q_ref[cols, g, :], do_ref[cols, g, :]
      st = bm.scores(spec, k, q, c_ref[g, cols][None, :], c_k)  # [bk, bq]
      mask = bm.visible(spec, _positions(qb * bq, bq, 1), pos_k,
                        None if doc_ref is None else doc_ref[cols][None, :],
                        doc_k)
      pt = bm.probabilities(st, mask, lse_ref[g, cols][None, :])
      dst = bm.score_grads(pt, bm.dot(v, do, bm.NT, spec),
                           delta_ref[g, cols][None, :])
      return (dk + bm.dot(dst, q, bm.NN, spec),                 # [bk, K]
              dv + bm.dot(pt, do, bm.NN, spec),                 # [bk, V]
              dc - jnp.sum(dst, axis=1, keepdims=True))         # [bk, 1]

    dk, dv, dc = lax.fori_loop(first, last + 1, body,
                               (*carry, jnp.zeros((bk, 1), _F32)))
    dc_ref[g, :] = dc[:, 0]
    return dk, dv

  dk, dv = lax.fori_loop(0, groups, head,
                         (jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32)))
  dk_ref[...] = (spec.scale * dk).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def dkv(arrays, last, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
        interpret: bool = False):
  """``(dk [B, T_pad, Hkv, K_pad], dv [B, T_pad, Hkv, V_pad], dc column
  sums [B, H, T_pad] float32)``; ``arrays`` as ``dq``'s; ``last``:
  ``layout.query_bounds`` of ``walk``."""
  bk, g, t = walk.own, lay.groups, lay.t_pad
  blocks = t // bk
  k_block = lambda kb, b, hk: (b, kb, hk, 0)  # noqa: E731
  group = lambda kb, b, hk: (b, 0, hk, 0)  # noqa: E731
  group_rows = lambda kb, b, hk: (b, hk, 0)  # noqa: E731
  inputs = [
      (last, _whole(last)),
      (arrays["q"], pl.BlockSpec((None, t, g, lay.k_pad), group)),
      (arrays["k"], pl.BlockSpec((None, bk, None, lay.k_pad), k_block)),
      (arrays["v"], pl.BlockSpec((None, bk, None, lay.v_pad), k_block)),
      (arrays["do"], pl.BlockSpec((None, t, g, lay.v_pad), group)),
      (arrays["c"], pl.BlockSpec((None, g, t), group_rows)),
      (arrays["lse"], pl.BlockSpec((None, g, t), group_rows)),
      (arrays["delta"], pl.BlockSpec((None, g, t), group_rows))]
  if spec.documents:
    inputs.append((arrays["doc"], pl.BlockSpec((None, t),
                                               lambda kb, b, hk: (b, 0))))
  b, hkv = lay.batch, lay.kv_heads
  outputs = [
      (jax.ShapeDtypeStruct((b, t, hkv, lay.k_pad), arrays["k"].dtype),
       pl.BlockSpec((None, bk, None, lay.k_pad), k_block)),
      (jax.ShapeDtypeStruct((b, t, hkv, lay.v_pad), arrays["v"].dtype),
       pl.BlockSpec((None, bk, None, lay.v_pad), k_block)),
      (jax.ShapeDtypeStruct((b, lay.heads, t), _F32),
       pl.BlockSpec((None, g, bk), lambda kb, b, hk: (b, hk, kb)))]
  kernel = functools.partial(_dkv_kernel, spec=spec, walk=walk, blocks=blocks,
                             groups=g)
  return _call(kernel, grid=(blocks, b, hkv), inputs=inputs, outputs=outputs,
               lay=lay, name="forgetting_attn_dkv", cost=cost,
               interpret=interpret)
