"""The kernel body: one sub-chunk of the chunked recurrence, read from refs.

Shared by the Mosaic (TPU) and Triton (GPU) kernels, which differ only in how
they walk the sub-chunks (grid steps plus unrolled loops on TPU, one
``fori_loop`` per program on GPU) and where they keep the state.

A sub-chunk holds ``c`` tokens; ``S`` is the state entering it, kept
transposed (``[V, K]``). With ``L_i`` the log-decay summed from the
sub-chunk's start to token ``i``, ``L_c`` its total and ``s`` the query
scale (``[.]`` is 1 where the condition holds, else 0):

    q~_i = s q_i exp(L_i) [no document starts in the sub-chunk up to i]
    k~_j = k_j exp(L_c - L_j) [j is in the sub-chunk's last document]
    A_ij = s sum_k q_ik k_jk exp(L_ik - L_jk)   for j <= i, one document
    o    = q~ S^T + A v
    S'   = exp(L_c) [no document starts in the sub-chunk] S + v^T k~

and, going back, with ``D_ij = exp(L_i - L_j)`` for a scalar decay (1 with
none; a decay per key channel sums ``D`` inside, one key row at a time):

    dA   = (do v^T) masked to the pairs of A
    dq   = s exp(L) [...] (do S) + s (dA * D) k          (forward sweep)
    dv   = A^T do + k~ dS^T                               (reverse sweep)
    dk   = exp(L_c - L) [...] (v dS) + s (dA * D)^T q
    dS  <- exp(L_c) [...] dS + do^T q~                    (gradient of S)

The log-decays' gradient needs no kernel of its own. Every term depends on
``L`` through ``exp(L_i)`` on the query side, ``exp(-L_j)`` on the key side
and, for ``L_c``, through the state leaving the sub-chunk, so

    dL_i = q_i dq_i - k_i dk_i + [i = c] sum_v S'_vk dS'_vk
    dg_m = sum_{i >= m in the sub-chunk} dL_i

with ``S'`` the state leaving the sub-chunk and ``dS'`` its gradient. The
reverse sweep returns ``sum_v S' dS'`` per sub-chunk (``exit_gate_grad``),
recomputing ``S'`` from checkpoints of the state that the forward sweep
writes once per chunk; the sums of at most ``c`` terms are left to XLA. A
sum over the whole sequence (``dg_m = sum_{t >= m} (q dq - k dk)_t``) would
be exact too, but it adds up the rounding errors of every later token's
``dq`` and ``dk``, which bfloat16 matmuls make too large.

Numerics: every exponent is a sum of at most ``c`` log-decays, and the one
of ``A`` is set to -inf above the diagonal before ``exp``, so every factor
is a decay ``<= 1``: strong gates underflow to 0, never overflow. The state,
the scores and every accumulation are float32.

Letters: i query row and j key row of the sub-chunk, k key channel, v value
channel, g gate width (1 or K).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

_F32 = jnp.float32
NN = (((1,), (0,)), ((), ()))  # a @ b
NT = (((1,), (1,)), ((), ()))  # a @ b.T
TN = (((0,), (0,)), ((), ()))  # a.T @ b

GATES = ("none", "scalar", "channel")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a kernel body is specialised for (all static)."""
  backend: str       # "tpu" or "gpu": how key rows are read
                     # (see _over_key_rows)
  gate: str          # "none", "scalar" (one log-decay per head) or "channel"
  segments: bool     # document indices are given
  scale: float       # query scale s
  sub_chunk: int     # c
  bf16_dots: bool    # matmul operands in bfloat16 (bfloat16 inputs); else
                     # float32 operands at the highest precision


def dot(a, b, dims, spec: KernelSpec):
  """A float32-accumulated matmul (dims: ``NN``, ``NT`` or ``TN``)."""
  if spec.bf16_dots:
    return lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                           dims, preferred_element_type=_F32)
  return lax.dot_general(a.astype(_F32), b.astype(_F32), dims,
                         precision=lax.Precision.HIGHEST,
                         preferred_element_type=_F32)


class SubChunk(NamedTuple):
  """The values of one sub-chunk that every pass needs."""
  q: jax.Array           # [c, K] float32, scaled
  k: jax.Array           # [c, K] float32
  v: jax.Array           # [c, V] input dtype
  q_factor: jax.Array    # [c, g] exp(L_i) where the entering state reaches i
  k_factor: jax.Array    # [c, g] exp(L_c - L_j) where j reaches the exit
  state_decay: jax.Array  # [1, g] exp(L_c) where the state passes through
  mask: jax.Array        # [c, c] bool, pairs j <= i of one document
  decay: jax.Array | None  # [c, c] exp(L_i - L_j) masked (scalar gate only)
  log_decay: jax.Array | None  # [c, K] L (per-channel gate only)


