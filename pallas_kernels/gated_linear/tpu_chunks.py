"""Chunk-parallel Mosaic (TPU) kernels of the gated-linear recurrence: no
decay, a scalar decay per head, or a decay per key channel.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

The split of ``gpu.py`` (and of flash-linear-attention's ``chunk_fwd_h`` /
``chunk_fwd_o`` / ``chunk_bwd_dh`` / ``chunk_bwd_dqkwg``), with the math of
``chunk_math.py`` written on the column and row forms Mosaic needs. Inside
chunk ``n`` of ``C`` tokens, ``P_i`` the log-decay from the chunk's start
(token i included; per key channel or not), ``L`` its last token and
``h_n`` the state entering it:

    h_{n+1} = carry exp(P_L) h_n + sum_j write_j exp(P_L - P_j) k_j v_j^T
    o_i     = scale [ read_i (exp(P_i) q_i) h_n
                      + sum_{j <= i} pair_ij (q_i . exp(P_i - P_j) k_j) v_j ]

Kernels:

- ``gated_linear_tpu_states``, grid ``(B, H, K / BK, V / BV, N)``, the
  chunk axis sequential ("arbitrary"): a ``[BV, BK]`` float32 state tile in
  VMEM scratch; per chunk it writes the state entering the chunk, then
  adds one ``[C, BV]^T [C, BK]`` matmul. The states are written in the
  matmul operands' precision (bfloat16 for bfloat16 inputs: every consumer
  rounds them to bfloat16 for the MXU anyway, so storing float32 would
  double the HBM traffic for no digit; float32 otherwise); the final state
  in float32.
- ``gated_linear_tpu_outputs``, grid ``(B, H, N)``, all parallel: the
  ``[C, C]`` scores once per chunk, then per block of value columns
  ``scores v + (read exp(P) q) h_n``.
- ``gated_linear_tpu_state_grads``: the states kernel walked from the last
  chunk with ``scale read exp(P) q`` and ``do``: the gradient of the state
  leaving each chunk, and the initial state's gradient.
- ``gated_linear_tpu_grads``, grid ``(B, H, N)``, all parallel: the
  scores and ``dS = do v^T`` once per chunk, then ``dv`` per value block
  and ``dq``, ``dk`` per key block, and the per-token terms of the
  log-decays' gradient (``gpu.gate_gradient`` adds them up).

A decay per key channel (secondary chunking, ``RowBlock``): the ``[C, C,
K]`` pair weights are never formed. The scores are computed by row blocks
of ``S`` tokens (``BlockSizes.sub_chunk``, 16): the pairs whose key lies
before the block factor through the token before it, ``R``, as two decays
``<= 1`` (``exp(P_i - P_R)`` on the block's queries, ``exp(P_R - P_j)``
masked to ``j <= R`` on the keys), one ``[S, K] x [K, C]`` matmul per
block; the pairs inside the block are summed channel by channel with their
own decays, one key per step, and the diagonal has weight 1. The gradients
kernel reuses both factors for the pairs' parts of ``dq`` (``[S, C] x [C,
K]``) and ``dk`` (``[S, C]^T x [S, K]``) and walks the same keys inside
the block. Every ``[C, C]`` matmul of the scalar path keeps its size; only
the intra-chunk scores are split.

The backward pass keeps only the inputs: it reruns the states kernel for
``h`` (a ``2 T K V`` pass per head, where keeping ``h`` would hold ``B H T
/ C K V`` values per layer from the forward to the backward pass) and
recomputes the ``[C, C]`` scores in the gradients kernel (``2 C^2 K`` per
chunk, instead of writing and reading ``B H T C`` floats).

Matmul flops per head and chunk (``2 m n k`` each), exactly the chunk
algorithm's count (``../README.md``), for every gate (with a decay per
key channel the ``C / S`` row blocks' products add up to the same sizes):

    forward   2C (2KV + CK + CV)     states; scores, scores v, q h
    backward  2C (5KV + 3CK + 2CV)   states, state grads; scores, dS,
                                     scores^T do, k dh, do h^T, dA k,
                                     v dh^T, dA^T q

Registers: the matmuls write to VMEM scratch (the ``[C, C]`` products,
the key blocks' ``[C, 128]`` products), and the elementwise work on them
runs by strips of ``STRIP_ROWS`` rows, so no ``[C, C]`` or ``[C, K]``
value is held in vector registers; in bfloat16 no kernel spills at the
paper widths (``make compile-check``).

Numerics: ``P`` enters as double-float prefix sums per chunk (``hi + lo``,
``common/cumsum.py``), so every log-decay is a difference accurate to
float32 relative to itself; every exponent is a sum of gates, ``<= 0``,
and every mask is applied before ``exp``. Matmuls take bfloat16 operands
for bfloat16 inputs, float32 at the highest precision otherwise,
accumulating in float32.

Layout: ``[B, H, T, F]`` (``layout.to_kernel``), K and V zero-padded to
whole 128-lane tiles, T to whole chunks; states ``[B, H, N, V, K]``
(transposed, as the sweep kernels keep them). Per-token scalars come as
columns ``[.., T, 1]`` and, where a ``[C, C]`` matrix needs them along
lanes, as rows ``[.., N, 1, C]``, so no kernel transposes a vector; a
decay per key channel comes as ``[.., T, K]``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import compiler, dots
from pallas_kernels.common import layout as common
from pallas_kernels.common.cumsum import chunk_cumsum
from pallas_kernels.gated_linear import chunk_math
from pallas_kernels.gated_linear.block_sizes import BlockSizes

_F32 = jnp.float32
NN, NT, TN = dots.NN, dots.NT, dots.TN
# Default state tile of the sweeps and columns per step of the chunk
# kernels' loops: one 128 x 128 MXU pass (v4, v5e, v5p; v6e's 256 x 256
# MXU takes 256 through BlockSizes).
DEFAULT_TILE = 128
# Rows per strip of the [C, C] elementwise work of the chunk kernels: a
# [32, 128] float32 strip is four vector registers.
STRIP_ROWS = 32


@dataclasses.dataclass(frozen=True)
class Spec:
  """Static description of one call's kernels."""
  gate: str          # "none", "scalar" or "channel" (a decay per key)
  segments: bool     # document masks from segment ids
  scale: float       # query scale
  chunk: int         # C, a multiple of 16
  bf16: bool         # bfloat16 matmul operands (else float32, HIGHEST)
  sub_chunk: int = 16  # S, rows of a block of the per-channel scores


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sizes of one call and its tiles."""
  batch: int
  length: int      # T
  heads: int
  dim_k: int
  dim_v: int
  t_pad: int       # T rounded up to whole chunks
  k_pad: int       # K padded to whole 128-lane tiles
  v_pad: int
  chunk: int       # C
  sweep_k: int     # state tile [sweep_v, sweep_k] of a sweep program
  sweep_v: int
  step: int        # key or value columns per step of the chunk kernels
  strip: int       # rows per step of the chunk kernels' [C, C] elementwise
                   # work (STRIP_ROWS, or fewer to divide the chunk)

  @property
  def chunks(self) -> int:
    return self.t_pad // self.chunk


# The longest chunk for float32 inputs: at 256 the gradients kernel's
# blocks of the widest heads (K = 512, V = 1024) pass v4's 16 MiB of VMEM.
FLOAT32_MAX_CHUNK = 128


def make_layout(b, t, h, dk, dv, blocks: BlockSizes,
                direction: str = "forward", *, bf16: bool = True) -> Layout:
  """The chunk is ``blocks.chunk``, at most ``FLOAT32_MAX_CHUNK`` for
  float32 inputs (``bf16`` False), cut to the sequence (whole 16-row
  tiles) when that is shorter; the sweeps' state tile is the
  ``direction``'s ``(block_k, block_v)`` or ``DEFAULT_TILE``."""
  chunk = min(blocks.chunk if bf16 else min(blocks.chunk, FLOAT32_MAX_CHUNK),
              common.round_up(t, 16))
  k_pad = common.padded_features(dk, "tpu")
  v_pad = common.padded_features(dv, "tpu")
  given = ((blocks.block_k, blocks.block_v) if direction == "forward" else
           (blocks.backward_block_k, blocks.backward_block_v))
  prefix = "" if direction == "forward" else "backward_"
  bk = common.feature_blocks(k_pad, given[0], DEFAULT_TILE, prefix + "block_k")
  bv = common.feature_blocks(v_pad, given[1], DEFAULT_TILE, prefix + "block_v")
  step = common.feature_blocks(min(k_pad, v_pad), blocks.step_block,
                               DEFAULT_TILE, "step_block")
  if k_pad % step or v_pad % step:
    step = DEFAULT_TILE
  return Layout(b, t, h, dk, dv, common.round_up(t, chunk), k_pad, v_pad,
                chunk, bk, bv, step, math.gcd(chunk, STRIP_ROWS))


