"""Chunk-parallel Triton (GPU) kernels of the gated-linear recurrence.

The work is split as flash-linear-attention splits its chunk kernels
(``chunk_fwd_h`` / ``chunk_fwd_o`` / ``chunk_bwd_dh`` / ``chunk_bwd_dqkwg``);
the math of one chunk is ``chunk_math.py``:

- ``sweep`` (grid ``(B, H, KB * VB)``): the only sequential pass. A program
  owns a ``[block_k, block_v]`` tile of the float32 state and walks the
  chunks, one ``[C, block_k]^T [C, block_v]`` matmul each. Forward: it
  writes the state entering every chunk (``h``), and the final state.
  Backward: the same loop from the last chunk with ``q`` and ``do`` in place
  of ``k`` and ``v`` writes the gradient of the state leaving every chunk
  (``dh``), and the initial state's gradient.
- ``outputs`` (grid ``(B, H, N * VB)``): every chunk at once, ``o =
  scale [(read exp(P) q) h_n + scores v]``; the ``[C, C]`` scores once per
  chunk and value block (one block for ``V <= block_v_out``).
- ``grads`` (grid ``(B, H, N)``): every chunk at once, ``dq``, ``dk``,
  ``dv`` and the per-token terms of the log-decays' gradient, from ``h_n``,
  ``dh_n`` and the chunk's inputs.

The backward pass stores nothing from the forward pass but its inputs: it
reruns the forward sweep for ``h`` (one ``2 T K V`` pass per head, where
keeping ``h`` would hold ``B H T / C K V`` values per layer until the
backward pass) and recomputes the scores.

Arrays keep the public layout ``[B, T, H, F]`` (blocks of one chunk and
one head are strided loads; no transposes): T is zero-padded to whole
chunks only when it is not a multiple of ``C``, K and V to a power of two
>= 16. ``h`` and ``dh`` are ``[B, H, N, K, V]``, in bfloat16 for bfloat16
inputs (their consumers multiply bfloat16 operands) and float32 otherwise.

Log-decays enter as their chunk-local double-float prefix sums ``P = hi +
lo`` (``common/cumsum.py``): ``[B, T, H]`` for a scalar decay per head,
``[B, T, H, K]`` per key channel. Segment ids enter as the document index
of every token and of the token before its chunk (``[B, T]`` float32).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import compiler
from pallas_kernels.common.cumsum import chunk_cumsum
from pallas_kernels.common.layout import (documents, pad_to,
                                          power_of_two_at_least_16)
from pallas_kernels.gated_linear import chunk_math as cm
from pallas_kernels.gated_linear.block_sizes import BlockSizes

_F32 = jnp.float32
# Matmuls of float32 inputs: 3xTF32 (``common/dots.py``), float32 accuracy
# on the tensor cores (IEEE float32 on the CUDA cores held more registers
# and spilled in every kernel).
FLOAT32_MODE = "tf32x3"


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sizes of one call, and its tiles."""
  batch: int
  length: int      # T
  heads: int
  dim_k: int
  dim_v: int
  t_pad: int       # T rounded up to whole chunks
  k_pad: int       # K padded to a power of two >= 16
  v_pad: int
  chunk: int       # C
  sweep_k: int     # state tile of a sweep program
  sweep_v: int
  out_v: int       # value columns per outputs program
  inner_k: int     # key columns per step of the chunk kernels' loops
  inner_v: int     # value columns per step of the dq/dk kernel's loops
  num_warps: int
  num_stages: int

  @property
  def chunks(self) -> int:
    return self.t_pad // self.chunk


