"""The math of one pair of a query block and a key block, on loaded values,
shared by the Mosaic and Triton kernel bodies.

With ``c`` the cumulative log forget gate of the query head:

    s_ij = scale q_i . k_j + (c_i - c_j)     (the bias first: c_i - c_j is
                                              exact when c_i and c_j are
                                              close, the common case)
    o_i  = sum_j P_ij v_j,   P_ij = exp(s_ij - lse_i) over the visible j

Forward (``online_step``): the online softmax of flash attention, float32
statistics ``m`` (running maximum) and ``l`` (running sum), masked entries
set to ``-inf`` before ``exp`` (a row with nothing visible yet keeps the
pivot 0, so no ``inf - inf`` arises).

Backward, with ``delta_i = o_i . do_i`` and ``dP = do v^T``:

    dS = P * (dP - delta)
    dq = scale dS k,   dk = scale dS^T q,   dv = P^T do
    dc = rowsum(dS) - colsum(dS)

(``c_i`` enters every ``s_ij`` of row ``i`` with +1 and every ``s_ji`` of
column ``i`` with -1.) The dq programs hold a query block and produce
``dq`` and the row sums; the dk/dv programs hold a key block and produce
``dk``, ``dv`` and the column sums, computing the transposed scores ``s^T``
(keys on rows) so that every product is ``a b`` or ``a b^T``.

The functions below take either orientation: per-token values come as a
column ``[n, 1]`` for the rows' tokens and a row ``[1, m]`` for the
columns' tokens, and broadcast.

Letters: i query, j key; q, k, v blocks ``[rows, F]``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from pallas_kernels.common import dots

_F32 = jnp.float32
NN, NT = dots.NN, dots.NT


@dataclasses.dataclass(frozen=True)
class Spec:
  """Static settings of a kernel body."""
  scale: float              # query scale
  window: int | None        # visible keys: i - j < window
  documents: bool           # a document index enters the kernel
  mode: str                 # matmul mode (``common/dots.py``)


def dot(a, b, dims, spec: Spec):
  return dots.dot(a, b, dims, mode=spec.mode)


def visible(spec: Spec, pos_q, pos_k, doc_q=None, doc_k=None):
  """bool, broadcast of ``pos_q`` and ``pos_k`` (int32 positions): ``j <=
  i``, ``i - j < window``, one document."""
  mask = pos_k <= pos_q
  if spec.window is not None:
    mask = mask & (pos_q - pos_k < spec.window)
  if spec.documents:
    mask = mask & (doc_q == doc_k)
  return mask


def scores(spec: Spec, a, b, c_q, c_k):
  """``scale a b^T + (c_q - c_k)``, float32: the scores ``s`` (``a = q``,
  ``b = k``, ``c_q`` a column) or ``s^T`` (``a = k``, ``b = q``, ``c_q`` a
  row)."""
  return spec.scale * dot(a, b, NT, spec) + (c_q - c_k)


def online_step(spec: Spec, s, mask, m, l, acc, v):
  """One key block of the forward pass: ``s [bq, bk]``, ``mask``, the
  statistics ``m``, ``l`` ``[bq, 1]`` and the unnormalised outputs ``acc
  [bq, V]`` before, the block's values ``v [bk, V]``; returns them after."""
  s = jnp.where(mask, s, -jnp.inf)
  m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  pivot = jnp.where(m_next == -jnp.inf, 0.0, m_next)
  alpha = jnp.exp(m - pivot)
  p = jnp.exp(s - pivot)
  l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
  acc = alpha * acc + dot(p, v, NN, spec)
  return m_next, l, acc


def finish(m, l, acc):
  """``(o, lse)`` from the final statistics: every row sees its own key, so
  ``l >= 1``."""
  return acc / l, m + jnp.log(l)


def probabilities(s, mask, lse):
  """``P = exp(s - lse)`` on the visible entries, 0 elsewhere (masked
  before ``exp``); ``lse`` broadcasts as ``s``'s query side."""
  return jnp.exp(jnp.where(mask, s - lse, -jnp.inf))


def score_grads(p, dp, delta):
  """``dS = P * (dP - delta)``, float32."""
  return p * (dp - delta)
