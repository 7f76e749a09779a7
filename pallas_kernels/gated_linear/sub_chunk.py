"""The TPU kernel body: one sub-chunk of the chunked recurrence, read from
refs (the GPU kernels are chunk-parallel: ``gpu.py``, ``chunk_math.py``).

A sub-chunk holds ``c`` tokens; ``S`` is the state entering it, kept
transposed (``[V, K]``). With ``g`` the log-decays, ``L_i = sum_{m <= i} g_m``
and ``R_j = sum_{m > j} g_m`` (sums inside the sub-chunk), ``P_ij =
sum_{j < m <= i} g_m`` and ``s`` the query scale (``[.]`` is 1 where the
condition holds, else 0):

    q~_i = s q_i exp(L_i) [no document starts in the sub-chunk up to i]
    k~_j = k_j exp(R_j) [j is in the sub-chunk's last document]
    A_ij = s sum_k q_ik k_jk exp(P_ijk)   for j <= i in one document
    o    = q~ S^T + A v
    S'   = exp(L_c) [no document starts in the sub-chunk] S + v^T k~

and, going back, with ``D_ij = exp(P_ij)`` for a scalar decay (1 with none;
a decay per key channel sums ``D`` inside, one key row at a time):

    dA   = (do v^T) masked to the pairs of A
    dq   = s exp(L) [...] (do S) + s (dA * D) k          (forward sweep)
    dv   = A^T do + k~ dS^T                               (reverse sweep)
    dk   = exp(R) [...] (v dS) + s (dA * D)^T q
    dS  <- exp(L_c) [...] dS + do^T q~                    (gradient of S)

The log-decays' gradient needs no kernel of its own: ``g_m`` enters every
term through the pairs ``j < m <= i`` that span it, and ``dg_m`` is the sum
of their contributions ``W_ij`` (``q_i dq_i = sum_j W_ij`` and ``k_j dk_j =
sum_i W_ij``). For ``m`` in a sub-chunk, by where ``j`` and ``i`` lie:

    j before the sub-chunk, i >= m in it:   sum_{i >= m} q_i dq_i (from S)
    j < m in it, i after it:                sum_{j < m} k_j dk_j (from dS')
    j before it, i after it:                sum_v exp(L_c) [...] S dS'
    j < m <= i, both in it:                 scalar decay: sum of W_ij, the
        [c, c] matrix summed directly; per key channel: sum_{i >= m}
        q_i dq'_i - sum_{j >= m} k_j dk'_j (``dq'``, ``dk'`` without the
        diagonal, which spans no gate)

with ``S`` the state entering the sub-chunk and ``dS'`` the gradient of the
state leaving it. Each line is a sum of the contributions it names, so no
large terms cancel; only the per-channel pairs inside a sub-chunk (at most
16 tokens) are formed as a difference, since summing ``W_ijk`` directly
would need a ``[c, c, K]`` array or ``c`` matmuls per sub-chunk. The sweeps
return these per-token and per-sub-chunk terms (``gate_q``, ``GateTerms``),
the reverse sweep recomputing ``S`` from checkpoints of the state that the
forward sweep writes once per chunk; the cumulative sums of at most ``c``
terms are left to XLA. (Summing ``q dq - k dk`` over the whole rest of the
sequence would be exact too, but adds up the rounding of every later
token's gradients: with bfloat16 matmuls, over the tolerance.)

Numerics: ``L``, ``R``, ``P`` and the totals are each summed from their own
gates (constant 0/1 matmuls at float32 precision, or a running sum over key
rows), never as a difference of two prefix sums, which would keep only
``~ulp(|L|)`` of a weak gate after strong ones. The exponent of ``A`` is set
to -inf above the diagonal before ``exp``, so every factor is a decay
``<= 1``: strong gates underflow to 0, never overflow. The state, the scores
and every accumulation are float32.

Letters: i query row and j key row of the sub-chunk, m a token between them,
k key channel, v value channel, g gate width (1 or K).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import dots
from pallas_kernels.common.dots import NN, NT, TN

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel body is specialised for (all static)."""
  gate: str          # "none", "scalar" (one log-decay per head) or "channel"
  segments: bool     # document indices are given
  scale: float       # query scale s
  sub_chunk: int     # c
  bf16_dots: bool    # matmul operands in bfloat16 (bfloat16 inputs); else
                     # float32 (``pallas_kernels.common.dots``)


