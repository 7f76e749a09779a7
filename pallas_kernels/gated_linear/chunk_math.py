"""The chunk-parallel algorithm of the gated-linear recurrence: the math of
one chunk, on values already loaded from a kernel's refs.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

The sequence is cut into chunks of ``C`` tokens. Inside chunk ``n``, with
``P_i = sum_{m <= i} g_m`` (the log-decay from the chunk's start, token i
included) and ``L = C - 1`` its last token:

    h_{n+1} = carry exp(P_L) h_n + sum_j write_j exp(P_L - P_j) k_j v_j^T
    o_i     = scale [ read_i (exp(P_i) q_i) h_n
                      + sum_{j <= i} pair_ij (q_i . (exp(P_i - P_j) k_j)) v_j ]

where ``h_n`` is the state entering the chunk and, with segment ids, the
document masks are ``read_i`` (no document starts between the chunk's start
and i), ``write_j`` (j is in the chunk's last document), ``carry`` (no
document starts inside the chunk) and ``pair_ij`` (``j <= i``, one document).

Numerics:

- ``P`` is a double-float (``hi + lo``, ``exact_cumsum``): every log-decay
  the kernels need is a difference ``P_i - P_j`` taken as ``(hi_i - hi_j) +
  (lo_i - lo_j)``, accurate to float32 relative to the difference itself,
  whatever the gates before ``j`` (``cumsum[i] - cumsum[j]`` in float32
  loses a weak gate after strong ones).
- Every exponent is a sum of gates, ``<= 0``: masks are applied before
  ``exp`` and nothing overflows.
- A scalar decay per head (or none) gives the pair weights as one ``[C, C]``
  matrix. A decay per key channel gives ``[C, C, K]`` weights, which are
  never formed (secondary chunking, as flash-linear-attention's
  ``chunk_gla``): the queries are taken by row blocks of ``S = ROWS``
  tokens. For block ``b`` the pairs ``(i, j)`` with ``j`` before the block
  factor through its reference token ``R = b S - 1``: ``exp(P_i - P_j) =
  exp(P_i - P_R) exp(P_R - P_j)``, two decays ``<= 1`` (``row_factors``;
  the keys' one masked to ``j <= R`` before ``exp``) scaling the block's
  queries ``[S, K]`` and every key ``[C, K]``, so they are one ``[S, K] x
  [K, C]`` matmul per block. The pairs inside the block (``j < i``) are
  summed channel by channel with their own decays ``exp(P_i - P_j)``
  (``inside_decay``), one key per step; the diagonal has weight 1. The
  blocks' products add up to one ``[C, C] x K`` product's flops.
- Matmuls take bfloat16 operands for bfloat16 inputs and float32 ones
  otherwise (``common/dots.py``), accumulating in float32; states are
  float32 in the sweeps.

Letters: i, j token of the chunk (query, key side), k key channel, v value
channel.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import dots

_F32 = jnp.float32
NN, NT, TN = dots.NN, dots.NT, dots.TN


@dataclasses.dataclass(frozen=True)
class Spec:
  """Static description of one call's kernels."""
  gate: str          # "none", "scalar" (one per head) or "channel" (per key)
  segments: bool     # document masks from segment ids
  scale: float       # query scale
  chunk: int         # C, a power of two >= 16
  mode: str          # matmul mode (common/dots.py)


def gate_kind(g) -> str:
  """``"none"``, ``"scalar"`` or ``"channel"`` for log-decays ``g``: None,
  ``[..., 1]`` or ``[..., K]``."""
  if g is None:
    return "none"
  return "scalar" if g.shape[-1] == 1 else "channel"


def dot(a, b, dims, spec: Spec):
  return dots.dot(a, b, dims, mode=spec.mode)


def operand(x, spec: Spec):
  """A matmul operand in the precision of ``spec``'s matmuls."""
  return x.astype(jnp.bfloat16 if spec.mode == "bf16" else _F32)


def iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def last_row(x):
  """Row ``C - 1`` of ``x``: ``[C] -> []`` or ``[C, F] -> [F]`` (a masked
  sum: exact, and no dynamic slice of a value)."""
  rows = iota(x.shape, 0)
  return jnp.sum(jnp.where(rows == x.shape[0] - 1, x, 0.0), axis=0)


class Gate(NamedTuple):
  """A chunk's log-decays from its start, ``P = hi + lo``: ``[C]`` (scalar
  decay) or ``[C, K]`` (per key channel)."""
  hi: jax.Array
  lo: jax.Array


def gate_diff(a: Gate, b: Gate):
  """``P_a - P_b``, accurate to float32 relative to the difference."""
  return (a.hi - b.hi) + (a.lo - b.lo)


def gate_last(p: Gate) -> Gate:
  return Gate(last_row(p.hi), last_row(p.lo))


class Docs(NamedTuple):
  """Document masks of a chunk (all True without segment ids)."""
  read: jax.Array    # [C] bool: the entering state reaches token i
  write: jax.Array   # [C] bool: token j reaches the leaving state
  carry: jax.Array   # [] bool: the entering state reaches the leaving one
  pair: jax.Array    # [C, C] bool: j <= i in one document