def _row(ref, index):
  return ref[pl.ds(index, 1), :]


def load(refs, spec: KernelSpec, start, index) -> SubChunk:
  """Reads the sub-chunk at row ``start`` (sub-chunk number ``index``)."""
  c = spec.sub_chunk
  rows = pl.ds(start, c)
  q = refs["q"][rows, :].astype(_F32) * spec.scale              # [c, K]
  k = refs["k"][rows, :].astype(_F32)                           # [c, K]
  v = refs["v"][rows, :]                                        # [c, V]
  causal = (lax.broadcasted_iota(jnp.int32, (c, c), 0)
            >= lax.broadcasted_iota(jnp.int32, (c, c), 1))
  ones = jnp.ones((c, 1), _F32)
  reach, keep, passes = ones, ones, jnp.ones((1, 1), _F32)
  mask = causal
  if spec.segments:
    doc = refs["doc"][rows, :]                                  # [c, 1]
    prev = _row(refs["doc_prev"], start)                        # [1, 1]
    last = _row(refs["doc"], start + c - 1)                     # [1, 1]
    reach = (doc == prev).astype(_F32)                          # [c, 1]
    keep = (doc == last).astype(_F32)                           # [c, 1]
    passes = (last == prev).astype(_F32)                        # [1, 1]
    mask = causal & (doc == refs["doc_row"][index])             # [c, c]
  decay = log_decay = None
  if spec.gate == "none":
    q_factor, k_factor, state_decay = reach, keep, passes
  else:
    local = refs["log_decay"][rows, :]                          # [c, g]
    total = _row(refs["log_decay"], start + c - 1)              # [1, g]
    q_factor = jnp.exp(local) * reach
    k_factor = jnp.exp(total - local) * keep
    state_decay = jnp.exp(total) * passes
    if spec.gate == "scalar":
      pair = local - refs["log_decay_row"][index]               # [c, c]
      decay = jnp.exp(jnp.where(mask, pair, -jnp.inf))
    else:
      log_decay = local
  return SubChunk(q, k, v, q_factor, k_factor, state_decay, mask, decay,
                  log_decay)


def _over_key_rows(refs, spec: KernelSpec, start, sub: SubChunk, body, init):
  """Folds ``body(j, k_j [1, K], E_j [c, K], carry)`` over the key rows j.

  ``E_j[i] = exp(L_i - L_j)`` for ``i >= j`` and 0 above: the exponent is
  set to -inf there before exp. On TPU the loop is unrolled and rows are
  static slices of the loaded values (no dynamic sublane offsets); on GPU it
  is a ``fori_loop`` reading rows from the refs (Triton cannot slice values).
  """
  below = lax.broadcasted_iota(jnp.int32, sub.log_decay.shape, 0)

  def decay_from(l_j, j):
    return jnp.exp(jnp.where(below >= j, sub.log_decay - l_j, -jnp.inf))

  if spec.backend == "tpu":
    carry = init
    for j in range(spec.sub_chunk):
      l_j = sub.log_decay[j:j + 1, :]                           # [1, K]
      carry = body(j, sub.k[j:j + 1, :], decay_from(l_j, j), carry)
    return carry

  def step(j, carry):
    k_j = _row(refs["k"], start + j).astype(_F32)               # [1, K]
    l_j = _row(refs["log_decay"], start + j)                    # [1, K]
    return body(j, k_j, decay_from(l_j, j), carry)

  return lax.fori_loop(0, spec.sub_chunk, step, init)


def _column(x, j):
  """Column ``j`` of ``x: [c, c]`` as ``[c, 1]`` (no slicing of values)."""
  cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
  return jnp.sum(jnp.where(cols == j, x, 0.0), axis=1, keepdims=True)


def _put_column(x, j, column):
  cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
  return x + jnp.where(cols == j, column, 0.0)


def _put_row(x, j, row):
  rows = lax.broadcasted_iota(jnp.int32, x.shape, 0)
  return x + jnp.where(rows == j, row, 0.0)


def scores(refs, spec: KernelSpec, start, sub: SubChunk):
  """``A: [c, c]`` float32, zero outside the pairs of ``sub.mask``."""
  if spec.gate != "channel":
    a = dot(sub.q, sub.k, NT, spec)
    return jnp.where(sub.mask, a if sub.decay is None else a * sub.decay, 0.0)
  def column(j, k_j, e_j, a):
    return _put_column(a, j, jnp.sum(sub.q * k_j * e_j, axis=1, keepdims=True))

  c = spec.sub_chunk
  a = _over_key_rows(refs, spec, start, sub, column, jnp.zeros((c, c), _F32))
  return jnp.where(sub.mask, a, 0.0)