def dot(a, b, dims, spec: KernelSpec, *, exact=False):
  """A float32-accumulated matmul (dims: ``NN``, ``NT`` or ``TN``).

  ``exact``: float32 operands at the highest precision whatever the inputs
  (for the 0/1 matmuls that sum log-decays).
  """
  bf16 = spec.bf16_dots and not exact
  return dots.dot(a, b, dims, mode="bf16" if bf16 else "f32")


def _iotas(shape):
  return (lax.broadcasted_iota(jnp.int32, shape, 0),
          lax.broadcasted_iota(jnp.int32, shape, 1))


def _row(ref, index):
  return ref[pl.ds(index, 1), :]


class LogDecays(NamedTuple):
  """Log-decays of one sub-chunk, each summed from its own gates."""
  to_end: jax.Array            # [c, g] R_j = sum_{m > j} g_m
  total: jax.Array             # [1, g] L_c
  local: jax.Array | None      # [c, g] L_i = sum_{m <= i} g_m
  pair: jax.Array | None       # [c, c] P_ij (scalar gate)
  gates: jax.Array | None      # [c, K] g (per-channel gate)


def log_decays(refs, spec: KernelSpec, start, index, *, queries=True):
  """``queries=False``: only what the state update needs (``to_end``,
  ``total``)."""
  c = spec.sub_chunk
  i, m = _iotas((c, c))
  upto, after = m <= i, m > i                                   # [c, c]
  if spec.gate == "scalar":
    g_row = refs["gate_row"][index]                             # [1, c]
    g = jnp.broadcast_to(g_row, (c, c))                         # [., m]
    to_end = jnp.sum(jnp.where(after, g, 0.0), axis=1, keepdims=True)
    total = jnp.sum(g_row, axis=1, keepdims=True)               # [1, 1]
    if not queries:
      return LogDecays(to_end, total, None, None, None)
    below_upto = jnp.where(upto, g, 0.0)                        # [i, m]
    local = jnp.sum(below_upto, axis=1, keepdims=True)          # [c, 1]
    # P[i, j] = sum_m [m <= i] g_m [m > j]; rows of the 0/1 factor are m.
    pair = dot(below_upto, (i > m).astype(_F32), NN, spec, exact=True)
    return LogDecays(to_end, total, local, pair, None)
  g = refs["gate"][pl.ds(start, c), :]                          # [c, K]
  to_end = dot(after.astype(_F32), g, NN, spec, exact=True)
  total = jnp.sum(g, axis=0, keepdims=True)                     # [1, K]
  if not queries:
    return LogDecays(to_end, total, None, None, None)
  local = dot(upto.astype(_F32), g, NN, spec, exact=True)
  return LogDecays(to_end, total, local, None, g)


class SubChunk(NamedTuple):
  """The values of one sub-chunk that every pass needs."""
  q: jax.Array           # [c, K] float32, scaled
  k: jax.Array           # [c, K] float32
  v: jax.Array           # [c, V] input dtype
  q_factor: jax.Array    # [c, g] exp(L_i) where the entering state reaches i
  k_factor: jax.Array    # [c, g] exp(R_j) where j reaches the exit
  state_decay: jax.Array  # [1, g] exp(L_c) where the state passes through
  mask: jax.Array        # [c, c] bool, pairs j <= i of one document
  decay: jax.Array | None  # [c, c] exp(P_ij) masked (scalar gate only)
  gates: jax.Array | None  # [c, K] g (per-channel gate only)


