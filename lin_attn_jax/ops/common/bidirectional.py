"""Non-causal forms of the recurrences, from their causal forms (LION).

LION (Afzal et al. 2025, https://arxiv.org/abs/2502.16249) makes a
decaying recurrence bidirectional with one full ``[T, T]`` mask, the decays
between ``i`` and ``j`` multiplied in both directions:

    o_i = sum_{j in i's document} M_ij (q_i . k_j) v_j
    M_ij = prod_{m=j+1}^{i} a_m  (j <= i),   prod_{m=i+1}^{j} a_m  (j >= i)

so ``M = L + L^T - I`` with ``L`` the causal mask: symmetric, 1 on the
diagonal. The lower triangle is the causal form; the upper one is the
causal form run on the reversed sequence with every decay moved one token
earlier (the backward recurrence ``S^B_i = a_{i+1} S^B_{i+1} + k_i v_i^T``,
``backward_gates``); both count the diagonal ``(q_i . k_i) v_i``, which is
subtracted once (``lion``). The existing chunk forms, kernels and
context-parallel splits run unchanged, twice.

Segment ids bound ``M`` to each document in both directions: reversed, they
mark the same documents, and the decay moved onto a document's last token
(the next document's first) only ever scales a state that its reset drops.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax.numpy as jnp

_F32 = jnp.float32


def flip_time(x, axis: int = 1):
  """``x`` reversed along time (None stays None)."""
  return None if x is None else jnp.flip(x, axis)


def backward_gates(g, *, fill: float = 0.0, axis: int = 1):
  """The gates of the backward scan, in reversed time: ``g_{t+1}`` at ``t``
  (``fill`` after the last token: 0 for a log-decay, 1 for a decay), then
  reversed. None stays None."""
  if g is None:
    return None
  g = jnp.asarray(g)
  axis = axis % g.ndim
  tail = jnp.full_like(jnp.take(g, jnp.array([0]), axis=axis), fill)
  later = jnp.concatenate(
      [jnp.take(g, jnp.arange(1, g.shape[axis]), axis=axis), tail], axis=axis)
  return jnp.flip(later, axis)


def lion(causal: Callable, tokens: Mapping[str, object],
         gates: Mapping[str, object], diagonal, *, segment_ids=None,
         fill: float = 0.0, axis: int = 1):
  """``forward + backward - diagonal``, float32.

  Args:
    causal: ``causal(**tokens, **gates, segment_ids=...)`` -> the causal
      output ``[B, T, ...]`` (the lower triangle of ``M``, diagonal
      included).
    tokens: the per-token inputs that are not decays, ``[B, T, ...]``.
    gates: the decays or log-decays, ``[B, T, ...]`` (None allowed): moved
      one token earlier for the backward scan.
    diagonal: the diagonal term ``[B, T, ...]`` (``(q_i . k_i) v_i`` scaled
      as the form scales it), counted by both scans.
    segment_ids: ``[B, T]`` int or None.
    fill: the gate after the last token (0 for log-decays, 1 for decays).
    axis: the time axis.
  Returns:
    ``[B, T, ...]`` float32.
  """
  forward = causal(**tokens, **gates, segment_ids=segment_ids)
  backward = causal(
      **{n: flip_time(x, axis) for n, x in tokens.items()},
      **{n: backward_gates(g, fill=fill, axis=axis) for n, g in gates.items()},
      segment_ids=flip_time(segment_ids, 1))
  return (jnp.asarray(forward, _F32) + flip_time(jnp.asarray(backward, _F32),
                                                 axis)
          - jnp.asarray(diagonal, _F32))


def check_no_state(name: str, causal: bool, initial_state,
                   output_final_state) -> None:
  """A non-causal form has no state: ``ValueError`` for an initial state or
  a final state asked of it (``name`` is the form)."""
  if causal:
    return
  if initial_state is not None or output_final_state:
    raise ValueError(
        f"{name} with causal=False has no state (every token sees its whole "
        "document): pass initial_state=None and output_final_state=False")
