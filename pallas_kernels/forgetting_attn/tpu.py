"""Mosaic (TPU) kernels of forgetting attention: forward, dq, dk/dv.

Each kernel's grid ends with the walk over the blocks of the other kind,
marked "arbitrary" (sequential), with float32 accumulators in VMEM scratch
that persist across its steps. The walk has as many steps as the longest
one (``layout.Walk.steps``); its block indices come from the first (or
last) block of each program, a scalar-prefetched array that holds the
document bounds (``layout.key_bounds``, ``layout.query_bounds``). Steps past
a program's last block compute nothing and keep the previous block index,
so their blocks are not fetched again.

- ``forward``: grid ``(B, H, query blocks, steps)``, the key blocks from the
  first visible one to the diagonal; ``o`` and the row log-sum-exp.
- ``dq``: the same grid with the backward tiles; ``dq`` and ``dc``'s row
  sums.
- ``dkv``: grid ``(B, Hkv, key blocks, G * steps)``, every query head of
  the group in turn, each over its query blocks from the diagonal to the
  last that sees the key block; ``dk`` and ``dv`` summed over the group in
  scratch, ``dc``'s column sums per query head (written when the head
  changes).

Token blocks are ``[block, F]`` tiles of ``[B, T, H F]`` at lane block
``h`` (``layout.py``); per-token values are rows ``[1, block]``, turned into
columns ``[block, 1]`` by a transpose where the scores need them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import compiler
from pallas_kernels.forgetting_attn import block_math as bm
from pallas_kernels.forgetting_attn.layout import Layout, Walk

_F32 = jnp.float32


class _Specs:
  """Block specs of a kernel's arrays from two index maps of its grid (and
  bounds ref), ``query_at`` and ``key_at``, each ``-> (b, query head,
  block)``: the query block and the key block of a grid step. Key and value
  blocks are those of the query head's key head."""

  def __init__(self, query_at, key_at, lay: Layout, block_q: int,
               block_k: int):
    self.query_at, self.key_at, self.lay = query_at, key_at, lay
    self.block_q, self.block_k = block_q, block_k

  def queries(self, width: int):
    """A ``[block_q, width]`` tile of ``[B, T, H width]``."""
    def index(*grid):
      b, h, n = self.query_at(*grid)
      return b, n, h
    return pl.BlockSpec((None, self.block_q, width), index)

  def keys(self, width: int):
    """A ``[block_k, width]`` tile of ``[B, T, Hkv width]``."""
    def index(*grid):
      b, h, n = self.key_at(*grid)
      return b, n, _div(h, self.lay.groups)
    return pl.BlockSpec((None, self.block_k, width), index)

  def query_rows(self):
    """A row ``[1, block_q]`` of per-token values ``[B, H, 1, T]``."""
    def index(*grid):
      b, h, n = self.query_at(*grid)
      return b, h, 0, n
    return pl.BlockSpec((None, None, 1, self.block_q), index)

  def key_rows(self):
    """A row ``[1, block_k]`` of per-token values ``[B, H, 1, T]``."""
    def index(*grid):
      b, h, n = self.key_at(*grid)
      return b, h, 0, n
    return pl.BlockSpec((None, None, 1, self.block_k), index)

  def documents(self):
    """The rows ``[1, block_q]`` and ``[1, block_k]`` of the documents
    ``[B, 1, T]``."""
    def query_index(*grid):
      b, _, n = self.query_at(*grid)
      return b, 0, n

    def key_index(*grid):
      b, _, n = self.key_at(*grid)
      return b, 0, n
    return [pl.BlockSpec((None, 1, self.block_q), query_index),
            pl.BlockSpec((None, 1, self.block_k), key_index)]

  def inputs(self, arrays, names, documents: bool):
    """``[(array, spec)]`` of the named inputs, then the documents'."""
    spec_of = {"q": lambda: self.queries(self.lay.k_pad),
               "k": lambda: self.keys(self.lay.k_pad),
               "v": lambda: self.keys(self.lay.v_pad),
               "do": lambda: self.queries(self.lay.v_pad),
               "c_q": self.query_rows, "c_k": self.key_rows,
               "lse": self.query_rows, "delta": self.query_rows}
    out = [(arrays[name.split("_")[0]], spec_of[name]()) for name in names]
    if documents:
      out += [(arrays["doc"], s) for s in self.documents()]
    return out