def _documents(refs, spec: KernelSpec, start):
  """``(reach [c, 1], keep [c, 1], passes [1, 1], doc [c, 1] or None)``."""
  c = spec.sub_chunk
  if not spec.segments:
    ones = jnp.ones((c, 1), _F32)
    return ones, ones, jnp.ones((1, 1), _F32), None
  doc = refs["doc"][pl.ds(start, c), :]                         # [c, 1]
  prev = _row(refs["doc_prev"], start)                          # [1, 1]
  last = _row(refs["doc"], start + c - 1)                       # [1, 1]
  return ((doc == prev).astype(_F32), (doc == last).astype(_F32),
          (last == prev).astype(_F32), doc)


def load(refs, spec: KernelSpec, start, index) -> SubChunk:
  """Reads the sub-chunk at row ``start`` (sub-chunk number ``index``)."""
  c = spec.sub_chunk
  rows = pl.ds(start, c)
  q = refs["q"][rows, :].astype(_F32) * spec.scale              # [c, K]
  k = refs["k"][rows, :].astype(_F32)                           # [c, K]
  v = refs["v"][rows, :]                                        # [c, V]
  i, j = _iotas((c, c))
  reach, keep, passes, doc = _documents(refs, spec, start)
  mask = i >= j
  if doc is not None:
    mask = mask & (doc == refs["doc_row"][index])               # [c, c]
  if spec.gate == "none":
    return SubChunk(q, k, v, reach, keep, passes, mask, None, None)
  logs = log_decays(refs, spec, start, index)
  decay = None
  if logs.pair is not None:
    decay = jnp.exp(jnp.where(mask, logs.pair, -jnp.inf))       # [c, c]
  return SubChunk(q, k, v, jnp.exp(logs.local) * reach,
                  jnp.exp(logs.to_end) * keep,
                  jnp.exp(logs.total) * passes, mask, decay, logs.gates)


def _over_key_rows(spec: KernelSpec, sub: SubChunk, body, init):
  """Folds ``body(j, k_j [1, K], E_j [c, K], carry)`` over the key rows j,
  last to first (unrolled; rows are static slices of the loaded values, no
  dynamic sublane offsets).

  ``E_j[i] = exp(P_ij)`` for ``i >= j`` and 0 above (the exponent is set to
  -inf there before exp). ``P_ij`` is a running sum, ``P_ij = P_i,j+1 +
  g_j+1``, so each entry is summed from its own gates.
  """
  c = spec.sub_chunk
  below, _ = _iotas(sub.gates.shape)
  pair = jnp.zeros(sub.gates.shape, _F32)
  carry = init
  for j in reversed(range(c)):
    g_next = sub.gates[min(j + 1, c - 1):min(j + 1, c - 1) + 1, :]
    pair = jnp.where(below > j, pair + g_next, 0.0)             # [c, K]
    e_j = jnp.exp(jnp.where(below >= j, pair, -jnp.inf))
    carry = body(j, sub.k[j:j + 1, :], e_j, carry)
  return carry


def _column(x, j):
  """Column ``j`` of ``x: [c, c]`` as ``[c, 1]`` (no slicing of values)."""
  _, cols = _iotas(x.shape)
  return jnp.sum(jnp.where(cols == j, x, 0.0), axis=1, keepdims=True)


def _put_column(x, j, column):
  _, cols = _iotas(x.shape)
  return x + jnp.where(cols == j, column, 0.0)


def _put_row(x, j, row):
  rows, _ = _iotas(x.shape)
  return x + jnp.where(rows == j, row, 0.0)


def scores(refs, spec: KernelSpec, start, sub: SubChunk):
  """``A: [c, c]`` float32, zero outside the pairs of ``sub.mask``."""
  if spec.gate != "channel":
    a = dot(sub.q, sub.k, NT, spec)
    return jnp.where(sub.mask, a if sub.decay is None else a * sub.decay, 0.0)

  def column(j, k_j, e_j, a):
    return _put_column(a, j, jnp.sum(sub.q * k_j * e_j, axis=1, keepdims=True))

  c = spec.sub_chunk
  a = _over_key_rows(spec, sub, column, jnp.zeros((c, c), _F32))
  return jnp.where(sub.mask, a, 0.0)