def make_layout(b, t, h, dk, dv, blocks: BlockSizes,
                direction: str = "forward", *, bf16: bool = True) -> Layout:
  """The layout of a call: ``direction`` ("forward" or "backward") picks
  the sweeps' state tiles, ``blocks.gpu_settings`` the chunk, the chunk
  kernels' column blocks and warps for the inputs' dtype (``bf16``)."""
  k_pad, v_pad = power_of_two_at_least_16(dk), power_of_two_at_least_16(dv)
  chunk, inner, warps, stages = blocks.gpu_settings(bf16=bf16, k_pad=k_pad,
                                                    v_pad=v_pad)
  bk, bv = blocks.features(direction)
  return Layout(b, t, h, dk, dv, -(-t // chunk) * chunk, k_pad, v_pad, chunk,
                min(bk, k_pad), min(bv, v_pad),
                min(blocks.output_block_v_or_default(), v_pad),
                min(inner, k_pad), min(inner, v_pad), warps, stages)


def setup(q, k, v, g, doc, blocks: BlockSizes, scale: float,
          direction: str = "forward"):
  """``(Layout, chunk_math.Spec)`` of a call: ``g`` ``[B, T, H, G]`` or
  None, ``doc`` the document index or None; bfloat16 matmul operands when
  q, k and v are bfloat16, else ``FLOAT32_MODE``."""
  b, t, h, dk = q.shape
  bf16 = all(x.dtype == jnp.bfloat16 for x in (q, k, v))
  lay = make_layout(b, t, h, dk, v.shape[-1], blocks, direction, bf16=bf16)
  spec = cm.Spec(gate=cm.gate_kind(g), segments=doc is not None,
                 scale=scale, chunk=lay.chunk,
                 mode="bf16" if bf16 else FLOAT32_MODE)
  return lay, spec


def _tokens(x, lay: Layout, width: int | None, dtype=None):
  """``[B, T, H(, F)]`` padded to ``[B, T_pad, H(, width)]``."""
  if x.ndim == 3:
    return pad_to(x, (lay.batch, lay.t_pad, lay.heads), dtype)
  return pad_to(x, (lay.batch, lay.t_pad, lay.heads, width), dtype)


def pad_state(state, lay: Layout):
  """``[B, H, K, V]`` -> ``[B, H, K_pad, V_pad]`` float32."""
  return pad_to(state, (lay.batch, lay.heads, lay.k_pad, lay.v_pad), _F32)


def prepare(q, k, v, g, doc, lay: Layout, spec: cm.Spec, do=None):
  """The kernels' inputs, by name: padded ``q``, ``k``, ``v`` (and ``do``)
  in the matmul dtype; ``p_hi``, ``p_lo`` (the gates' prefix sums) and
  ``doc``, ``doc_enter`` when present."""
  dtype = jnp.bfloat16 if spec.mode == "bf16" else _F32
  arrays = {"q": _tokens(q, lay, lay.k_pad, dtype),
            "k": _tokens(k, lay, lay.k_pad, dtype),
            "v": _tokens(v, lay, lay.v_pad, dtype)}
  if do is not None:
    arrays["do"] = _tokens(do, lay, lay.v_pad, dtype)
  if g is not None:
    g = g[..., 0] if spec.gate == "scalar" else g
    arrays["p_hi"], arrays["p_lo"] = chunk_cumsum(
        _tokens(g, lay, lay.k_pad, _F32), lay.chunk)
  if doc is not None:
    doc, before = documents(doc, lay.t_pad)                     # [B, T_pad]
    enter = before.reshape(lay.batch, lay.chunks, lay.chunk)[:, :, :1]
    arrays["doc"] = doc
    arrays["doc_enter"] = jnp.broadcast_to(
        enter, (lay.batch, lay.chunks, lay.chunk)).reshape(doc.shape)
  return arrays


def gate_at(r, index):
  """The gate's prefix sums at ``index`` (rows, or ``(rows, cols)`` per
  key channel)."""
  if "p_hi" not in r:
    return None
  if r["p_hi"].ndim == 1 and isinstance(index, tuple):
    index = index[0]                                  # a scalar decay
  if r["p_hi"].ndim == 2 and not isinstance(index, tuple):
    index = (index, slice(None))
  return cm.Gate(r["p_hi"][index], r["p_lo"][index])


def docs_at(r, spec, rows):
  if not spec.segments:
    return cm.docs(spec)
  return cm.docs(spec, r["doc"][rows], r["doc_enter"][rows])


def call(kernel, grid, inputs, outputs, lay: Layout, *, name, cost,
         interpret):
  """``pl.pallas_call`` of ``kernel(refs by name)``: ``inputs`` and
  ``outputs`` are ``{name: (array or ShapeDtypeStruct, BlockSpec)}``."""
  names = list(inputs) + list(outputs)
  outs = pl.pallas_call(
      lambda *refs: kernel(dict(zip(names, refs))),
      out_shape=[shape for shape, _ in outputs.values()], grid=grid,
      in_specs=[spec for _, spec in inputs.values()],
      out_specs=[spec for _, spec in outputs.values()],
      compiler_params=compiler.gpu_params(lay.num_warps, lay.num_stages),
      cost_estimate=cost, interpret=interpret, name=name)(
          *[x for x, _ in inputs.values()])
  return dict(zip(outputs, outs))


# Block specs. Sweep programs (b, h, p) own key block p // VB and value
# block p % VB over all T; chunk programs (b, h, p) one chunk.

def sweep_specs(lay: Layout):
  vb = lay.v_pad // lay.sweep_v
  t, bk, bv = lay.t_pad, lay.sweep_k, lay.sweep_v

  def kb_(p):
    return p // vb

  def vb_(p):
    return p % vb

  return {
      "k": pl.BlockSpec((None, t, None, bk), lambda b, h, p: (b, 0, h, kb_(p))),
      "v": pl.BlockSpec((None, t, None, bv), lambda b, h, p: (b, 0, h, vb_(p))),
      "gate_scalar": pl.BlockSpec((None, t, None), lambda b, h, p: (b, 0, h)),
      "gate_channel": pl.BlockSpec((None, t, None, bk),
                                   lambda b, h, p: (b, 0, h, kb_(p))),
      "doc": pl.BlockSpec((None, t), lambda b, h, p: (b, 0)),
      "state": pl.BlockSpec((None, None, bk, bv),
                            lambda b, h, p: (b, h, kb_(p), vb_(p))),
      "states": pl.BlockSpec((None, None, lay.chunks, bk, bv),
                             lambda b, h, p: (b, h, 0, kb_(p), vb_(p))),
  }


def _sweep_kernel(r, *, spec: cm.Spec, n_chunks: int, reverse: bool,
                  shape):
  c = spec.chunk
  x_name, y_name = ("q", "do") if reverse else ("k", "v")

  def body(i, s):
    n = n_chunks - 1 - i if reverse else i
    r["states"][n] = s.astype(r["states"].dtype)
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    p, d = gate_at(r, rows), docs_at(r, spec, rows)
    if reverse:
      w = cm.read_weights(p, d) * spec.scale
    else:
      w = cm.write_weights(p, d)
    x = cm.operand(r[x_name][rows, :].astype(_F32) * w, spec)  # [C, BK]
    decay = cm.carry_decay(p, d)                          # [] or [BK]
    if decay.ndim:
      decay = decay[:, None]
    return s * decay + cm.dot(x, r[y_name][rows, :], cm.TN, spec)

  s = (r["state_in"][...] if "state_in" in r else jnp.zeros(shape, _F32))
  s = lax.fori_loop(0, n_chunks, body, s)
  if "state_out" in r:
    r["state_out"][...] = s


def sweep_call(kernel, arrays, spec: cm.Spec, lay: Layout, named, *,
               state_in, state_out: bool, states_dtype, extra_outputs=None,
               name: str, cost, interpret: bool):
  """A sweep over chunks: programs ``(b, h, tile)`` over ``lay``'s state
  tiles, ``named`` inputs ``{name: (array, spec kind)}`` (kinds of
  ``sweep_specs``) plus the gates, documents and ``state_in``; outputs
  ``"states"`` (one per chunk), ``extra_outputs`` ``{name: (shape struct,
  spec kind)}`` and ``"state_out"`` (when asked for)."""
  specs = sweep_specs(lay)
  inputs = chunk_inputs(arrays, spec, specs, [], named)
  if state_in is not None:
    inputs["state_in"] = (state_in, specs["state"])
  b, h = lay.batch, lay.heads
  outputs = {"states": (jax.ShapeDtypeStruct(
      (b, h, lay.chunks, lay.k_pad, lay.v_pad), states_dtype),
      specs["states"])}
  for n, (shape, kind) in (extra_outputs or {}).items():
    outputs[n] = (shape, specs[kind])
  if state_out:
    outputs["state_out"] = (jax.ShapeDtypeStruct(
        (b, h, lay.k_pad, lay.v_pad), _F32), specs["state"])
  grid = (b, h, (lay.k_pad // lay.sweep_k) * (lay.v_pad // lay.sweep_v))
  if not isinstance(cost, pl.CostEstimate):
    cost = compiler.cost(flops=cost, transcendentals=0,
                         arrays=[x for x, _ in inputs.values()])
  return call(functools.partial(kernel, n_chunks=lay.chunks,
                                shape=(lay.sweep_k, lay.sweep_v)),
               grid, inputs, outputs, lay, name=name, cost=cost,
               interpret=interpret)


def sweep(arrays, spec: cm.Spec, lay: Layout, *,
          reverse: bool, state_in=None, state_out: bool, states_dtype, cost,
          interpret: bool):
  """Forward (``reverse=False``): ``{"states": h [B, H, N, K, V], "state_out":
  final state}``; backward: ``{"states": dh, "state_out": d_initial}``
  (``state_out`` only when asked for). ``state_in``: the initial state, or
  the final state's gradient, ``[B, H, K_pad, V_pad]`` float32."""
  x_name, y_name = ("q", "do") if reverse else ("k", "v")
  return sweep_call(
      functools.partial(_sweep_kernel, spec=spec, reverse=reverse), arrays,
      spec, lay, {x_name: (arrays[x_name], "k"),
                  y_name: (arrays[y_name], "v")},
      state_in=state_in, state_out=state_out, states_dtype=states_dtype,
      name="gated_linear_state_grads" if reverse else "gated_linear_states",
      cost=cost, interpret=interpret)


def chunk_specs(lay: Layout, v_blocks: int, v_width: int):
  """Specs of programs ``(b, h, p)`` that own chunk ``p // v_blocks`` and
  value block ``p % v_blocks`` (``v_width`` columns)."""
  c = lay.chunk

  def n_(p):
    return p // v_blocks

  def vb_(p):
    return p % v_blocks

  return {
      "k": pl.BlockSpec((None, c, None, lay.k_pad),
                        lambda b, h, p: (b, n_(p), h, 0)),
      "v": pl.BlockSpec((None, c, None, v_width),
                        lambda b, h, p: (b, n_(p), h, vb_(p))),
      "gate_scalar": pl.BlockSpec((None, c, None),
                                  lambda b, h, p: (b, n_(p), h)),
      "gate_channel": pl.BlockSpec((None, c, None, lay.k_pad),
                                   lambda b, h, p: (b, n_(p), h, 0)),
      "doc": pl.BlockSpec((None, c), lambda b, h, p: (b, n_(p))),
      "states": pl.BlockSpec((None, None, None, lay.k_pad, v_width),
                             lambda b, h, p: (b, h, n_(p), 0, vb_(p))),
  }


def chunk_inputs(arrays, spec: cm.Spec, specs, names, named=None):
  """A kernel's inputs ``{name: (array, BlockSpec)}``: ``arrays[name]`` for
  ``(name, spec kind)`` in ``names``, the ``named`` ``{name: (array, spec
  kind)}``, then the gates' prefix sums and the documents when the call
  has them."""
  inputs = {name: (arrays[name], specs[kind]) for name, kind in names}
  inputs.update({n: (x, specs[kind]) for n, (x, kind) in (named or {}).items()})
  if spec.gate != "none":
    inputs["p_hi"] = (arrays["p_hi"], specs["gate_" + spec.gate])
    inputs["p_lo"] = (arrays["p_lo"], specs["gate_" + spec.gate])
  if spec.segments:
    inputs["doc"] = (arrays["doc"], specs["doc"])
    inputs["doc_enter"] = (arrays["doc_enter"], specs["doc"])
  return inputs


def loop(n: int, body, init):
  """``body(j, carry)`` for ``j < n``: inline when ``n == 1``, else a
  ``fori_loop`` (one copy of the body, whatever the width)."""
  if n == 1:
    return body(0, init)
  return lax.fori_loop(0, n, body, init)


def column_block(j, width: int):
  """Column block ``j`` (static or traced) of ``width`` columns."""
  if isinstance(j, int):
    return pl.ds(j * width, width)
  return pl.ds(pl.multiple_of(j * width, width), width)


def _gate_rows(r, rows, cols) -> cm.Gate:
  return cm.Gate(r["p_hi"][rows, cols], r["p_lo"][rows, cols])


class RowBlock:
  """Row block ``b`` (``S = chunk_math.ROWS`` tokens) of a chunk with a
  decay per key channel, at the key columns ``cols``: its queries ``q``
  and gates ``p`` (``[S, BK]``, float32), loaded from the refs ``r["q"]``
  and the gates (the delta rule passes its keys as ``q``)."""

  def __init__(self, r, b: int, cols):
    s = cm.ROWS
    self.b, self.cols, self._r = b, cols, r
    self.ref = b * s - 1                        # R, the token before it
    rows = pl.ds(b * s, s)
    self.q = r["q"][rows, cols].astype(_F32)
    self.p = _gate_rows(r, rows, cols)

  def ref_gate(self) -> cm.Gate:
    """``P_R`` ``[1, BK]`` (blocks past the first)."""
    return _gate_rows(self._r, pl.ds(self.ref, 1), self.cols)

  def before(self, spec: cm.Spec):
    """``(q f [S, BK], k e [C, BK])`` as matmul operands: the factors of
    the pairs with the keys before the block (``chunk_math.row_factors``),
    whose product ``(q f) (k e)^T`` is the block's ``[S, C]`` scores over
    those keys."""
    p = gate_at(self._r, (slice(None), self.cols))
    f, e = cm.row_factors(self.p, self.ref_gate(), p, self.ref)
    k = self._r["k"][:, self.cols].astype(_F32)
    return cm.operand(self.q * f, spec), cm.operand(k * e, spec)

  def key(self, j, strict: bool):
    """Key ``j`` of the block (``[1, BK]`` float32, loaded) and its decays
    to the block's queries (``chunk_math.inside_decay``, ``[S, BK]``)."""
    row = pl.ds(self.b * cm.ROWS + j, 1)
    k_j = self._r["k"][row, self.cols].astype(_F32)
    return k_j, cm.inside_decay(self.p, _gate_rows(self._r, row, self.cols),
                                j, strict)


def _channel_scores(r, spec: cm.Spec, lay: Layout):
  """The ``[C, C]`` scores of a chunk with a decay per key channel, ``j <=
  i`` (no document mask, no query scale), by row blocks, each summed over
  key steps: the pairs with the keys before the block as one ``[S, BK] x
  [BK, C]`` matmul per key step, those inside it (the diagonal included)
  key by key; then the blocks stacked into one value."""
  c, s, width = spec.chunk, cm.ROWS, lay.inner_k
  n_k = lay.k_pad // width
  lane = cm.iota((s, s), 1)
  before_parts, inside_parts = [], []
  for b in range(cm.row_blocks(spec)):
    def key_step(j, acc, b=b):
      before, inside = acc
      blk = RowBlock(r, b, column_block(j, width))
      if b > 0:
        qf, ke = blk.before(spec)
        before = before + cm.dot(qf, ke, cm.NT, spec)          # [S, C]

      def key_in_block(jj, inside):
        k_j, decay = blk.key(jj, strict=False)
        part = jnp.sum(blk.q * k_j * decay, axis=1, keepdims=True)
        return inside + jnp.where(lane == jj, part, 0.0)

      return before, loop(s, key_in_block, inside)

    before, inside = loop(n_k, key_step, (jnp.zeros((s, c), _F32),
                                          jnp.zeros((s, s), _F32)))
    before_parts.append(before)
    inside_parts.append(inside)
  return (cm.stack_rows(before_parts)
          + cm.band_to_square(cm.stack_rows(inside_parts)))


class ChannelPairGrads:
  """The pairs' parts of the gradients of scores with a decay per key
  channel, from their gradient ``da`` (``[C, C]`` float32, zero across
  documents; only its pairs ``j < i`` count, the diagonal is the
  caller's):

      dq_i = sum_j da_ij exp(P_i - P_j) k_j,
      dk_j = sum_i da_ij exp(P_i - P_j) q_i.

  Through each reference token ``R = b S - 1`` (``b >= 1``) pass the pairs
  of the queries of row block ``b`` with every earlier key (for ``dk``)
  and those of the keys of block ``b - 1`` with every later query (for
  ``dq``); together they are every pair across blocks, once each:

      dk += e * (da[block b, :]^T (q_b f_b)),     e = exp(P_R - P_j), j <= R
      dq += g * (da[:, block b-1] (k_{b-1} e_{b-1})), g = exp(P_i - P_R), i > R

  (``f_b``, ``e_{b-1}``: the block rows of ``g`` and ``e``), one ``[C, S]
  x [S, BK]`` matmul each per block and key step, with the chunk's ``C``
  rows (a Hopper ``wgmma``'s 64 at 64-token chunks). The pairs inside each
  block follow key by key, in float32. ``da`` is split into row and
  column blocks once, outside the key steps."""

  def __init__(self, da, spec: cm.Spec):
    n = cm.row_blocks(spec)
    self.spec = spec
    da_op = cm.operand(da, spec)
    self.rows = cm.split_blocks(da_op, n)                       # [S, C]
    self.cols = cm.split_blocks(da_op, n, axis=1)               # [C, S]
    self.inside = [cm.split_blocks(x, n, axis=1)[b]             # [S, S]
                   for b, x in enumerate(cm.split_blocks(da, n))]

  def _across(self, r, blocks, cols):
    """The pairs across row blocks: ``(dq, dk)`` ``[C, BK]`` or None
    (one block)."""
    spec, c = self.spec, self.spec.chunk
    if len(blocks) == 1:
      return None, None
    p = gate_at(r, (slice(None), cols))
    token = cm.iota((c, 1), 0)
    dq = dk = jnp.zeros((c, blocks[0].q.shape[1]), _F32)
    for b in range(1, len(blocks)):
      blk, prev = blocks[b], blocks[b - 1]
      p_r = blk.ref_gate()
      g = jnp.exp(jnp.where(token > blk.ref, cm.gate_diff(p, p_r), -jnp.inf))
      e = jnp.exp(jnp.where(token <= blk.ref, cm.gate_diff(p_r, p),
                            -jnp.inf))
      qf = cm.operand(blk.q * jnp.exp(cm.gate_diff(blk.p, p_r)), spec)
      k_prev = r["k"][pl.ds((b - 1) * cm.ROWS, cm.ROWS), cols].astype(_F32)
      ke = cm.operand(k_prev * jnp.exp(cm.gate_diff(p_r, prev.p)), spec)
      dq = dq + g * cm.dot(self.cols[b - 1], ke, cm.NN, spec)
      dk = dk + e * cm.dot(self.rows[b], qf, cm.TN, spec)
    return dq, dk

  def __call__(self, r, cols):
    """``(dq, dk)``: ``[C, BK]`` float32 each, at the key columns
    ``cols``."""
    s = cm.ROWS
    lane, row = cm.iota((s, s), 1), cm.iota((s, 1), 0)
    blocks = [RowBlock(r, b, cols) for b in range(len(self.rows))]
    dq_parts, dk_parts = [], []
    for blk, da_in in zip(blocks, self.inside):
      def key_in_block(jj, acc, blk=blk, da_in=da_in):
        dq, dk = acc
        k_j, decay = blk.key(jj, strict=True)
        da_j = jnp.sum(jnp.where(lane == jj, da_in, 0.0), axis=1,
                       keepdims=True)                           # [S, 1]
        dq = dq + da_j * k_j * decay
        dk_j = jnp.sum(da_j * blk.q * decay, axis=0, keepdims=True)
        return dq, dk + jnp.where(row == jj, dk_j, 0.0)

      zeros = jnp.zeros(blk.q.shape, _F32)
      dq, dk = loop(s, key_in_block, (zeros, zeros))
      dq_parts.append(dq)
      dk_parts.append(dk)
    dq, dk = cm.stack_rows(dq_parts), cm.stack_rows(dk_parts)
    dq_across, dk_across = self._across(r, blocks, cols)
    if dq_across is not None:
      dq, dk = dq + dq_across, dk + dk_across
    return dq, dk


def scores_of(r, spec: cm.Spec, lay: Layout, d):
  """The chunk's ``[C, C]`` scores (query scale not applied), summed over
  key blocks; a decay per key channel by row blocks (``_channel_scores``).
  Masked to the pairs ``j <= i`` of one document."""
  c, width = spec.chunk, lay.inner_k
  n_k = lay.k_pad // width
  if spec.gate == "channel":
    return jnp.where(d.pair, _channel_scores(r, spec, lay), 0.0)

  def part(j, acc):
    cols = column_block(j, width)
    return acc + cm.dot(r["q"][:, cols], r["k"][:, cols], cm.NT, spec)

  qk = loop(n_k, part, jnp.zeros((c, c), _F32))
  return qk * cm.pair_weights(gate_at(r, slice(None)), d)


def _read_states(r, spec: cm.Spec, lay: Layout, d):
  """``sum_k (read_i exp(P_i) q_i)_k h[k, :]`` over key blocks: ``[C,
  BV]`` for the program's value block."""
  width = lay.inner_k

  def part(j, acc):
    cols = column_block(j, width)
    p = gate_at(r, (slice(None), cols))
    q_read = r["q"][:, cols].astype(_F32) * cm.read_weights(p, d)
    return acc + cm.dot(cm.operand(q_read, spec), r["states"][cols, :],
                        cm.NN, spec)

  return loop(lay.k_pad // width, part,
              jnp.zeros((spec.chunk, r["states"].shape[-1]), _F32))


def _outputs_kernel(r, *, spec: cm.Spec, lay: Layout):
  d = docs_at(r, spec, slice(None))
  a = scores_of(r, spec, lay, d)                                  # [C, C]
  o = (cm.dot(cm.operand(a, spec), r["v"][...], cm.NN, spec)
       + _read_states(r, spec, lay, d))                         # [C, BV]
  r["o"][...] = (o * spec.scale).astype(r["o"].dtype)


def outputs(arrays, h, spec: cm.Spec, lay: Layout, *,
            out_dtype, cost, interpret: bool):
  """``o [B, T_pad, H, V_pad]`` from the inputs and the entering states
  ``h [B, H, N, K, V]``."""
  v_blocks = lay.v_pad // lay.out_v
  specs = chunk_specs(lay, v_blocks, lay.out_v)
  inputs = chunk_inputs(arrays, spec, specs,
                        [("q", "k"), ("k", "k"), ("v", "v")])
  inputs["states"] = (h, specs["states"])
  b, hh = lay.batch, lay.heads
  out = {"o": (jax.ShapeDtypeStruct((b, lay.t_pad, hh, lay.v_pad), out_dtype),
               specs["v"])}
  return call(functools.partial(_outputs_kernel, spec=spec, lay=lay),
              (b, hh, lay.chunks * v_blocks), inputs, out, lay,
              name="gated_linear_outputs", cost=cost,
              interpret=interpret)["o"]


def _dv_kernel(r, *, spec: cm.Spec, lay: Layout):
  """``dv = scale scores^T do + (write k) dh`` for one value block (the
  second term only with ``d_states``)."""
  d = docs_at(r, spec, slice(None))
  a = cm.operand(scores_of(r, spec, lay, d) * spec.scale, spec)   # [C, C]
  dv = cm.dot(a, r["do"][...], cm.TN, spec)                     # [C, BV]
  if "d_states" in r:
    width = lay.inner_k

    def part(j, acc):
      cols = column_block(j, width)
      kw = (r["k"][:, cols].astype(_F32)
            * cm.write_weights(gate_at(r, (slice(None), cols)), d))
      return acc + cm.dot(cm.operand(kw, spec), r["d_states"][cols, :],
                          cm.NN, spec)

    dv = loop(lay.k_pad // width, part, dv)
  r["dv"][...] = dv.astype(r["dv"].dtype)


def _dqk_kernel(r, *, spec: cm.Spec, lay: Layout):
  """``dq``, ``dk`` and the log-decays' gradient terms of one chunk, by key
  blocks, each summing over value blocks."""
  every = slice(None)
  c, width, v_width = spec.chunk, lay.inner_k, lay.inner_v
  n_k, n_v = lay.k_pad // width, lay.v_pad // v_width
  gated = spec.gate != "none"
  d = docs_at(r, spec, every)
  def score_part(j, acc):
    vcols = column_block(j, v_width)
    return acc + cm.dot(r["do"][:, vcols], r["v"][:, vcols], cm.NT, spec)

  d_scores = loop(n_v, score_part, jnp.zeros((c, c), _F32))     # [C, C]
  last = cm.iota((c,), 0) == c - 1
  if spec.gate == "channel":
    da = jnp.where(d.pair, d_scores * spec.scale, 0.0)
    da_diag = jnp.sum(jnp.where(cm.diagonal(c), da, 0.0), axis=1)[:, None]
    pair_grads = ChannelPairGrads(da, spec)
  else:
    if spec.gate == "scalar":
      # The pairs' part of the log-decays' gradient (``gate_gradient``):
      # pairs j < i by row, less the same pairs by column.
      below = cm.iota((c, c), 0) > cm.iota((c, c), 1)
      terms = jnp.where(below, scores_of(r, spec, lay, d) * d_scores
                        * spec.scale, 0.0)                      # [i, j]
      pair_terms = jnp.sum(terms, axis=1) - jnp.sum(terms, axis=0)
    da = cm.operand(d_scores * cm.pair_weights(gate_at(r, every), d)
                    * spec.scale, spec)

  def value_sums(cols):
    """``(do h^T, v dh^T, sum_v h * dh)`` of key block ``cols``, summed
    over value blocks: ``([C, BK], [C, BK], [BK])``. With ``du`` (the
    delta rule's pseudo-values' gradient) it also writes ``dw = -du
    h^T``."""
    def value_block(jv, acc):
      vcols = column_block(jv, v_width)
      dq_read, dk_write, carried, dw = acc
      h = r["states"][cols, vcols]                              # [BK, BV]
      dh = r["d_states"][cols, vcols]
      dq_read = dq_read + cm.dot(r["do"][:, vcols], h, cm.NT, spec)
      dk_write = dk_write + cm.dot(r["v"][:, vcols], dh, cm.NT, spec)
      if gated:
        carried = carried + jnp.sum(h.astype(_F32) * dh.astype(_F32), axis=1)
      if "du" in r:
        dw = dw - cm.dot(r["du"][:, vcols], h, cm.NT, spec)
      return dq_read, dk_write, carried, dw

    zeros = jnp.zeros((c, width), _F32)
    dq_read, dk_write, carried, dw = loop(
        n_v, value_block, (zeros, zeros, jnp.zeros((width,), _F32), zeros))
    if "du" in r:
      r["dw"][:, cols] = dw
    return dq_read, dk_write, carried

  def channel_key_block(jk, totals):
    cols = column_block(jk, width)
    p = gate_at(r, (every, cols))
    # The pairs j < i (``ChannelPairGrads``), the diagonal apart.
    dq_pairs, dk_pairs = pair_grads(r, cols)
    dq_read, dk_write, carried = value_sums(cols)
    dq_read = dq_read * (cm.read_weights(p, d) * spec.scale)
    dk_write = dk_write * cm.write_weights(p, d)
    q, k = r["q"][:, cols].astype(_F32), r["k"][:, cols].astype(_F32)
    r["dq"][:, cols] = (dq_read + dq_pairs + da_diag * k).astype(
        r["dq"].dtype)
    r["dk"][:, cols] = (dk_write + dk_pairs + da_diag * q).astype(
        r["dk"].dtype)
    # The log-decays' gradient terms (``gate_gradient``): the state read at
    # i >= m, the carried state and the writes at j < m, and the pairs
    # i >= m > j (the pairs j < i of the rows, less those of the columns
    # >= m; the diagonal adds equal terms to both, so it is left out).
    carried = cm.carry_decay(p, d) * carried           # [BK]
    r["gate_rows"][:, cols] = (
        q * (dq_read + dq_pairs) - k * dk_pairs
        + jnp.where(last[:, None], carried[None, :], 0.0))
    r["gate_writes"][:, cols] = k * dk_write
    return totals

  def key_block(jk, totals):
    cols = column_block(jk, width)
    q, k = r["q"][:, cols], r["k"][:, cols]                     # [C, BK]
    p = gate_at(r, (every, cols))
    dq_read, dk_write, carried = value_sums(cols)
    dq_read = dq_read * (cm.read_weights(p, d) * spec.scale)
    dk_write = dk_write * cm.write_weights(p, d)
    r["dq"][:, cols] = (dq_read + cm.dot(da, k, cm.NN, spec)).astype(
        r["dq"].dtype)
    r["dk"][:, cols] = (dk_write + cm.dot(da, q, cm.TN, spec)).astype(
        r["dk"].dtype)
    if not gated:
      return totals
    read_terms, write_terms, carried_total = totals
    return (read_terms + jnp.sum(q.astype(_F32) * dq_read, axis=1),
            write_terms + jnp.sum(k.astype(_F32) * dk_write, axis=1),
            carried_total + cm.carry_decay(p, d) * jnp.sum(carried))

  vector = jnp.zeros((c,), _F32)
  read_terms, write_terms, carried = loop(
      n_k, channel_key_block if spec.gate == "channel" else key_block,
      (vector, vector, jnp.zeros((), _F32)))
  if spec.gate == "scalar":
    r["gate_rows"][...] = (read_terms + pair_terms
                           + jnp.where(last, carried, 0.0))
    r["gate_writes"][...] = write_terms


def grads(arrays, h, dh, spec: cm.Spec, lay: Layout, *, interpret: bool,
          du=None):
  """``{"dq", "dk", "dv"}`` (padded, in the inputs' dtype) and, with a
  decay, ``{"gate_rows", "gate_writes"}`` (``[B, T_pad, H(, K_pad)]``
  float32, see ``gate_gradient``): two kernels, ``dv`` over chunks and
  value blocks, then ``dq``, ``dk`` and the gate terms over chunks.

  With ``du`` (the delta rule: ``v`` holds its pseudo-values ``U`` and
  ``du`` their whole gradient, ``[B, T_pad, H, V_pad]``), ``dv`` is not
  computed (the reverse sweep already has it) and ``"dw"`` (``-du h^T``,
  float32) is returned."""
  b, hh, t = lay.batch, lay.heads, lay.t_pad
  dtype = arrays["q"].dtype
  result = {}
  if du is None:
    result = dv_intra(arrays, spec, lay, dh=dh, interpret=interpret)
  specs = chunk_specs(lay, 1, lay.v_pad)
  inputs = chunk_inputs(arrays, spec, specs,
                        [("q", "k"), ("k", "k"), ("v", "v"), ("do", "v")])
  inputs["states"] = (h, specs["states"])
  inputs["d_states"] = (dh, specs["states"])
  out = {"dq": (jax.ShapeDtypeStruct((b, t, hh, lay.k_pad), dtype),
                specs["k"]),
         "dk": (jax.ShapeDtypeStruct((b, t, hh, lay.k_pad), _F32 if du
                                     is not None else dtype), specs["k"])}
  if du is not None:
    inputs["du"] = (du, specs["v"])
    out["dw"] = (jax.ShapeDtypeStruct((b, t, hh, lay.k_pad), _F32),
                 specs["k"])
  if spec.gate != "none":
    shape = (b, t, hh) if spec.gate == "scalar" else (b, t, hh, lay.k_pad)
    for name in ("gate_rows", "gate_writes"):
      out[name] = (jax.ShapeDtypeStruct(shape, _F32),
                   specs["gate_" + spec.gate])
  result.update(call(functools.partial(_dqk_kernel, spec=spec, lay=lay),
                     (b, hh, lay.chunks), inputs, out, lay,
                     name="gated_linear_dqk",
                     cost=cost(spec, lay, "dqk" if du is None else "dqk_dw",
                               inputs),
                      interpret=interpret))
  return result


def dv_intra(arrays, spec: cm.Spec, lay: Layout, *, dh=None,
             interpret: bool):
  """``{"dv": scale scores^T do (+ (write k) dh)}``: the ``dv`` kernel,
  over chunks and value blocks (without ``dh``: the delta rule's part of
  its pseudo-values' gradient that comes from the chunk itself)."""
  b, hh, t = lay.batch, lay.heads, lay.t_pad
  v_blocks = lay.v_pad // lay.out_v
  specs = chunk_specs(lay, v_blocks, lay.out_v)
  inputs = chunk_inputs(arrays, spec, specs,
                        [("q", "k"), ("k", "k"), ("do", "v")])
  if dh is not None:
    inputs["d_states"] = (dh, specs["states"])
  dtype = arrays["q"].dtype if dh is not None else _F32
  out = {"dv": (jax.ShapeDtypeStruct((b, t, hh, lay.v_pad), dtype),
                specs["v"])}
  return call(functools.partial(_dv_kernel, spec=spec, lay=lay),
              (b, hh, lay.chunks * v_blocks), inputs, out, lay,
              name="gated_linear_dv",
              cost=cost(spec, lay, "dv" if dh is not None else "dv_intra",
                        inputs),
               interpret=interpret)


def gate_gradient(gate_rows, gate_writes, chunk: int):
  """The log-decays' gradient from the ``grads`` terms (``[B, T, H(, K)]``):
  for ``m`` in a chunk, ``dg_m = sum_{i >= m} gate_rows_i + sum_{j < m}
  gate_writes_j``, sums inside the chunk.

  ``P_i`` holds ``g_m`` for ``m <= i``, and ``dL/dP_i`` is ``q_i dq_i -
  k_i dk_i`` plus the carried state's term at the last token; ``grads``
  splits it so that no large terms cancel: the reads' and pairs' rows
  (``gate_rows``, summed over ``i >= m``) and the writes (``gate_writes``,
  ``j < m``: the write of ``k_j`` decays over ``g_m`` exactly when ``j <
  m``)."""
  shape = gate_rows.shape
  b, t = shape[:2]
  split = (b, t // chunk, chunk) + shape[2:]
  rows = lax.cumsum(gate_rows.reshape(split), axis=2, reverse=True)
  writes = gate_writes.reshape(split)
  widths = [(0, 0)] * len(split)
  widths[2] = (1, 0)
  before = jnp.cumsum(jnp.pad(writes, widths)[:, :, :-1], axis=2)
  return (rows + before).reshape(shape)


def _flops(spec: cm.Spec, lay: Layout, kind: str) -> float:
  """Matmul flops of one kernel, counted from its body: per head and chunk,
  ``2 m n k`` per ``[m, k] x [k, n]`` product (masked ones at full size;
  3xTF32 runs three). The scores cost ``2 C^2 K`` whatever the gate: with
  a decay per key channel the ``C / S - 1`` row blocks past the first run
  ``[S, K] x [K, C]`` (``2 (C - S) C K``) and the pairs inside the blocks,
  summed channel by channel, ``S^2 K`` multiply-adds per block (``2 S C
  K``, counted as flops); their gradients (``ChannelPairGrads``) the same
  twice. The README compares the sums with the chunk algorithm's count."""
  c, kk, vv = lay.chunk, lay.k_pad, lay.v_pad
  scores = 2 * c * c * kk
  counts = {
      "sweep": 2 * c * kk * vv,
      "outputs": scores + 2 * c * kk * vv + 2 * c * c * vv,
      "dv": scores + 2 * c * c * vv + 2 * c * kk * vv,
      "dqk": (2 * c * c * vv + 2 * (2 * c * kk * vv) + 2 * scores
              + (scores if spec.gate == "scalar" else 0)),
  }
  counts["dqk_dw"] = counts["dqk"] + 2 * c * kk * vv           # dW = -dU h^T
  counts["dv_intra"] = counts["dv"] - 2 * c * kk * vv          # no dh term
  per_chunk = counts[kind]
  passes = 3 if spec.mode == "tf32x3" else 1
  return float(per_chunk) * lay.chunks * lay.batch * lay.heads * passes


def _exps_per_chunk(spec: cm.Spec, lay: Layout, kind: str) -> int:
  """``exp``s of one kernel per head and chunk. A decay per key channel:
  the read or write weights (``2 C K``, with the carry's), and in the
  chunk kernels per row block past the first the factors through its
  reference token (``(S + C) K`` for the scores, twice that for their
  gradients) and per block the decays inside it (``S^2 K``)."""
  c, kk = lay.chunk, lay.k_pad
  if spec.gate == "none":
    return 0
  if spec.gate == "scalar":
    return c * (c + 2)
  s, n = cm.ROWS, cm.row_blocks(spec)
  inside = n * s * s * kk
  factors = (n - 1) * (s + c) * kk
  extra = {"sweep": 0, "outputs": factors + inside, "dv": factors + inside,
           "dv_intra": factors + inside, "dqk": 2 * factors + inside,
           "dqk_dw": 2 * factors + inside}[kind]
  return 2 * c * kk + extra


def cost(spec: cm.Spec, lay: Layout, kind: str, arrays) -> pl.CostEstimate:
  """The estimate of one kernel; ``arrays``: its inputs (a ``{name: (array,
  spec)}`` or the arrays)."""
  if isinstance(arrays, dict):
    arrays = [x for x, _ in arrays.values()]
  chunks = lay.batch * lay.heads * lay.chunks
  return compiler.cost(flops=_flops(spec, lay, kind),
                       transcendentals=chunks * _exps_per_chunk(
                           spec, lay, kind),
                       arrays=arrays)