def docs(spec: Spec, doc=None, doc_enter=None) -> Docs:
  """Masks from ``doc [C]`` (document index of each token) and
  ``doc_enter [C]`` (of the token before the chunk, on every row)."""
  c = spec.chunk
  causal = iota((c, c), 0) >= iota((c, c), 1)
  if not spec.segments:
    true = jnp.ones((c,), jnp.bool_)
    return Docs(true, true, jnp.bool_(True), causal)
  last = last_row(doc)
  read = doc == doc_enter
  carry = last_row(read.astype(_F32)) > 0.5
  return Docs(read, doc == last, carry,
              causal & (doc[:, None] == doc[None, :]))


def _column(x):
  """A per-token scalar ``[C]`` as a column ``[C, 1]``; ``[C, K]`` as is."""
  return x[:, None] if x.ndim == 1 else x


def read_weights(p: Gate | None, d: Docs):
  """``read_i exp(P_i)``: ``[C, 1]`` or ``[C, K]`` float32."""
  mask = d.read[:, None]
  if p is None:
    return mask.astype(_F32)
  return jnp.where(mask, jnp.exp(_column(p.hi + p.lo)), 0.0)


def write_weights(p: Gate | None, d: Docs):
  """``write_j exp(P_L - P_j)``: ``[C, 1]`` or ``[C, K]`` float32."""
  mask = d.write[:, None]
  if p is None:
    return mask.astype(_F32)
  last = gate_last(p)
  diff = gate_diff(Gate(last.hi[None], last.lo[None]),
                   Gate(_column(p.hi), _column(p.lo)))
  return jnp.where(mask, jnp.exp(diff), 0.0)


def carry_decay(p: Gate | None, d: Docs):
  """``carry exp(P_L)``: ``[]`` or ``[K]`` float32 (scales state rows)."""
  if p is None:
    return d.carry.astype(_F32)
  last = gate_last(p)
  return jnp.where(d.carry, jnp.exp(last.hi + last.lo), 0.0)


def pair_weights(p: Gate | None, d: Docs):
  """``pair_ij exp(P_i - P_j)``, ``[C, C]`` (scalar decay or none), the
  mask applied before ``exp``."""
  if p is None:
    return d.pair.astype(_F32)
  diff = gate_diff(Gate(p.hi[:, None], p.lo[:, None]),
                   Gate(p.hi[None, :], p.lo[None, :]))
  return jnp.exp(jnp.where(d.pair, diff, -jnp.inf))


def level_sizes(c: int):
  """The halving levels ``s = C/2, ..., 1`` of a chunk of ``C`` tokens (the
  delta rule's recursive block inverse walks them)."""
  return [c >> n for n in range(1, c.bit_length())]


# S: tokens per row block of the scores with a decay per key channel.
ROWS = 16


def row_blocks(spec: Spec) -> int:
  """Row blocks of ``ROWS`` tokens in a chunk."""
  return max(spec.chunk // ROWS, 1)


def row_factors(p_block: Gate, p_ref: Gate, p: Gate, ref: int):
  """``(f [S, K], e [C, K])`` of a row block whose reference token is
  ``ref`` (the token before the block): ``f = exp(P_i - P_R)`` for the
  block's rows ``p_block``, ``e = exp(P_R - P_j)`` for every key ``j <=
  R`` (zero after it: masked before ``exp``); ``p_ref`` ``[1, K]``, ``p``
  ``[C, K]``. Both are ``<= 1``."""
  f = jnp.exp(gate_diff(p_block, p_ref))
  before = iota((p.hi.shape[0], 1), 0) <= ref
  e = jnp.exp(jnp.where(before, gate_diff(p_ref, p), -jnp.inf))
  return f, e


def inside_decay(p_block: Gate, p_key: Gate, key, strict: bool):
  """``exp(P_i - P_j)`` ``[S, K]`` from key ``j`` (the block's row ``key``,
  ``p_key`` ``[1, K]``) to the block's queries ``i > j`` (``i >= j`` when
  not ``strict``: the diagonal, weight 1), zero on the others."""
  rows = iota((p_block.hi.shape[0], 1), 0)
  after = rows > key if strict else rows >= key
  return jnp.exp(jnp.where(after, gate_diff(p_block, p_key), -jnp.inf))


def split_blocks(x, n: int, axis: int = 0):
  """``x`` as ``n`` equal blocks along ``axis`` (``[n S, F]`` -> ``n`` row
  blocks ``[S, F]``): an equal split, as Triton splits values."""
  return [x] if n == 1 else list(jnp.split(x, n, axis=axis))


def stack_rows(parts):
  """Row blocks ``[S, F]`` (in order) as one ``[n S, F]`` value: a select
  per block on ``[n, S, F]`` and a reshape (Triton concatenates no
  values)."""
  n = len(parts)
  if n == 1:
    return parts[0]
  s, f = parts[0].shape
  which = iota((n, s, f), 0)
  out = jnp.zeros((n, s, f), parts[0].dtype)
  for b, x in enumerate(parts):
    out = jnp.where(which == b, x[None], out)
  return out.reshape(n * s, f)


def band_to_square(band):
  """``band [C, S]`` (row ``i``: the pairs with the keys of its own row
  block) as the block-diagonal ``[C, C]``."""
  c, s = band.shape
  n = c // s
  if n == 1:
    return band
  shape = (c, n, s)
  own = iota(shape, 1) == jax.lax.div(iota(shape, 0), s)
  return jnp.where(own, band[:, None, :], 0.0).reshape(c, c)


def diagonal(c: int):
  return iota((c, c), 0) == iota((c, c), 1)