def _score_grads(spec: KernelSpec, sub: SubChunk, do):
  """``(dp, dA', dA_ii)``: ``dp = do v^T`` off the diagonal and masked,
  ``dA' = dp * D`` (``D = 1`` without a scalar decay), both ``[c, c]``, and
  the diagonal ``dA_ii: [c, 1]`` (``D_ii = 1``)."""
  c = spec.sub_chunk
  i, j = _iotas((c, c))
  dp = jnp.where(sub.mask & (i > j), dot(do, sub.v, NT, spec), 0.0)
  d_scores = dp if sub.decay is None else dp * sub.decay
  diagonal = jnp.sum(do.astype(_F32) * sub.v.astype(_F32), axis=1,
                     keepdims=True)
  return dp, d_scores, diagonal


def _gate_width(x, spec: KernelSpec):
  """``[c, K] -> [c, g]``: a scalar gate takes the sum over channels."""
  return jnp.sum(x, axis=1, keepdims=True) if spec.gate == "scalar" else x


class GateTerms(NamedTuple):
  """The reverse sweep's terms of the log-decays' gradient, one sub-chunk."""
  k_inter: jax.Array           # [c, g] k_j dk_j from later sub-chunks
  k_intra: jax.Array | None    # [c, K] k_j dk'_j inside (per-channel gate)
  pairs: jax.Array | None      # [1, c] sum of W_ij over j < m <= i (scalar)
  entry: jax.Array             # [1, g] sum_v exp(L_c) [...] S dS'


def gate_term_outputs(spec: KernelSpec):
  """``(name, per_token, width)`` of the reverse sweep's ``GateTerms``
  outputs: per token ``[T, width]``, else per sub-chunk ``[T / c, 1,
  width]``; ``width`` is ``"k"`` (key channels) or a number."""
  if spec.gate == "none":
    return []
  width = 1 if spec.gate == "scalar" else "k"
  middle = (("gate_pairs", False, spec.sub_chunk) if spec.gate == "scalar"
            else ("gate_k_intra", True, "k"))
  return [("gate_k_inter", True, width), middle, ("entry_grad", False, width)]


def store_gate_terms(refs, terms: GateTerms, start, index, spec: KernelSpec):
  """Writes one sub-chunk's ``GateTerms`` to the outputs named above."""
  rows = pl.ds(start, spec.sub_chunk)
  refs["gate_k_inter"][rows, :] = terms.k_inter
  if terms.k_intra is not None:
    refs["gate_k_intra"][rows, :] = terms.k_intra
  if terms.pairs is not None:
    refs["gate_pairs"][index] = terms.pairs
  refs["entry_grad"][index] = terms.entry


def advance(state, sub: SubChunk, spec: KernelSpec):
  """``S' = exp(L_c) [...] S + v^T k~``, state ``[V, K]`` float32."""
  return state * sub.state_decay + dot(sub.v, sub.k * sub.k_factor, TN, spec)


def advance_from(refs, spec: KernelSpec, start, index, state):
  """The state leaving the sub-chunk at row ``start`` (reads only what the
  state update needs: keys, values, log-decays and documents)."""
  c = spec.sub_chunk
  rows = pl.ds(start, c)
  k = refs["k"][rows, :].astype(_F32)                           # [c, K]
  _, keep, passes, _ = _documents(refs, spec, start)
  if spec.gate != "none":
    logs = log_decays(refs, spec, start, index, queries=False)
    keep = jnp.exp(logs.to_end) * keep
    passes = jnp.exp(logs.total) * passes
  return state * passes + dot(refs["v"][rows, :], k * keep, TN, spec)