def _div(a, n: int):
  """``a // n`` of a traced non-negative int (truncating division, which
  lowers without querying the TPU generation)."""
  return jax.lax.div(a, n)


def _positions(start, n: int, axis: int):
  """int32 ``start + [0, n)`` as a column (``axis`` 0) or a row (1)."""
  shape = (n, 1) if axis == 0 else (1, n)
  return start + jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _call(kernel, *, grid, bounds, inputs, outputs, scratch, name, cost,
          interpret):
  """``pallas_call`` of ``kernel`` with one scalar-prefetched bounds array;
  ``inputs``: ``[(array, spec)]``; ``outputs``: ``[(ShapeDtypeStruct,
  spec)]``; ``scratch``: ``[(shape, dtype)]``."""
  window_bytes = sum(compiler.block_bytes(s.block_shape, x.dtype)
                     for x, s in inputs + outputs)
  scratch_bytes = sum(compiler.nbytes(shape, dtype)
                      for shape, dtype in scratch)
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=grid,
          in_specs=[s for _, s in inputs], out_specs=[s for _, s in outputs],
          scratch_shapes=[pltpu.VMEM(shape, dtype)
                          for shape, dtype in scratch]),
      out_shape=[x for x, _ in outputs],
      compiler_params=compiler.tpu_params(
          3, window_bytes=window_bytes, scratch_bytes=scratch_bytes),
      cost_estimate=cost, interpret=interpret, name=name,
  )(bounds, *[x for x, _ in inputs])


def _split(refs, documents: bool, n_inputs: int):
  """``(inputs, docs or (None, None), rest)`` of a kernel's refs, where
  the two document refs, if any, follow the first ``n_inputs`` inputs."""
  inputs, rest = refs[:n_inputs], refs[n_inputs:]
  if documents:
    return inputs, rest[:2], rest[2:]
  return inputs, (None, None), rest


def _column(ref):
  """A row ref ``[1, n]`` as a column ``[n, 1]``."""
  return ref[...].T


def _forward_kernel(first_ref, *refs, spec: bm.Spec, walk: Walk,
                    blocks: int):
  (q_ref, k_ref, v_ref, cq_ref, ck_ref), (docq_ref, dock_ref), rest = _split(
      refs, spec.documents, 5)
  o_ref, lse_ref, m_sc, l_sc, acc_sc = rest
  b, qb, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  kb = first_ref[b * blocks + qb] + j

  @pl.when(j == 0)
  def _():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, _F32)
    l_sc[...] = jnp.zeros(l_sc.shape, _F32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, _F32)

  @pl.when(kb <= _div((qb + 1) * walk.own - 1, walk.step))
  def _():
    s = bm.scores(spec, q_ref[...], k_ref[...], _column(cq_ref),
                  ck_ref[...])                                  # [bq, bk]
    mask = bm.visible(
        spec, _positions(qb * walk.own, walk.own, 0),
        _positions(kb * walk.step, walk.step, 1),
        None if docq_ref is None else _column(docq_ref),
        None if dock_ref is None else dock_ref[...])
    m, l, acc = bm.online_step(spec, s, mask, m_sc[...], l_sc[...],
                               acc_sc[...], v_ref[...])
    m_sc[...] = m
    l_sc[...] = l
    acc_sc[...] = acc                                           # [bq, V]

  @pl.when(j == walk.steps - 1)
  def _():
    o, lse = bm.finish(m_sc[...], l_sc[...], acc_sc[...])
    o_ref[...] = o.astype(o_ref.dtype)
    lse_ref[...] = lse.T                                        # [1, bq]


def _walk_over_keys(lay: Layout, walk: Walk) -> _Specs:
  """The specs of a grid ``(b, h, query block, j)`` whose step ``j``
  visits key block ``first + j``, held at the diagonal past it (so that no
  block is fetched again)."""
  blocks = lay.t_pad // walk.own

  def query_at(b, h, qb, j, first_ref):
    return b, h, qb

  def key_at(b, h, qb, j, first_ref):
    return b, h, jnp.minimum(first_ref[b * blocks + qb] + j,
                             _div((qb + 1) * walk.own - 1, walk.step))
  return _Specs(query_at, key_at, lay, walk.own, walk.step)


