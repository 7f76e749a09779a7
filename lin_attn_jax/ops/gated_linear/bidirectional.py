"""The non-causal gated-linear core (``causal=False`` on its forms): LION.

    o_i = sum_{j in i's document} M_ij (scale q_i . (d_ij * k_j)) v_j

with ``d_ij = exp(sum of g_m for m strictly after the earlier of i, j up to
the later one)``, per head or per key channel: ``M = L + L^T - I`` from the
causal mask ``L`` (``lin_attn_jax/ops/common/bidirectional.py``). Without
gates it is plain non-causal linear attention, ``q_i^T sum_j k_j v_j^T``
over the document.

``lion_definition`` is the definition (dense ``[T, T]``, float32); the
other forms are their causal form run forward and on the reversed sequence
with the gates moved one token earlier, minus the diagonal ``scale (q_i .
k_i) v_i`` counted by both.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from lin_attn_jax.ops.common import bidirectional
from lin_attn_jax.ops.common.decay import pairwise_sums
from lin_attn_jax.ops.common.segments import document_index, same_document_mask

_F32 = jnp.float32
_HIGHEST = "highest"


def lion_definition(q, k, v, g, *, scale, segment_ids):
  """The dense non-causal form, float32 ``[B, T, H, V]``.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: validated log-decays ``[B, T, H, G]`` (G = 1 or K), or None.
    scale: the query scale.
    segment_ids: ``[B, T]`` int or None.
  """
  b, t, h, dk = q.shape
  qf, kf, vf = (jnp.asarray(x, _F32) for x in (q, k, v))
  if g is None:
    g = jnp.zeros((b, t, h, 1), _F32)
  lower = pairwise_sums(g, axis=1)                         # [B, I, J, H, G]
  below = jnp.tril(jnp.ones((t, t), bool))[None, :, :, None, None]
  log_decay = jnp.where(below, lower, jnp.swapaxes(lower, 1, 2))
  doc = document_index(segment_ids, b, t)
  same = same_document_mask(doc, doc)[..., None, None]     # [B, I, J, 1, 1]
  decay = jnp.where(same, jnp.exp(log_decay), 0.0)         # [B, I, J, H, G]
  decay = jnp.broadcast_to(decay, (b, t, t, h, g.shape[-1]))
  if g.shape[-1] == 1:
    scores = jnp.einsum("bihk,bjhk->bijh", qf, kf,
                        precision=_HIGHEST) * decay[..., 0]
  else:
    scores = jnp.einsum("bihk,bjhk,bijhk->bijh", qf, kf, decay,
                        precision=_HIGHEST)
  return scale * jnp.einsum("bijh,bjhv->bihv", scores, vf,
                            precision=_HIGHEST)              # [B, T, H, V]


def diagonal(q, k, v, scale):
  """``scale (q_i . k_i) v_i``, float32 ``[B, T, H, V]``: the token's own
  term, counted by the forward and the backward scan."""
  qk = jnp.einsum("bthk,bthk->bth", jnp.asarray(q, _F32),
                  jnp.asarray(k, _F32), precision=_HIGHEST)
  return scale * qk[..., None] * jnp.asarray(v, _F32)


def gate_as_given(g):
  """A validated gate ``[B, T, H, G]`` as the forms take it (``[B, T, H]``
  for G = 1), or None."""
  if g is None:
    return None
  return g[..., 0] if g.shape[-1] == 1 else g


def lion_outputs(causal_form: Callable, q, k, v, g, *, scale, segment_ids):
  """The non-causal output from ``causal_form(q, k, v, g, scale=...,
  segment_ids=...) -> (o, state)``, float32 ``[B, T, H, V]`` (``g`` as the
  caller was given it: ``[B, T, H]``, ``[B, T, H, K]`` or None)."""

  def causal(q, k, v, g, segment_ids):
    return causal_form(q, k, v, g, scale=scale, segment_ids=segment_ids)[0]

  return bidirectional.lion(causal, dict(q=q, k=k, v=v), dict(g=g),
                            diagonal(q, k, v, scale),
                            segment_ids=segment_ids)