def forward_step(refs, spec: KernelSpec, start, index, state):
  """Outputs ``[c, V]`` of one sub-chunk and the state leaving it."""
  sub = load(refs, spec, start, index)
  a = scores(refs, spec, start, sub)
  o = (dot(sub.q * sub.q_factor, state, NT, spec)
       + dot(a, sub.v, NN, spec))                               # [c, V]
  return o, advance(state, sub, spec)


def dq_step(refs, spec: KernelSpec, start, index, state):
  """``(dq [c, K], gate_q [c, g], state leaving the sub-chunk)``.

  ``gate_q`` is ``q dq`` from the earlier sub-chunks, plus, with a decay per
  key channel, ``q dq'`` from the pairs inside (see the module docstring).
  """
  sub = load(refs, spec, start, index)
  do = refs["do"][pl.ds(start, spec.sub_chunk), :]              # [c, V]
  _, d_scores, diagonal = _score_grads(spec, sub, do)
  dq = dot(do, state, NN, spec) * sub.q_factor                  # [c, K]
  if spec.gate != "channel":
    gate_q = _gate_width(sub.q * dq, spec)
    dq = dq + dot(d_scores, sub.k, NN, spec)
  else:
    dq = _over_key_rows(
        spec, sub,
        lambda j, k_j, e_j, acc: acc + _column(d_scores, j) * k_j * e_j, dq)
    gate_q = sub.q * dq
  dq = (dq + diagonal * sub.k) * spec.scale
  return dq, gate_q, advance(state, sub, spec)


def dkv_step(refs, spec: KernelSpec, start, index, d_state, state_in=None):
  """``(dk [c, K], dv [c, V], gradient of the state entering the sub-chunk,
  GateTerms or None)`` from ``d_state``, the gradient of the state leaving
  it; ``state_in`` (the state entering it) is needed with a decay."""
  sub = load(refs, spec, start, index)
  do = refs["do"][pl.ds(start, spec.sub_chunk), :]              # [c, V]
  dp, d_scores, diagonal = _score_grads(spec, sub, do)
  c = spec.sub_chunk
  if spec.gate != "channel":
    a = scores(refs, spec, start, sub)
    dk_intra = dot(d_scores, sub.q, TN, spec)                   # [c, K]
  else:
    def column_and_row(j, k_j, e_j, carry):
      a, dk = carry
      a = _put_column(a, j, jnp.sum(sub.q * k_j * e_j, axis=1, keepdims=True))
      dk = _put_row(dk, j, jnp.sum(_column(d_scores, j) * sub.q * e_j,
                                   axis=0, keepdims=True))
      return a, dk

    a, dk_intra = _over_key_rows(
        spec, sub, column_and_row,
        (jnp.zeros((c, c), _F32), jnp.zeros(sub.k.shape, _F32)))
    a = jnp.where(sub.mask, a, 0.0)
  dv = dot(a, do, TN, spec) + dot(sub.k * sub.k_factor, d_state, NT, spec)
  dk_inter = dot(sub.v, d_state, NN, spec) * sub.k_factor       # [c, K]
  dk = dk_inter + dk_intra + diagonal * sub.q
  terms = None
  if spec.gate != "none":
    pairs = k_intra = None
    if spec.gate == "scalar":
      # W_ij = dA_ij A_ij; pairs_m = sum_{i >= m} sum_{j < m} W_ij, each a
      # sum of its own terms (a 0/1 matmul, then a masked column sum).
      i, m = _iotas((c, c))
      prefix = dot(dp * a, (i < m).astype(_F32), NN, spec, exact=True)
      pairs = jnp.sum(jnp.where(i >= m, prefix, 0.0), axis=0, keepdims=True)
    else:
      k_intra = sub.k * dk_intra
    entry = jnp.sum(state_in * sub.state_decay * d_state, axis=0,
                    keepdims=True)                              # [1, K]
    terms = GateTerms(_gate_width(sub.k * dk_inter, spec), k_intra, pairs,
                      _gate_width(entry, spec))
  d_state = (d_state * sub.state_decay
             + dot(do, sub.q * sub.q_factor, TN, spec))         # [V, K]
  return dk, dv, d_state, terms