def forward(arrays, first, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
            interpret: bool = False):
  """``(o [B, T_pad, H V_pad], lse [B, H, 1, T_pad] float32)``;
  ``arrays``: ``q``, ``k``, ``v`` (``[B, T_pad, Hx F]``), ``c`` (rows) and
  ``doc`` (or None); ``first``: ``layout.key_bounds`` of ``walk``."""
  specs = _walk_over_keys(lay, walk)
  b, t, h, bq = lay.batch, lay.t_pad, lay.heads, walk.own
  outputs = [
      (jax.ShapeDtypeStruct((b, t, h * lay.v_pad), arrays["v"].dtype),
       specs.queries(lay.v_pad)),
      (jax.ShapeDtypeStruct((b, h, 1, t), _F32), specs.query_rows())]
  kernel = functools.partial(_forward_kernel, spec=spec, walk=walk,
                             blocks=t // bq)
  return _call(kernel, grid=(b, h, t // bq, walk.steps), bounds=first,
               inputs=specs.inputs(arrays, ("q", "k", "v", "c_q", "c_k"),
                                   spec.documents),
               outputs=outputs,
               scratch=[((bq, 1), _F32), ((bq, 1), _F32),
                        ((bq, lay.v_pad), _F32)],
               name="forgetting_attn_fwd", cost=cost, interpret=interpret)


_BACKWARD_INPUTS = ("q", "k", "v", "do", "c_q", "c_k", "lse", "delta")


def _dq_kernel(first_ref, *refs, spec: bm.Spec, walk: Walk, blocks: int):
  (q_ref, k_ref, v_ref, do_ref, cq_ref, ck_ref, lse_ref, delta_ref), (
      docq_ref, dock_ref), rest = _split(refs, spec.documents, 8)
  dq_ref, dc_ref, dq_sc, dc_sc = rest
  b, qb, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  kb = first_ref[b * blocks + qb] + j

  @pl.when(j == 0)
  def _():
    dq_sc[...] = jnp.zeros(dq_sc.shape, _F32)
    dc_sc[...] = jnp.zeros(dc_sc.shape, _F32)

  @pl.when(kb <= _div((qb + 1) * walk.own - 1, walk.step))
  def _():
    k = k_ref[...]
    s = bm.scores(spec, q_ref[...], k, _column(cq_ref), ck_ref[...])
    mask = bm.visible(
        spec, _positions(qb * walk.own, walk.own, 0),
        _positions(kb * walk.step, walk.step, 1),
        None if docq_ref is None else _column(docq_ref),
        None if dock_ref is None else dock_ref[...])
    p = bm.probabilities(s, mask, _column(lse_ref))             # [bq, bk]
    dp = bm.dot(do_ref[...], v_ref[...], bm.NT, spec)           # [bq, bk]
    ds = bm.score_grads(p, dp, _column(delta_ref))
    dq_sc[...] += bm.dot(ds, k, bm.NN, spec)                    # [bq, K]
    dc_sc[...] += jnp.sum(ds, axis=1, keepdims=True)            # [bq, 1]

  @pl.when(j == walk.steps - 1)
  def _():
    dq_ref[...] = (spec.scale * dq_sc[...]).astype(dq_ref.dtype)
    dc_ref[...] = dc_sc[...].T                                  # [1, bq]


def dq(arrays, first, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
       interpret: bool = False):
  """``(dq [B, T_pad, H K_pad], dc row sums [B, H, 1, T_pad] float32)``;
  ``arrays`` as ``forward``'s plus ``do``, ``lse`` and ``delta`` (rows)."""
  specs = _walk_over_keys(lay, walk)
  b, t, h, bq = lay.batch, lay.t_pad, lay.heads, walk.own
  outputs = [
      (jax.ShapeDtypeStruct((b, t, h * lay.k_pad), arrays["q"].dtype),
       specs.queries(lay.k_pad)),
      (jax.ShapeDtypeStruct((b, h, 1, t), _F32), specs.query_rows())]
  kernel = functools.partial(_dq_kernel, spec=spec, walk=walk, blocks=t // bq)
  return _call(kernel, grid=(b, h, t // bq, walk.steps), bounds=first,
               inputs=specs.inputs(arrays, _BACKWARD_INPUTS, spec.documents),
               outputs=outputs,
               scratch=[((bq, lay.k_pad), _F32), ((bq, 1), _F32)],
               name="forgetting_attn_dq", cost=cost, interpret=interpret)


def _dkv_kernel(last_ref, *refs, spec: bm.Spec, walk: Walk, blocks: int):
  (q_ref, k_ref, v_ref, do_ref, cq_ref, ck_ref, lse_ref, delta_ref), (
      docq_ref, dock_ref), rest = _split(refs, spec.documents, 8)
  dk_ref, dv_ref, dc_ref, dk_sc, dv_sc, dc_sc = rest
  b, kb, step = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  j = jax.lax.rem(step, walk.steps)
  qb = _div(kb * walk.own, walk.step) + j

  @pl.when(step == 0)
  def _():
    dk_sc[...] = jnp.zeros(dk_sc.shape, _F32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, _F32)

  @pl.when(j == 0)
  def _():
    dc_sc[...] = jnp.zeros(dc_sc.shape, _F32)

  @pl.when(qb <= last_ref[b * blocks + kb])
  def _():
    q, do = q_ref[...], do_ref[...]
    st = bm.scores(spec, k_ref[...], q, cq_ref[...], _column(ck_ref))
    mask = bm.visible(
        spec, _positions(qb * walk.step, walk.step, 1),
        _positions(kb * walk.own, walk.own, 0),
        None if docq_ref is None else docq_ref[...],
        None if dock_ref is None else _column(dock_ref))
    pt = bm.probabilities(st, mask, lse_ref[...])               # [bk, bq]
    dpt = bm.dot(v_ref[...], do, bm.NT, spec)                   # [bk, bq]
    dst = bm.score_grads(pt, dpt, delta_ref[...])
    dv_sc[...] += bm.dot(pt, do, bm.NN, spec)                   # [bk, V]
    dk_sc[...] += bm.dot(dst, q, bm.NN, spec)                   # [bk, K]
    dc_sc[...] -= jnp.sum(dst, axis=1, keepdims=True)           # [bk, 1]

  @pl.when(j == walk.steps - 1)
  def _():
    dc_ref[...] = dc_sc[...].T                                  # [1, bk]

  @pl.when(step == pl.num_programs(3) - 1)
  def _():
    dk_ref[...] = (spec.scale * dk_sc[...]).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def dkv(arrays, last, spec: bm.Spec, lay: Layout, walk: Walk, *, cost,
        interpret: bool = False):
  """``(dk [B, T_pad, Hkv K_pad], dv [B, T_pad, Hkv V_pad], dc column sums
  [B, H, 1, T_pad] float32)``; ``arrays`` as ``dq``'s; ``last``:
  ``layout.query_bounds`` of ``walk``. Grid ``(b, key head, key block,
  s)``: step ``s`` visits query head ``s // steps`` of the group and its
  query block ``first + s % steps``, held at the last one past it."""
  g, steps, bk = lay.groups, walk.steps, walk.own
  blocks = lay.t_pad // bk

  def query_at(b, hk, kb, s, last_ref):
    qb = jnp.minimum(_div(kb * bk, walk.step) + jax.lax.rem(s, steps),
                     last_ref[b * blocks + kb])
    return b, hk * g + _div(s, steps), qb

  def key_at(b, hk, kb, s, last_ref):
    return b, hk * g + _div(s, steps), kb

  specs = _Specs(query_at, key_at, lay, walk.step, bk)
  b, t, hkv = lay.batch, lay.t_pad, lay.kv_heads
  outputs = [
      (jax.ShapeDtypeStruct((b, t, hkv * lay.k_pad), arrays["k"].dtype),
       specs.keys(lay.k_pad)),
      (jax.ShapeDtypeStruct((b, t, hkv * lay.v_pad), arrays["v"].dtype),
       specs.keys(lay.v_pad)),
      (jax.ShapeDtypeStruct((b, lay.heads, 1, t), _F32), specs.key_rows())]
  kernel = functools.partial(_dkv_kernel, spec=spec, walk=walk, blocks=blocks)
  return _call(kernel, grid=(b, hkv, blocks, g * steps), bounds=last,
               inputs=specs.inputs(arrays, _BACKWARD_INPUTS, spec.documents),
               outputs=outputs,
               scratch=[((bk, lay.k_pad), _F32), ((bk, lay.v_pad), _F32),
                        ((bk, 1), _F32)],
               name="forgetting_attn_dkv", cost=cost, interpret=interpret)
