"""Validation of PaTH attention's inputs.

Queries have ``H`` heads; keys, values, the Householder directions ``w``
and their strengths ``beta`` have ``Hkv`` heads, ``H`` a multiple of
``Hkv`` (query head ``h`` reads key/value head ``h // (H // Hkv)``); the
forget gate ``g``, when given, has one log-gate per query head and token,
as in flash-linear-attention.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.softmax_attn.inputs import (check_grouped_qkv,
                                                  check_heads)


def default_scale(scale, dk: int) -> float:
  return dk ** -0.5 if scale is None else scale


def check_householder(w, beta, k, name_k="k"):
  """``w`` has the shape of ``k`` and ``beta`` one entry per key head."""
  checks.check_float("w", w)
  checks.check_float("beta", beta)
  k_shape = checks.shape_of(k)
  if checks.shape_of(w) != k_shape:
    raise ValueError(f"w must have the shape of {name_k} {k_shape}, got "
                     f"{checks.shape_of(w)}")
  checks.check_shape("beta", beta, k_shape[:-1],
                     "one strength per key head and token")


def check_gate(g, shape, layout: str):
  """An optional forget gate: log-gates ``<= 0`` of shape ``shape``."""
  if g is None:
    return
  checks.check_float("g", g)
  checks.check_shape("g", g, shape, layout)
  checks.check_nonpositive("g", g)


def validate(q, k, v, w, beta, g, segment_ids):
  """Checks a sequence call; returns ``(B, T, H, Hkv, K, V)``.

  q: ``[B, T, H, K]``; k, w: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``;
  beta: ``[B, T, Hkv]``; g: ``[B, T, H]`` or None; segment_ids: ``[B, T]``
  or None.
  """
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  checks.check_rank("w", w, 4, "[B, T, Hkv, K]")
  check_householder(w, beta, k)
  check_gate(g, (b, t, h), "[B, T, H]")
  checks.check_segment_ids(segment_ids, b, t)
  return b, t, h, hkv, dk, dv


def validate_step(q, k, v, w, beta, g):
  """Checks one decoding token; returns ``(B, H, Hkv, K, V)``.

  q: ``[B, H, K]``; k, w: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``; beta:
  ``[B, Hkv]``; g: ``[B, H]`` or None.
  """
  checks.check_rank("q", q, 3, "[B, H, K]")
  checks.check_rank("k", k, 3, "[B, Hkv, K]")
  checks.check_rank("v", v, 3, "[B, Hkv, V]")
  checks.check_rank("w", w, 3, "[B, Hkv, K]")
  for name, x in (("q", q), ("k", k), ("v", v)):
    checks.check_float(name, x)
  b, h, dk = checks.shape_of(q)
  bk, hkv, dkk = checks.shape_of(k)
  if (bk, dkk) != (b, dk):
    raise ValueError(f"k must have shape [B, Hkv, K] with B, K of q "
                     f"{checks.shape_of(q)}, got {checks.shape_of(k)}")
  if checks.shape_of(v)[:2] != (b, hkv):
    raise ValueError(f"v must agree with k on [B, Hkv] = {(b, hkv)}, got v "
                     f"of shape {checks.shape_of(v)}")
  check_heads(h, hkv, checks.shape_of(q), checks.shape_of(k))
  check_householder(w, beta, k)
  check_gate(g, (b, h), "[B, H]")
  return b, h, hkv, dk, checks.shape_of(v)[2]
