"""Nystromformer attention, its one form (see the package docstring)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.pooling import (mean_pool, poison_rows,
                                             whole_row_inputs)
from lin_attn_jax.ops.nystrom_attn.pinv import iterative_pinv
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32

_POOLED = "its landmarks are means of queries and keys"


def nystrom_attn(q, k, v, *, num_landmarks: int = 64,
                 pinv_iterations: int = 6, pinv_init: str = "per_matrix",
                 scale=None, segment_ids=None, causal=False):
  """Nystromformer attention (non-causal by construction).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    num_landmarks: ``M``; the landmarks are the means of ``T / M`` tokens
      when ``M`` divides ``T`` (``mean_pool_matrix`` otherwise); ``M >= T``
      gives exact softmax attention.
    pinv_iterations, pinv_init: of ``iterative_pinv`` (6 and the paper's
      ``Z_0``; the reference code's default ``"original"`` is batch-wide).
    scale: score scale, ``K ** -0.5`` when None (the reference divides q
      and k by ``K ** 0.25`` each).
    segment_ids: ``[B, T]`` or None; more than one document in a row
      raises ``ValueError`` (concrete ids) or gives NaN in that row (traced
      ids), see the package docstring.
    causal: must be False (True raises ``ValueError``); so must a current
      mesh's ``"sequence"`` axis be of size 1.
  Returns:
    ``o [B, T, H, V]`` in v's dtype; softmaxes, the pseudo-inverse and
    products in float32.

  Example:
    >>> q = k = v = jnp.ones((1, 64, 2, 8))
    >>> nystrom_attn(q, k, v, num_landmarks=8).shape
    (1, 64, 2, 8)
  """
  (b, t, h, dk), bad_rows = whole_row_inputs(
      "Nystromformer", q, k, v, segment_ids=segment_ids, causal=causal,
      pooled=_POOLED)
  checks.positive_int("num_landmarks", num_landmarks)
  checks.positive_int("pinv_iterations", pinv_iterations)
  scale = default_scale(scale, dk)
  qf = scale * jnp.asarray(q, _F32)
  if num_landmarks >= t:
    s = jnp.einsum("bthk,bshk->bhts", qf, k,
                   preferred_element_type=_F32)                 # [B, H, T, T]
    o = jnp.einsum("bhts,bshv->bthv", jax.nn.softmax(s, axis=-1), v,
                   preferred_element_type=_F32)                 # [B, T, H, V]
    return poison_rows(o, bad_rows).astype(v.dtype)
  q_land = mean_pool(qf, num_landmarks)                         # [B, M, H, K]
  k_land = mean_pool(k, num_landmarks)                          # [B, M, H, K]
  f = jax.nn.softmax(jnp.einsum("bthk,bmhk->bhtm", qf, k_land,
                                preferred_element_type=_F32),
                     axis=-1)                                   # [B, H, T, M]
  a = jax.nn.softmax(jnp.einsum("bmhk,bnhk->bhmn", q_land, k_land,
                                preferred_element_type=_F32),
                     axis=-1)                                   # [B, H, M, M]
  bk = jax.nn.softmax(jnp.einsum("bmhk,bthk->bhmt", q_land, k,
                                 preferred_element_type=_F32),
                      axis=-1)                                  # [B, H, M, T]
  bv = jnp.einsum("bhmt,bthv->bhmv", bk, v,
                  preferred_element_type=_F32)                  # [B, H, M, V]
  a_pinv = iterative_pinv(a, iterations=pinv_iterations, init=pinv_init)
  o = jnp.einsum("bhtm,bhmn,bhnv->bthv", f, a_pinv, bv,
                 preferred_element_type=_F32)                   # [B, T, H, V]
  return poison_rows(o, bad_rows).astype(v.dtype)