def setup(q, k, v, g, doc, blocks: BlockSizes, scale: float,
          direction: str = "forward"):
  b, t, h, dk = q.shape
  bf16 = all(x.dtype == jnp.bfloat16 for x in (q, k, v))
  lay = make_layout(b, t, h, dk, v.shape[-1], blocks, direction, bf16=bf16)
  spec = Spec(gate=chunk_math.gate_kind(g), segments=doc is not None,
              scale=scale,
              chunk=lay.chunk, bf16=bf16,
              sub_chunk=math.gcd(lay.chunk, blocks.sub_chunk_rows))
  return lay, spec


def _to_kernel(x, lay: Layout, width: int, dtype):
  """``[B, T, H, F] -> [B, H, T_pad, width]``, zero-padded."""
  x = common.pad_to(x, (lay.batch, lay.t_pad, lay.heads, width), dtype)
  return jnp.transpose(x, (0, 2, 1, 3))


def _rows(column, lay: Layout):
  """``[..., T_pad, 1] -> [..., N, 1, C]``: one row per chunk."""
  *lead, t, _ = column.shape
  return column.reshape(*lead, t // lay.chunk, 1, lay.chunk)


def prepare(q, k, v, g, doc, lay: Layout, spec: Spec, do=None):
  """The kernels' inputs by name: ``q``, ``k``, ``v`` (and ``do``) ``[B, H,
  T_pad, F_pad]`` in the matmul dtype; with a decay ``p_hi``, ``p_lo``
  (its chunk-local prefix sums, columns ``[B, H, T_pad, 1]``) and
  ``p_row_hi``, ``p_row_lo`` (rows ``[B, H, N, 1, C]``); with segment ids
  ``doc``, ``doc_prev`` (document index of each token and of the one
  before it, ``[B, T_pad, 1]``) and ``doc_row`` (``[B, N, 1, C]``). A
  decay per key channel gives ``p_hi``, ``p_lo`` ``[B, H, T_pad, K_pad]``
  (zero in the padded channels) and no rows."""
  dtype = jnp.bfloat16 if spec.bf16 else _F32
  arrays = {"q": _to_kernel(q, lay, lay.k_pad, dtype),
            "k": _to_kernel(k, lay, lay.k_pad, dtype),
            "v": _to_kernel(v, lay, lay.v_pad, dtype)}
  if do is not None:
    arrays["do"] = _to_kernel(do, lay, lay.v_pad, dtype)
  if spec.gate == "channel":
    g = _to_kernel(g, lay, lay.k_pad, _F32)                    # [B, H, T, K]
    hi, lo = chunk_cumsum(g, lay.chunk, axis=2)
    arrays.update(p_hi=hi, p_lo=lo)
  elif g is not None:
    g = _to_kernel(g[..., :1], lay, 1, _F32)                   # [B, H, T, 1]
    hi, lo = chunk_cumsum(g, lay.chunk, axis=2)
    arrays.update(p_hi=hi, p_lo=lo, p_row_hi=_rows(hi, lay),
                  p_row_lo=_rows(lo, lay))
  if doc is not None:
    doc, prev = common.documents(doc, lay.t_pad)
    arrays.update(doc=doc[..., None], doc_prev=prev[..., None],
                  doc_row=_rows(doc[..., None], lay))
  return arrays


def _specs(lay: Layout, reverse: bool = False):
  """Block specs of the sweeps, grid ``(b, h, kb, vb, step)``: name ->
  BlockSpec."""
  c, bk, bv, n = lay.chunk, lay.sweep_k, lay.sweep_v, lay.chunks

  def chunk(s):
    return n - 1 - s if reverse else s

  return {
      "k": pl.BlockSpec((None, None, c, bk),
                        lambda b, h, kb, vb, s: (b, h, chunk(s), kb)),
      "v": pl.BlockSpec((None, None, c, bv),
                        lambda b, h, kb, vb, s: (b, h, chunk(s), vb)),
      "column": pl.BlockSpec((None, None, c, 1),
                             lambda b, h, kb, vb, s: (b, h, chunk(s), 0)),
      "doc": pl.BlockSpec((None, c, 1),
                          lambda b, h, kb, vb, s: (b, chunk(s), 0)),
      "state": pl.BlockSpec((None, None, bv, bk),
                            lambda b, h, kb, vb, s: (b, h, vb, kb)),
      "states": pl.BlockSpec((None, None, None, bv, bk),
                             lambda b, h, kb, vb, s: (b, h, chunk(s), vb,
                                                      kb)),
  }


# Bytes of the double-buffered blocks of a chunk kernel above which its
# [V, K] states take one buffer each: past it, v4's 16 MiB of VMEM no
# longer holds the widest heads' float32 gradients kernel (K = 512, V =
# 1024: 2 MiB a state), and a single buffer costs only the overlap of that
# one copy per chunk with the chunk's work.
SINGLE_BUFFER_STATES_BYTES = 12 * 2 ** 20


def _single_buffered_states(inputs, outputs, specs):
  """``inputs`` with the ``states`` and ``d_states`` blocks single-buffered
  when the call's double-buffered blocks pass
  ``SINGLE_BUFFER_STATES_BYTES``."""
  window = sum(compiler.block_bytes(s.block_shape, x.dtype)
               for x, s in list(inputs.values()) + list(outputs.values()))
  if 2 * window <= SINGLE_BUFFER_STATES_BYTES:
    return inputs
  single = pl.BlockSpec(specs["states"].block_shape,
                        specs["states"].index_map,
                        pipeline_mode=pl.Buffered(1))
  return {name: (x, single if name in ("states", "d_states") else spec)
          for name, (x, spec) in inputs.items()}


def chunk_specs(lay: Layout):
  """Block specs of the chunk kernels, grid ``(b, h, n)``."""
  c = lay.chunk
  return {
      "k": pl.BlockSpec((None, None, c, lay.k_pad),
                        lambda b, h, n: (b, h, n, 0)),
      "v": pl.BlockSpec((None, None, c, lay.v_pad),
                        lambda b, h, n: (b, h, n, 0)),
      "column": pl.BlockSpec((None, None, c, 1), lambda b, h, n: (b, h, n, 0)),
      "row": pl.BlockSpec((None, None, None, 1, c),
                          lambda b, h, n: (b, h, n, 0, 0)),
      "doc": pl.BlockSpec((None, c, 1), lambda b, h, n: (b, n, 0)),
      "doc_row": pl.BlockSpec((None, None, 1, c), lambda b, h, n: (b, n, 0, 0)),
      "states": pl.BlockSpec((None, None, None, lay.v_pad, lay.k_pad),
                             lambda b, h, n: (b, h, n, 0, 0)),
  }


GATE_AND_DOC_KINDS = {"p_hi": "column", "p_lo": "column",
                       "p_row_hi": "row", "p_row_lo": "row", "doc": "doc",
                       "doc_prev": "doc", "doc_row": "doc_row"}


def call(kernel, grid, inputs, outputs, *, parallel: int, scratch=(),
         name: str, cost, interpret: bool):
  """``pl.pallas_call`` of ``kernel(refs by name)``: ``inputs`` and
  ``outputs`` ``{name: (array or shape struct, BlockSpec)}``, ``scratch``
  ``[(name, shape, dtype)]`` VMEM; the first ``parallel`` grid axes
  parallel, the rest sequential; the VMEM limit from the blocks."""
  window = sum(compiler.block_bytes(s.block_shape, x.dtype)
               for x, s in list(inputs.values()) + list(outputs.values()))
  scratch_bytes = sum(compiler.nbytes(shape, dtype)
                      for _, shape, dtype in scratch)
  semantics = (("parallel",) * parallel
               + ("arbitrary",) * (len(grid) - parallel))
  params = pltpu.CompilerParams(
      dimension_semantics=semantics,
      vmem_limit_bytes=compiler.vmem_limit(window, scratch_bytes))
  names = list(inputs) + list(outputs) + [n for n, _, _ in scratch]
  outs = pl.pallas_call(
      lambda *refs: kernel(dict(zip(names, refs))),
      out_shape=[x for x, _ in outputs.values()], grid=grid,
      in_specs=[s for _, s in inputs.values()],
      out_specs=[s for _, s in outputs.values()],
      scratch_shapes=[pltpu.VMEM(shape, dtype)
                      for _, shape, dtype in scratch],
      compiler_params=params, cost_estimate=cost, interpret=interpret,
      name=name)(*[x for x, _ in inputs.values()])
  return dict(zip(outputs, outs))


def dot(a, b, dims, spec: Spec):
  return dots.dot(a, b, dims, mode="bf16" if spec.bf16 else "f32")


def dot_into(r, out, lhs, rhs, dims, spec: Spec, lay: Layout, *,
             add: bool = False, lhs_cols=slice(None)):
  """``r[out] (+)= r[lhs][:, lhs_cols] . rhs()`` (``dims`` NN or NT, ``out``
  a ``[C, *]`` float32 scratch). bfloat16 operands: one product. float32:
  by strips of ``lay.strip`` rows of ``lhs``, since a ``[128, 128]``
  float32 product at the highest precision spills vector registers on v6e
  and tpu7x and a ``[32, 128]`` one does not."""
  if spec.bf16:
    value = dot(r[lhs][:, lhs_cols], rhs(), dims, spec)
    if add:
      r[out][...] += value
    else:
      r[out][...] = value
    return

  def strip(t, carry):
    rows = at_block(t, lay.strip)
    value = dot(r[lhs][rows, lhs_cols], rhs(), dims, spec)
    if add:
      r[out][rows, :] += value
    else:
      r[out][rows, :] = value
    return carry

  loop(spec.chunk // lay.strip, strip, 0)


def tn_into(r, spec: Spec, lay: Layout, out: str, lhs: str, rhs: str, *,
            out_cols=slice(None), rhs_cols=slice(None), sign: float = 1.0,
            add: bool = True):
  """``r[out][:, out_cols] (+)= sign r[lhs]^T r[rhs][:, rhs_cols]``
  (contracting over the chunk's rows; ``out`` float32 scratch): one
  product for bfloat16 operands, for float32 ones a sum over strips of
  rows added to ``out`` in VMEM (the delta rule's sweeps: a value carried
  over the strips spilled vector registers)."""
  if not add:
    r[out][:, out_cols] = jnp.zeros(r[out][:, out_cols].shape, _F32)

  def part(rows):
    r[out][:, out_cols] += sign * dot(r[lhs][rows, :],
                                      r[rhs][rows, rhs_cols], TN, spec)

  if spec.bf16:
    part(slice(None))
  else:
    by_strips(spec, lay, part)


def by_strips(spec: Spec, lay: Layout, body):
  """``body(rows)`` for every strip of ``lay.strip`` rows of the chunk."""
  def strip(t, carry):
    body(at_block(t, lay.strip))
    return carry

  loop(spec.chunk // lay.strip, strip, 0)


def strictly_lower(rows: int, cols: int, i):
  """``[rows, cols]``: the pairs ``j < i'`` for the queries ``i'`` of row
  block ``i`` (``rows`` tokens)."""
  return iota((rows, cols), 0) + i * rows > iota((rows, cols), 1)


def operand_dtype(spec: Spec):
  return jnp.bfloat16 if spec.bf16 else _F32


def operand(x, spec: Spec):
  return x.astype(operand_dtype(spec))


def iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


@dataclasses.dataclass
class _Chunk:
  """A chunk's per-token weights as columns ``[C, 1]`` (``[1, 1]`` for the
  carry), or ``[C, BK]`` and ``[1, BK]`` for a decay per key channel:
  ``read_i exp(P_i)``, ``write_j exp(P_L - P_j)``, ``carry exp(P_L)``."""
  read: jax.Array
  write: jax.Array
  carry: jax.Array


def chunk_weights(r, spec: Spec, cols=slice(None), rows=None) -> _Chunk:
  """The weights of the chunk in ``r`` at its tokens ``rows`` (a ``pl.ds``;
  all by default); a decay per key channel at the key columns ``cols`` of
  its ``p`` refs."""
  c = spec.chunk
  n = c if rows is None else rows.size
  rows = slice(None) if rows is None else rows
  ones = jnp.ones((n, 1), _F32)
  if spec.segments:
    doc, enter = r["doc"][rows, :], r["doc_prev"][0:1, :]       # [R,1] [1,1]
    last = r["doc"][c - 1:c, :]
    read, write, carry = doc == enter, doc == last, last == enter
  if spec.gate == "none":
    if not spec.segments:
      return _Chunk(ones, ones, jnp.ones((1, 1), _F32))
    return _Chunk(read.astype(_F32), write.astype(_F32), carry.astype(_F32))
  if spec.gate != "channel":
    cols = slice(None)
  hi, lo = r["p_hi"][rows, cols], r["p_lo"][rows, cols]         # [R, 1|BK]
  hi_last = r["p_hi"][c - 1:c, cols]
  lo_last = r["p_lo"][c - 1:c, cols]
  read_w = jnp.exp(hi + lo)
  write_w = jnp.exp((hi_last - hi) + (lo_last - lo))            # <= 1
  carry_w = jnp.exp(hi_last + lo_last)
  if spec.segments:
    read_w = jnp.where(read, read_w, 0.0)
    write_w = jnp.where(write, write_w, 0.0)
    carry_w = jnp.where(carry, carry_w, 0.0)
  return _Chunk(read_w, write_w, carry_w)


def pair_mask(r, spec: Spec, i=0, rows: int | None = None):
  """``[R, C]``: the pairs ``j <= i'`` in one document, for the queries
  ``i'`` of the ``R``-row block ``i`` (the whole chunk by default)."""
  c = spec.chunk
  rows = c if rows is None else rows
  mask = iota((rows, c), 0) + i * rows >= iota((rows, c), 1)
  if spec.segments:
    mask = mask & (r["doc"][at_block(i, rows), :] == r["doc_row"][...])
  return mask


def pair_weights(r, spec: Spec, i=0, rows: int | None = None):
  """``pair_ij exp(P_i - P_j)``, ``[R, C]`` float32 for the rows of
  ``pair_mask``, the mask applied before ``exp``."""
  mask = pair_mask(r, spec, i, rows)
  if spec.gate == "none":
    return mask.astype(_F32)
  block = at_block(i, mask.shape[0])
  diff = ((r["p_hi"][block, :] - r["p_row_hi"][...])
          + (r["p_lo"][block, :] - r["p_row_lo"][...]))         # P_i - P_j
  return jnp.exp(jnp.where(mask, diff, -jnp.inf))


def init_state(r, step):
  """At a sweep's first step, the state scratch from ``state_in`` (or
  zeros)."""
  @pl.when(step == 0)
  def _():
    if "state_in" in r:
      r["state"][...] = r["state_in"][...]
    else:
      r["state"][...] = jnp.zeros(r["state"].shape, _F32)


def _sweep_kernel(r, *, spec: Spec, lay: Layout, reverse: bool,
                  last_step: int):
  """One chunk of the state sweep (the transposed state ``[BV, BK]``):
  forward ``S <- carry S + v^T (write k)``, reverse ``dS <- carry dS +
  do^T (scale read q)``; writes the state before the update."""
  step = pl.program_id(4)
  init_state(r, step)
  s = r["state"][...]
  r["states"][...] = s.astype(r["states"].dtype)

  def product(rows=None):
    """``y^T x`` over the chunk's tokens ``rows`` (all by default)."""
    w = chunk_weights(r, spec, rows=rows)
    rows = slice(None) if rows is None else rows
    if reverse:
      x = r["q"][rows, :].astype(_F32) * (w.read * spec.scale)
      y = r["do"][rows, :]
    else:
      x = r["k"][rows, :].astype(_F32) * w.write
      y = r["v"][rows, :]
    return dot(y, operand(x, spec), TN, spec)                  # [BV, BK]

  carry = chunk_weights(r, spec, rows=pl.ds(spec.chunk - 1, 1)).carry
  if spec.bf16:
    r["state"][...] = s * carry + product()
  else:
    # float32: a sum over strips of rows into the state in VMEM (one
    # [C, BV]^T [C, BK] product at the highest precision spilled vector
    # registers on v6e).
    r["state"][...] = s * carry

    def strip(t, c):
      r["state"][...] += product(at_block(t, lay.strip))
      return c

    loop(spec.chunk // lay.strip, strip, 0)
  if "state_out" in r:
    @pl.when(step == last_step)
    def _():
      r["state_out"][...] = r["state"][...]


def gate_and_doc_inputs(arrays, specs, names):
  """The gate and document inputs among ``names``: a per-channel decay's
  prefix sums ``[.., T, K_pad]`` take the keys' blocks."""
  def kind(n):
    if n in ("p_hi", "p_lo") and arrays[n].shape[-1] != 1:
      return "k"
    return GATE_AND_DOC_KINDS[n]

  return {n: (arrays[n], specs[kind(n)]) for n in names if n in arrays}


def sweep(arrays, spec: Spec, lay: Layout, *, reverse: bool, state_in=None,
          state_out: bool, interpret: bool):
  """Forward: ``{"states": h [B, H, N, V_pad, K_pad], "state_out"}``, ``h_n``
  the state entering chunk ``n``; reverse: ``{"states": dh, "state_out"}``,
  ``dh_n`` the gradient of the state leaving chunk ``n``, ``state_out``
  the initial state's gradient. ``state_in`` ``[B, H, V_pad, K_pad]``
  float32: the initial state, or the final state's gradient."""
  specs = _specs(lay, reverse)
  x_name, y_name = ("q", "do") if reverse else ("k", "v")
  inputs = {x_name: (arrays[x_name], specs["k"]),
            y_name: (arrays[y_name], specs["v"])}
  inputs.update(gate_and_doc_inputs(arrays, specs,
                                    ("p_hi", "p_lo", "doc", "doc_prev")))
  if state_in is not None:
    inputs["state_in"] = (state_in, specs["state"])
  b, h = lay.batch, lay.heads
  outputs = {"states": (jax.ShapeDtypeStruct(
      (b, h, lay.chunks, lay.v_pad, lay.k_pad),
      jnp.bfloat16 if spec.bf16 else _F32), specs["states"])}
  if state_out:
    outputs["state_out"] = (jax.ShapeDtypeStruct(
        (b, h, lay.v_pad, lay.k_pad), _F32), specs["state"])
  grid = (b, h, lay.k_pad // lay.sweep_k, lay.v_pad // lay.sweep_v,
          lay.chunks)
  kernel = functools.partial(_sweep_kernel, spec=spec, lay=lay,
                             reverse=reverse, last_step=lay.chunks - 1)
  return call(kernel, grid, inputs, outputs, parallel=4,
              scratch=[("state", (lay.sweep_v, lay.sweep_k), _F32)],
              name=("gated_linear_tpu_state_grads" if reverse
                     else "gated_linear_tpu_states"),
               cost=cost(spec, lay, "sweep", inputs, outputs),
               interpret=interpret)


def loop(n: int, body, init):
  """``body(j, carry)`` for ``j < n``: inline for one step, else a
  ``fori_loop``."""
  if n == 1:
    return body(0, init)
  return jax.lax.fori_loop(0, n, body, init)


def at_block(j, width: int):
  if isinstance(j, int):
    return pl.ds(j * width, width)
  return pl.ds(pl.multiple_of(j * width, width), width)


def _weighted(r, spec: Spec, lay: Layout, out: str, x: str, weight: str,
              scale: float = 1.0):
  """``r[out] = r[x] * scale * weight`` as a matmul operand, ``weight`` the
  chunk's ``"read"`` or ``"write"`` weights; by key steps and strips of
  rows."""
  def key_step(j, carry):
    cols = at_block(j, lay.step)
    weighted(r, spec, lay, cols, out, x, weight, scale, out_cols=cols)
    return carry

  loop(lay.k_pad // lay.step, key_step, 0)


def weighted(r, spec: Spec, lay: Layout, cols, out: str, x: str,
             weight: str, scale: float = 1.0, *, out_cols=slice(None)):
  """``r[out][:, out_cols] = r[x][:, cols] * scale * weight`` (the chunk's
  ``"read"`` or ``"write"`` weights at the key columns ``cols``) as a
  matmul operand, by strips of rows."""
  def body(rows):
    w = getattr(chunk_weights(r, spec, cols, rows), weight)
    r[out][rows, out_cols] = operand(
        r[x][rows, cols].astype(_F32) * (w * scale), spec)

  by_strips(spec, lay, body)


def score_products(r, spec: Spec, lay: Layout, *, grads: bool):
  """The chunk's ``[C, C]`` products to float32 scratch: ``s = q k^T`` and,
  for the gradients, ``ds = do v^T``, each summed over column steps; the
  elementwise work on them then runs by strips of ``lay.strip`` rows, so no
  ``[C, C]`` value is held in registers."""
  products = [("s", "q", "k", lay.k_pad)]
  if grads:
    products.append(("ds", "do", "v", lay.v_pad))
  for out, x, y, width in products:
    r[out][...] = jnp.zeros(r[out].shape, _F32)

    def part(j, carry, out=out, x=x, y=y):
      cols = at_block(j, lay.step)
      dot_into(r, out, x, lambda: r[y][:, cols], NT, spec, lay, add=True,
               lhs_cols=cols)
      return carry

    loop(width // lay.step, part, 0)


def _scaled_scores_to_scratch(r, spec: Spec, lay: Layout):
  """``scale A`` (``A = (q k^T) * W``, ``W`` the pair weights) of a chunk to
  the scratch ``a`` in the matmul dtype: by strips of rows from the float32
  scratch ``s``, or by row blocks for a decay per key channel."""
  if spec.gate == "channel":
    _channel_scores_to_scratch(r, spec, lay)
    return
  score_products(r, spec, lay, grads=False)                    # s

  def strip(i, carry):
    rows = at_block(i, lay.strip)
    scores = r["s"][rows, :] * pair_weights(r, spec, i, lay.strip)
    r["a"][rows, :] = operand(scores * spec.scale, spec)       # [R, C]
    return carry

  loop(spec.chunk // lay.strip, strip, 0)


def _scores_scratch(spec: Spec, lay: Layout):
  """The scratch of ``_scaled_scores_to_scratch``."""
  c = lay.chunk
  if spec.gate != "channel":
    return [("a", (c, c), operand_dtype(spec)), ("s", (c, c), _F32)]
  return [("a", (c, c), operand_dtype(spec)), ("e", (c, lay.step), _F32),
          ("ke", (c, lay.step), operand_dtype(spec))]


def _outputs_kernel(r, *, spec: Spec, lay: Layout):
  """``o = scale [(scores * W) v + (read exp(P) q) h_n]`` of one chunk: the
  scaled scores to the scratch ``a`` (by strips of rows, or by row blocks
  for a decay per key channel), the scaled read queries to ``q_read`` (by
  key steps and strips), then one block of value columns per step."""
  _scaled_scores_to_scratch(r, spec, lay)
  _weighted(r, spec, lay, "q_read", "q", "read", spec.scale)
  n_k = lay.k_pad // lay.step

  def value_step(j, carry):
    cols = at_block(j, lay.step)
    dot_into(r, "o_acc", "a", lambda: r["v"][:, cols], NN, spec, lay)

    def read(jk, carry):
      kcols = at_block(jk, lay.step)
      dot_into(r, "o_acc", "q_read", lambda: r["states"][cols, kcols], NT,
               spec, lay, add=True, lhs_cols=kcols)
      return carry

    loop(n_k, read, 0)
    r["o"][:, cols] = r["o_acc"][...].astype(r["o"].dtype)      # [C, BV]
    return carry

  loop(lay.v_pad // lay.step, value_step, 0)


class RowBlock:
  """Row block ``i`` (``S`` tokens) of a chunk with a decay per key channel,
  at the key columns ``cols``: the ``[S, C]`` part of the scores whose
  query lies in the block, and the factors that its pairs ``j < i S`` share.

  The pairs ``(i', j)`` with ``j`` before the block factor through its
  reference token ``R = i S - 1`` (the block's predecessor): ``exp(P_i' -
  P_j) = exp(P_i' - P_R) exp(P_R - P_j)``, two decays ``<= 1`` that scale
  the block's queries (``f``, ``[S, BK]``) and every key (``e``, ``[C,
  BK]``, zero for ``j > R``: the mask comes before ``exp``; it and ``k e``
  go to the scratch ``e`` and ``ke``), so they are one ``[S, BK] x [BK,
  C]`` matmul. The pairs inside the block (``j < i'``)
  are summed channel by channel, one key ``j`` per step, with their own
  decays ``exp(P_i' - P_j)``; the diagonal has weight 1."""

  def __init__(self, r, spec: Spec, lay: Layout, i, cols):
    s, c = spec.sub_chunk, spec.chunk
    self.spec, self.i, self.cols, self._r = spec, i, cols, r
    self._lay = lay
    rows = at_block(i, s)
    self.q = r["q"][rows, cols].astype(_F32)                     # [S, BK]
    self.k = r["k"][rows, cols].astype(_F32)
    self.hi, self.lo = r["p_hi"][rows, cols], r["p_lo"][rows, cols]
    ref = i * s - 1                                              # R
    # P_R, the last row of the block before (aligned loads only); block 0
    # has no pairs before it and takes its own first row, so f <= 1.
    before_rows = at_block(jnp.maximum(i - 1, 0), s)

    def at_ref(name):
      prev = r[name][before_rows, cols]                          # [S, BK]
      return jnp.where(i > 0, prev[s - 1:s, :], prev[0:1, :])     # [1, BK]

    hi_r, lo_r = at_ref("p_hi"), at_ref("p_lo")
    self.f = jnp.exp((self.hi - hi_r) + (self.lo - lo_r))       # [S, BK]
    self.qf = operand(self.q * self.f, spec)

    def strip(t, carry):
      # e and k e of every key, by strips of rows, to the scratch.
      keys = at_block(t, lay.strip)
      before = iota((lay.strip, 1), 0) + t * lay.strip <= ref  # j <= R
      e = jnp.exp(jnp.where(before, (hi_r - r["p_hi"][keys, cols])
                            + (lo_r - r["p_lo"][keys, cols]), -jnp.inf))
      r["e"][keys, :] = e
      r["ke"][keys, :] = operand(r["k"][keys, cols].astype(_F32) * e, spec)
      return carry

    loop(c // lay.strip, strip, 0)

  def lanes(self):
    """``[S, C]`` column index and ``[S, 1]`` row index in the block."""
    s, c = self.spec.sub_chunk, self.spec.chunk
    return iota((s, c), 1), iota((s, 1), 0)

  def key(self, j):
    """Key ``j`` of the block and its decays to the block's queries
    ``exp(P_i' - P_j)`` for ``i' > j`` (else 0): ``([1, BK], [S, BK])``."""
    _, row = self.lanes()
    pick = row == j

    def at(x):
      return jnp.sum(jnp.where(pick, x, 0.0), axis=0, keepdims=True)

    decay = jnp.exp(jnp.where(row > j, (self.hi - at(self.hi))
                              + (self.lo - at(self.lo)), -jnp.inf))
    return at(self.k), decay

  def pair_grads(self, da, da_op):
    """What the pairs of the block's queries send back at these key
    columns, from ``dA``'s rows ``da`` ``[S, C]`` (float32, masked; and
    as a matmul operand): the queries' part to the scratch ``dq_pairs``
    at the block's rows, ``f * (dA (k e))`` and the keys inside the block;
    the keys' part added to ``dk_pairs`` at every row, ``e * (dA^T (q
    f))`` and the block's own keys. Products go to VMEM as they are made
    (held as values, the float32 ones' split operands spilled)."""
    spec, r, i, cols = self.spec, self._r, self.i, self.cols
    s, c, strip = spec.sub_chunk, spec.chunk, self._lay.strip
    rows = at_block(i, s)
    r["dq_pairs"][rows, cols] = self.f * dot(da_op, r["ke"][...], NN,
                                             spec)              # [S, BK]
    r["dk_tmp"][...] = dot(da_op, self.qf, TN, spec)            # [C, BK]

    def dk_strip(t, carry):
      keys = at_block(t, strip)
      r["dk_pairs"][keys, cols] += r["e"][keys, :] * r["dk_tmp"][keys, :]
      return carry

    loop(c // strip, dk_strip, 0)
    lane, row = self.lanes()

    def inside(jj, acc):
      dq, dk = acc
      k_j, decay = self.key(jj)
      da_j = jnp.sum(jnp.where(lane == i * s + jj, da, 0.0), axis=1,
                     keepdims=True)                             # [S, 1]
      dq = dq + da_j * k_j * decay
      dk_j = jnp.sum(da_j * self.q * decay, axis=0, keepdims=True)
      return dq, dk + jnp.where(row == jj, dk_j, 0.0)

    dq = r["dq_pairs"][rows, cols]
    dq, dk = loop(s, inside, (dq, jnp.zeros(dq.shape, _F32)))
    r["dq_pairs"][rows, cols] = dq
    r["dk_pairs"][rows, cols] += dk

  def scores(self):
    """The block's scores over these key columns, ``[S, C]`` float32 (no
    query scale, no document mask)."""
    spec = self.spec
    lane, row = self.lanes()
    start = self.i * spec.sub_chunk
    a = dot(self.qf, self._r["ke"][...], NT, spec)              # j <= R
    a = a + jnp.where(lane == start + row,
                      jnp.sum(self.q * self.k, axis=1, keepdims=True), 0.0)

    def inside(j, a):
      k_j, decay = self.key(j)
      part = jnp.sum(self.q * k_j * decay, axis=1, keepdims=True)  # [S, 1]
      return a + jnp.where(lane == start + j, part, 0.0)

    return loop(spec.sub_chunk, inside, a)


def _channel_scores_to_scratch(r, spec: Spec, lay: Layout):
  """Writes ``scale A`` of a chunk with a decay per key channel to the
  scratch ``a`` (``[C, C]``), row block by row block, each summed over key
  steps."""
  s, c = spec.sub_chunk, spec.chunk

  def row_block(i, carry):
    # The mask after the scores: a mask made before them is held in
    # registers through their loop.
    a = block_scores(r, spec, lay, i)
    a = jnp.where(pair_mask(r, spec, i, s), a, 0.0)
    r["a"][at_block(i, s), :] = operand(a * spec.scale, spec)
    return carry

  loop(c // s, row_block, 0)


def block_scores(r, spec: Spec, lay: Layout, i):
  """Row block ``i``'s scores with a decay per key channel, ``[S, C]``
  float32 summed over the key steps (no scale, no mask)."""
  def key_step(j, a):
    return a + RowBlock(r, spec, lay, i, at_block(j, lay.step)).scores()

  return loop(lay.k_pad // lay.step, key_step,
              jnp.zeros((spec.sub_chunk, spec.chunk), _F32))


def outputs(arrays, h, spec: Spec, lay: Layout, *, out_dtype,
            interpret: bool):
  """``o [B, H, T_pad, V_pad]`` from the inputs and the entering states
  ``h [B, H, N, V_pad, K_pad]``."""
  specs = chunk_specs(lay)
  inputs = {"q": (arrays["q"], specs["k"]), "k": (arrays["k"], specs["k"]),
            "v": (arrays["v"], specs["v"]), "states": (h, specs["states"])}
  inputs.update(gate_and_doc_inputs(arrays, specs, GATE_AND_DOC_KINDS))
  b, hh = lay.batch, lay.heads
  out = {"o": (jax.ShapeDtypeStruct((b, hh, lay.t_pad, lay.v_pad), out_dtype),
               specs["v"])}
  scratch = _scores_scratch(spec, lay) + [
      ("q_read", (lay.chunk, lay.k_pad), operand_dtype(spec)),
      ("o_acc", (lay.chunk, lay.step), _F32)]
  return call(functools.partial(_outputs_kernel, spec=spec, lay=lay),
              (b, hh, lay.chunks), inputs, out, parallel=3, scratch=scratch,
              name="gated_linear_tpu_outputs",
              cost=cost(spec, lay, "outputs", inputs, out),
              interpret=interpret)["o"]


def _dv_intra_kernel(r, *, spec: Spec, lay: Layout):
  """``dv = scale A^T do`` of one chunk (the pairs inside it only), per
  block of value columns."""
  _scaled_scores_to_scratch(r, spec, lay)

  def value_step(j, carry):
    cols = at_block(j, lay.step)
    r["dv"][:, cols] = dot(r["a"][...], r["do"][:, cols], TN, spec)
    return carry

  loop(lay.v_pad // lay.step, value_step, 0)


def dv_intra(arrays, spec: Spec, lay: Layout, *, interpret: bool):
  """``dv [B, H, T_pad, V_pad]`` float32: what the outputs of each chunk send
  to the values of the same chunk, ``scale A^T do`` (the delta rule's
  pseudo-values take it, ``delta_rule/tpu_chunks.py``)."""
  specs = chunk_specs(lay)
  inputs = {name: (arrays[name], specs[kind]) for name, kind in
            (("q", "k"), ("k", "k"), ("do", "v"))}
  inputs.update(gate_and_doc_inputs(arrays, specs, GATE_AND_DOC_KINDS))
  b, hh = lay.batch, lay.heads
  out = {"dv": (jax.ShapeDtypeStruct((b, hh, lay.t_pad, lay.v_pad), _F32),
                specs["v"])}
  return call(functools.partial(_dv_intra_kernel, spec=spec, lay=lay),
              (b, hh, lay.chunks), inputs, out, parallel=3,
              scratch=_scores_scratch(spec, lay), name="gated_linear_tpu_dv",
              cost=cost(spec, lay, "dv_intra", inputs, out),
              interpret=interpret)["dv"]


def _grads_kernel(r, *, spec: Spec, lay: Layout):
  """``dv``, ``dq``, ``dk`` and the scalar log-decays' gradient terms of one
  chunk (``h`` the entering state, ``dh`` the leaving state's gradient,
  both ``[V, K]``; ``W`` the pair weights, ``A = (q k^T) * W``):

      dv = scale A^T do + (write exp(P_L - P) k) dh
      dA = scale (do v^T) * W
      dq = scale read exp(P) (do h^T) + dA k
      dk = write exp(P_L - P) (v dh^T) + dA^T q

  The log-decays' terms (``gpu.gate_gradient`` sums them inside the
  chunk): ``gate_rows_i = q_i . dq_read_i + (pairs j < i of row i) + [i =
  L] carry exp(P_L) sum(h * dh)``, ``gate_cols_i`` = the pairs ``i' > i``
  of column ``i`` (a row, subtracted from ``gate_rows`` in XLA) and
  ``gate_writes_j = k_j . dk_write_j``, the pairs' terms ``scale A_ij
  (do_i . v_j)``.

  The ``[C, C]`` products and the key blocks' products go to float32
  scratch and the elementwise work on them runs by strips of rows; the
  operands that the loops over value and key blocks share (``a``, ``da``,
  ``k_write``) are written to scratch once, so no ``[C, C]`` or ``[C, K]``
  value is held in registers."""
  c = spec.chunk
  n_k = lay.k_pad // lay.step
  gated = spec.gate != "none"
  score_products(r, spec, lay, grads=True)                     # s, ds

  def strip(i, col_sums):
    # One strip of rows of the [C, C] products: the pair weights, the
    # scaled scores and dA, and the pairs' terms of the log-decays'
    # gradient by row (a column, to gate_rows) and by column (a row,
    # summed over strips): no transpose in the kernel; gpu.gate_gradient's
    # caller subtracts them.
    rows = at_block(i, lay.strip)
    pair = pair_weights(r, spec, i, lay.strip)                 # [R, C]
    scores = r["s"][rows, :] * pair                             # A
    d_scores = r["ds"][rows, :]                                 # do v^T
    r["a"][rows, :] = operand(scores * spec.scale, spec)
    r["da"][rows, :] = operand(d_scores * pair * spec.scale, spec)
    if not gated:
      return col_sums
    below = strictly_lower(lay.strip, c, i)
    terms = jnp.where(below, scores * d_scores * spec.scale, 0.0)  # [i, j]
    r["gate_rows"][rows, :] = jnp.sum(terms, axis=1, keepdims=True)
    return col_sums + jnp.sum(terms, axis=0, keepdims=True)

  col_sums = loop(c // lay.strip, strip, jnp.zeros((1, c), _F32))
  if gated:
    r["gate_cols"][...] = col_sums                              # [1, C]
    r["gate_writes"][...] = jnp.zeros(r["gate_writes"].shape, _F32)

  _weighted(r, spec, lay, "k_write", "k", "write")
  _dv_steps(r, spec, lay)

  if gated:
    r["carried"][...] = jnp.zeros(r["carried"].shape, _F32)

  def key_block(j, carry):
    # The products of the key block to float32 scratch, then the
    # elementwise work by strips of rows.
    cols = at_block(j, lay.step)
    dot_into(r, "dq_pairs", "da", lambda: r["k"][:, cols], NN, spec, lay)
    r["dk_pairs"][...] = dot(r["da"][...], r["q"][:, cols], TN, spec)
    carried = _state_products(r, spec, lay, cols, carried=gated)
    if gated:
      r["carried"][...] += carried                              # [1, BK]

    def strip(i, carry):
      rows = at_block(i, lay.strip)
      w = chunk_weights(r, spec, rows=rows)
      dq_read = r["dq_read"][rows, :] * (w.read * spec.scale)   # [R, BK]
      dk_write = r["dk_write"][rows, :] * w.write
      r["dq"][rows, cols] = (dq_read + r["dq_pairs"][rows, :]).astype(
          r["dq"].dtype)
      r["dk"][rows, cols] = (dk_write + r["dk_pairs"][rows, :]).astype(
          r["dk"].dtype)
      if gated:
        q = r["q"][rows, cols].astype(_F32)
        k = r["k"][rows, cols].astype(_F32)
        r["gate_rows"][rows, :] += jnp.sum(q * dq_read, axis=1,
                                           keepdims=True)
        r["gate_writes"][rows, :] += jnp.sum(k * dk_write, axis=1,
                                             keepdims=True)
      return carry

    loop(c // lay.strip, strip, 0)
    return carry

  # The carried state's term summed in VMEM, not as a loop carry (a value
  # carried over the key blocks' products spilled vector registers).
  loop(n_k, key_block, 0)
  if not gated:
    return
  carried = jnp.sum(r["carried"][...], axis=1, keepdims=True)   # [1, 1]
  carry = chunk_weights(r, spec, rows=pl.ds(c - 1, 1)).carry
  r["gate_rows"][c - 1:c, :] += carry * carried


def _channel_grads_kernel(r, *, spec: Spec, lay: Layout):
  """``dv``, ``dq``, ``dk`` and the log-decays' gradient terms of one chunk
  with a decay per key channel (the equations of ``_grads_kernel``, with
  ``[C, K]`` weights and the pairs of ``RowBlock``):

  1. ``dA = scale (do v^T) * W`` (``W`` the pairs ``j <= i`` in one
     document) in the scratch ``da``, summed over value steps.
  2. Per row block and key step: the scores (to the scratch ``a``, for
     ``dv``), and the pairs' parts of ``dq`` (this block's rows, to
     ``dq_pairs``) and ``dk`` (every row before the block, and the block's
     own, added to ``dk_pairs``): through the reference token
     ``f * (dA_blk (k e))`` and ``e * (dA_blk^T (q f))``, then the pairs
     inside the block key by key. The diagonal ``dA_ii`` is kept apart (the
     scratch column ``da_diag``).
  3. ``dv = A^T do + (write exp(P_L - P) k) dh`` per value step.
  4. Per key step: ``dq = scale read exp(P) (do h^T) + dq_pairs + dA_ii
     k``, ``dk = write exp(P_L - P) (v dh^T) + dk_pairs + dA_ii q``, and the
     gradient terms per channel (``gpu.gate_gradient``): ``gate_rows = q
     (dq_read + dq_pairs) - k dk_pairs + [i = L] carry exp(P_L) sum_v(h
     dh)`` and ``gate_writes = k dk_write``; the diagonal adds the same
     term to both sides of ``gate_rows``, so it is left out."""
  s, c = spec.sub_chunk, spec.chunk
  n_v, n_k = lay.v_pad // lay.step, lay.k_pad // lay.step
  r["da"][...] = jnp.zeros((c, c), _F32)

  def score_part(j, carry):
    cols = at_block(j, lay.step)
    dot_into(r, "da", "do", lambda: r["v"][:, cols], NT, spec, lay,
             add=True, lhs_cols=cols)
    return carry

  loop(n_v, score_part, 0)
  r["dk_pairs"][...] = jnp.zeros(r["dk_pairs"].shape, _F32)

  def row_block(i, carry):
    rows = at_block(i, s)
    da = jnp.where(pair_mask(r, spec, i, s), r["da"][rows, :] * spec.scale,
                   0.0)                                         # [S, C]
    lane = iota((s, c), 1)
    diagonal = lane == iota((s, 1), 0) + i * s
    r["da_diag"][rows, :] = jnp.sum(jnp.where(diagonal, da, 0.0), axis=1,
                                    keepdims=True)
    da_op = operand(da, spec)

    r["a_blk"][...] = jnp.zeros(r["a_blk"].shape, _F32)

    def key_step(j, carry):
      blk = RowBlock(r, spec, lay, i, at_block(j, lay.step))
      r["a_blk"][...] += blk.scores()
      blk.pair_grads(da, da_op)
      return carry

    loop(n_k, key_step, 0)
    a = jnp.where(pair_mask(r, spec, i, s), r["a_blk"][...], 0.0)
    r["a"][rows, :] = operand(a * spec.scale, spec)
    return carry

  loop(c // s, row_block, 0)

  _weighted(r, spec, lay, "k_write", "k", "write")
  _dv_steps(r, spec, lay)

  def key_step(j, carry):
    cols = at_block(j, lay.step)
    carried = _state_products(r, spec, lay, cols)

    def strip(t, carry):
      rows = at_block(t, lay.strip)
      w = chunk_weights(r, spec, cols, rows)
      dq_read = r["dq_read"][rows, :] * (w.read * spec.scale)   # [R, BK]
      dk_write = r["dk_write"][rows, :] * w.write
      q = r["q"][rows, cols].astype(_F32)
      k = r["k"][rows, cols].astype(_F32)
      dq_pairs, dk_pairs = r["dq_pairs"][rows, cols], r["dk_pairs"][rows, cols]
      da_diag = r["da_diag"][rows, :]                           # [R, 1]
      r["dq"][rows, cols] = (dq_read + dq_pairs + da_diag * k).astype(
          r["dq"].dtype)
      r["dk"][rows, cols] = (dk_write + dk_pairs + da_diag * q).astype(
          r["dk"].dtype)
      last = iota((lay.strip, 1), 0) + t * lay.strip == c - 1
      r["gate_rows"][rows, cols] = (
          q * (dq_read + dq_pairs) - k * dk_pairs
          + jnp.where(last, w.carry * carried, 0.0))
      r["gate_writes"][rows, cols] = k * dk_write
      return carry

    return loop(c // lay.strip, strip, carry)

  loop(n_k, key_step, 0)


def _state_products(r, spec: Spec, lay: Layout, cols, *,
                    carried: bool = True):
  """For the key columns ``cols``: ``do h^T`` and ``v dh^T`` (``[C, 128]``,
  summed over value steps) to the scratch ``dq_read`` and ``dk_write``;
  returns ``sum_v h * dh``, ``[1, 128]`` (the carried state's term of the
  log-decays' gradient; None without a decay, ``carried`` False). With
  ``du`` (the delta rule) it also writes ``dw = -du h^T`` at ``cols``,
  through the scratch ``dw_acc``."""
  for out in ("dq_read", "dk_write"):
    r[out][...] = jnp.zeros(r[out].shape, _F32)
  if carried:
    r["h_dh"][...] = jnp.zeros(r["h_dh"].shape, _F32)

  def value_step(jv, carry):
    vcols = at_block(jv, lay.step)
    for out, lhs, state in (("dq_read", "do", "states"),
                            ("dk_write", "v", "d_states")):
      dot_into(r, out, lhs, lambda state=state: r[state][vcols, cols], NN,
               spec, lay, add=True, lhs_cols=vcols)
    if carried:
      h = r["states"][vcols, cols].astype(_F32)
      dh = r["d_states"][vcols, cols].astype(_F32)
      r["h_dh"][...] += jnp.sum(h * dh, axis=0, keepdims=True)
    return carry

  loop(lay.v_pad // lay.step, value_step, 0)
  total = r["h_dh"][...] if carried else None
  if "du" not in r:
    return total
  # A loop of its own: in the loop above a third product spilled on v6e.
  r["dw_acc"][...] = jnp.zeros(r["dw_acc"].shape, _F32)

  def dw_step(jv, carry):
    vcols = at_block(jv, lay.step)
    dot_into(r, "dw_acc", "du", lambda: r["states"][vcols, cols], NN, spec,
             lay, add=True, lhs_cols=vcols)
    return carry

  loop(lay.v_pad // lay.step, dw_step, 0)
  r["dw"][:, cols] = -r["dw_acc"][...]
  return total


def _dv_steps(r, spec: Spec, lay: Layout):
  """``dv = a^T do + k_write dh`` per block of value columns, from the
  scratch ``a`` (the scaled scores) and ``k_write``; none with ``du`` (the
  delta rule's reverse sweep has the pseudo-values' whole gradient)."""
  if "du" in r:
    return
  def dv_block(j, carry):
    cols = at_block(j, lay.step)
    r["o_acc"][...] = dot(r["a"][...], r["do"][:, cols], TN, spec)
    dot_into(r, "o_acc", "k_write", lambda: r["d_states"][cols, :], NT,
             spec, lay, add=True)
    r["dv"][:, cols] = r["o_acc"][...].astype(r["dv"].dtype)   # [C, BV]
    return carry

  loop(lay.v_pad // lay.step, dv_block, 0)


def grads(arrays, h, dh, spec: Spec, lay: Layout, *, interpret: bool,
          du=None):
  """``{"dq", "dk": [B, H, T_pad, K_pad], "dv": [B, H, T_pad, V_pad]}`` in
  the inputs' dtype and, with a decay, the log-decays' gradient terms
  float32 (see ``gate_terms``): a scalar decay ``{"gate_rows",
  "gate_writes"}`` ``[B, H, T_pad, 1]`` and ``"gate_cols"`` ``[B, H, N, 1,
  C]``; a decay per key channel ``{"gate_rows", "gate_writes"}`` ``[B, H,
  T_pad, K_pad]``.

  With ``du`` (the delta rule: ``v`` holds its pseudo-values ``U`` and
  ``du`` their whole gradient, ``[B, H, T_pad, V_pad]``), ``dv`` is not
  computed and ``"dw"`` (``-du h^T``) is; ``dq``, ``dk`` and ``dw`` are
  float32."""
  specs = chunk_specs(lay)
  inputs = {name: (arrays[name], specs[kind]) for name, kind in
            (("q", "k"), ("k", "k"), ("v", "v"), ("do", "v"))}
  inputs["states"] = (h, specs["states"])
  inputs["d_states"] = (dh, specs["states"])
  inputs.update(gate_and_doc_inputs(arrays, specs, GATE_AND_DOC_KINDS))
  b, hh, t = lay.batch, lay.heads, lay.t_pad
  c = lay.chunk
  dtype = arrays["q"].dtype if du is None else _F32
  out = {name: (jax.ShapeDtypeStruct((b, hh, t, lay.k_pad), dtype),
                specs["k"]) for name in ("dq", "dk")}
  operands = operand_dtype(spec)
  scratch = [("a", (c, c), operands),
             ("k_write", (c, lay.k_pad), operands)]
  scratch += [(name, (c, lay.step), _F32)
              for name in ("dq_read", "dk_write", "o_acc")]
  scratch += [(name, (1, lay.step), _F32) for name in ("carried", "h_dh")]
  if du is None:
    out["dv"] = (jax.ShapeDtypeStruct((b, hh, t, lay.v_pad), dtype),
                 specs["v"])
  else:
    inputs["du"] = (du, specs["v"])
    out["dw"] = (jax.ShapeDtypeStruct((b, hh, t, lay.k_pad), _F32),
                 specs["k"])
    scratch.append(("dw_acc", (c, lay.step), _F32))
  kernel = _grads_kernel
  if spec.gate == "channel":
    kernel = _channel_grads_kernel
    for name in ("gate_rows", "gate_writes"):
      out[name] = (jax.ShapeDtypeStruct((b, hh, t, lay.k_pad), _F32),
                   specs["k"])
    scratch += [("da", (c, c), _F32), ("da_diag", (c, 1), _F32),
                ("dq_pairs", (c, lay.k_pad), _F32),
                ("dk_pairs", (c, lay.k_pad), _F32),
                ("e", (c, lay.step), _F32), ("ke", (c, lay.step), operands),
                ("dk_tmp", (c, lay.step), _F32),
                ("a_blk", (spec.sub_chunk, c), _F32)]
  else:
    scratch += [("da", (c, c), operands), ("s", (c, c), _F32),
                ("ds", (c, c), _F32)]
    scratch += [(name, (c, lay.step), _F32)
                for name in ("dq_pairs", "dk_pairs")]
  if spec.gate == "scalar":
    for name in ("gate_rows", "gate_writes"):
      out[name] = (jax.ShapeDtypeStruct((b, hh, t, 1), _F32),
                   specs["column"])
    out["gate_cols"] = (jax.ShapeDtypeStruct((b, hh, lay.chunks, 1, c),
                                             _F32), specs["row"])
  inputs = _single_buffered_states(inputs, out, specs)
  return call(functools.partial(kernel, spec=spec, lay=lay),
              (b, hh, lay.chunks), inputs, out, parallel=3, scratch=scratch,
              name="gated_linear_tpu_grads",
              cost=cost(spec, lay, "grads" if du is None else "grads_dw",
                        inputs, out),
              interpret=interpret)


def gate_rows(out, lay: Layout):
  """The log-decays' rows ``[B, T_pad, H(, K_pad)]`` of a kernel's
  outputs: ``gate_rows`` less a scalar decay's ``gate_cols``."""
  if out["gate_rows"].shape[-1] != 1:                          # per channel
    return jnp.transpose(out["gate_rows"], (0, 2, 1, 3))
  b, h = lay.batch, lay.heads
  rows = (out["gate_rows"][..., 0]
          - out["gate_cols"].reshape(b, h, lay.t_pad))          # [B, H, T]
  return jnp.transpose(rows, (0, 2, 1))


def gate_terms(out, lay: Layout):
  """``(gate_rows, gate_writes)`` ``[B, T_pad, H(, K_pad)]`` for
  ``gpu.gate_gradient``, from ``grads``' outputs."""
  writes = out["gate_writes"]
  writes = (jnp.transpose(writes, (0, 2, 1, 3)) if writes.shape[-1] != 1
            else jnp.transpose(writes[..., 0], (0, 2, 1)))
  return gate_rows(out, lay), writes


def flops_per_chunk(spec: Spec, lay: Layout, kind: str) -> int:
  """Matmul flops of one kernel per head and chunk, counted from its body
  (``2 m n k`` per product, masked ones at full size)."""
  c, k, v = lay.chunk, lay.k_pad, lay.v_pad
  del spec
  pairs = 2 * c * c * v + 2 * c * c * k                      # dS, scores
  dq_dk = 2 * (2 * c * k * v + 2 * c * c * k)
  return {"sweep": 2 * c * k * v,
          "outputs": 2 * c * c * k + 2 * c * c * v + 2 * c * k * v,
          "dv_intra": 2 * c * c * k + 2 * c * c * v,          # scores, A^T do
          "grads": pairs + 2 * c * c * v + 2 * c * k * v + dq_dk,  # dv
          "grads_dw": pairs + dq_dk + 2 * c * k * v}[kind]    # dw = -du h^T


def cost(spec: Spec, lay: Layout, kind: str, inputs, outputs):
  """The ``pl.CostEstimate`` of one kernel: its matmul flops, its ``exp``s
  (the pair weights and the read, write and carry weights per chunk) and
  the bytes of its inputs and outputs."""
  chunks = lay.batch * lay.heads * lay.chunks
  c, s = lay.chunk, spec.sub_chunk
  exps = 0
  if spec.gate == "scalar":
    exps = 2 * c + 1 + (0 if kind == "sweep" else c ** 2)
    if kind == "sweep":
      exps *= (lay.k_pad // lay.sweep_k) * (lay.v_pad // lay.sweep_v)
  elif spec.gate == "channel":
    # Per key channel: the read, write and carry weights (once per key
    # step and weight pass; per program in a sweep) and, in the chunk
    # kernels, per row block the queries' and keys' factors and the pairs
    # inside the block.
    weights = (2 * c + 1) * lay.k_pad
    if kind == "sweep":
      exps = weights * (lay.v_pad // lay.sweep_v)
    else:
      passes = {"outputs": 1, "dv_intra": 0}.get(kind, 2)
      exps = passes * weights + (c // s) * (s + c + s * s) * lay.k_pad
  arrays = [x for x, _ in list(inputs.values()) + list(outputs.values())]
  return compiler.cost(flops=flops_per_chunk(spec, lay, kind) * chunks,
                       transcendentals=exps * chunks, arrays=arrays)