def _score_grads(refs, spec: KernelSpec, start, sub: SubChunk, do):
  """``dA: [c, c]`` (times ``D`` for a scalar decay)."""
  d_scores = jnp.where(sub.mask, dot(do, sub.v, NT, spec), 0.0)
  return d_scores if sub.decay is None else d_scores * sub.decay


def advance_from(refs, spec: KernelSpec, start, state):
  """The state leaving the sub-chunk at row ``start`` (reads only what the
  state update needs: keys, values, log-decays and documents)."""
  c = spec.sub_chunk
  rows = pl.ds(start, c)
  k = refs["k"][rows, :].astype(_F32)                           # [c, K]
  keep, passes = jnp.ones((c, 1), _F32), jnp.ones((1, 1), _F32)
  if spec.segments:
    doc = refs["doc"][rows, :]                                  # [c, 1]
    last = _row(refs["doc"], start + c - 1)                     # [1, 1]
    keep = (doc == last).astype(_F32)
    passes = (last == _row(refs["doc_prev"], start)).astype(_F32)
  if spec.gate != "none":
    local = refs["log_decay"][rows, :]                          # [c, g]
    total = _row(refs["log_decay"], start + c - 1)              # [1, g]
    keep = jnp.exp(total - local) * keep
    passes = jnp.exp(total) * passes
  return state * passes + dot(refs["v"][rows, :], k * keep, TN, spec)


def advance(state, sub: SubChunk, spec: KernelSpec):
  """``S' = exp(L_c) [...] S + v^T k~``, state ``[V, K]`` float32."""
  return state * sub.state_decay + dot(sub.v, sub.k * sub.k_factor, TN, spec)


def exit_gate_grad(state_out, d_state):
  """``sum_v S' dS'``: ``[1, K]``, the gradient of ``L_c`` through the state
  leaving the sub-chunk (``state_out``, ``d_state``: ``[V, K]``)."""
  return jnp.sum(state_out * d_state, axis=0, keepdims=True)


def forward_step(refs, spec: KernelSpec, start, index, state):
  """Outputs ``[c, V]`` of one sub-chunk and the state leaving it."""
  sub = load(refs, spec, start, index)
  a = scores(refs, spec, start, sub)
  o = (dot(sub.q * sub.q_factor, state, NT, spec)
       + dot(a, sub.v, NN, spec))                               # [c, V]
  return o, advance(state, sub, spec)


def dq_step(refs, spec: KernelSpec, start, index, state):
  """``dq: [c, K]`` of one sub-chunk and the state leaving it."""
  sub = load(refs, spec, start, index)
  do = refs["do"][pl.ds(start, spec.sub_chunk), :]              # [c, V]
  d_scores = _score_grads(refs, spec, start, sub, do)
  dq = dot(do, state, NN, spec) * sub.q_factor                  # [c, K]
  if spec.gate != "channel":
    dq = dq + dot(d_scores, sub.k, NN, spec)
  else:
    dq = _over_key_rows(
        refs, spec, start, sub,
        lambda j, k_j, e_j, acc: acc + _column(d_scores, j) * k_j * e_j, dq)
  return dq * spec.scale, advance(state, sub, spec)


def dkv_step(refs, spec: KernelSpec, start, index, d_state):
  """``dk: [c, K]``, ``dv: [c, V]`` of one sub-chunk and the gradient of
  the state entering it, from ``d_state``, that of the state leaving it."""
  sub = load(refs, spec, start, index)
  do = refs["do"][pl.ds(start, spec.sub_chunk), :]              # [c, V]
  d_scores = _score_grads(refs, spec, start, sub, do)
  if spec.gate != "channel":
    a = scores(refs, spec, start, sub)
    dk = dot(d_scores, sub.q, TN, spec)                         # [c, K]
  else:
    def column_and_row(j, k_j, e_j, carry):
      a, dk = carry
      a = _put_column(a, j, jnp.sum(sub.q * k_j * e_j, axis=1, keepdims=True))
      dk = _put_row(dk, j, jnp.sum(_column(d_scores, j) * sub.q * e_j,
                                   axis=0, keepdims=True))
      return a, dk

    c = spec.sub_chunk
    a, dk = _over_key_rows(
        refs, spec, start, sub, column_and_row,
        (jnp.zeros((c, c), _F32), jnp.zeros(sub.k.shape, _F32)))
    a = jnp.where(sub.mask, a, 0.0)
  dv = dot(a, do, TN, spec) + dot(sub.k * sub.k_factor, d_state, NT, spec)
  dk = dk + dot(sub.v, d_state, NN, spec) * sub.k_factor
  d_state = (d_state * sub.state_decay
             + dot(do, sub.q * sub.q_factor, TN, spec))         # [V, K]
  return dk, dv, d_state
