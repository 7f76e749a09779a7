"""Linformer attention, its one form (see the package docstring)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.softmax_attn.inputs import (check_grouped_qkv,
                                                  default_scale)

_F32 = jnp.float32

NOT_CAUSAL = (
    "Linformer has no causal form: every projected key E k and value F v is "
    "a mix of all T positions, the future ones included, so masking the "
    "[T, P] scores cannot hide the future. Use causal=False (encoder-style "
    "attention), or a causal op such as chunk_softmax_attn.")

_NOT_SPLIT = (
    "Linformer cannot split the sequence over the {p} devices of mesh axis "
    "'sequence': it is not causal, so no device's outputs follow from a "
    "summary of the tokens before it, and its projections E and F have one "
    "column per position of the whole sequence (a fixed T). Use a mesh "
    "without a 'sequence' axis (or of size 1) for a model with Linformer "
    "layers.")


def linformer_attn(q, k, v, e, f, *, scale=None, causal=False):
  """Linformer attention (non-causal by construction).

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv``.
    e, f: ``[P, T]`` projections of the keys and of the values along T.
    scale: score scale, ``K ** -0.5`` when None.
    causal: must be False; True raises ``ValueError`` (see the module
      docstring). So does a current mesh with a ``"sequence"`` axis of size
      > 1: Linformer cannot split the sequence.
  Returns:
    ``o [B, T, H, V]`` in v's dtype.

  Example:
    >>> q = k = v = jnp.ones((1, 64, 2, 8)); e = f = jnp.ones((16, 64)) / 64
    >>> linformer_attn(q, k, v, e, f).shape
    (1, 64, 2, 8)
  """
  if causal:
    raise ValueError(NOT_CAUSAL)
  parts = context_parallel.sequence_parallel_size()
  if parts > 1:
    raise ValueError(_NOT_SPLIT.format(p=parts))
  b, t, h, hkv, dk, dv = check_grouped_qkv(q, k, v)
  for name, x in (("e", e), ("f", f)):
    checks.check_rank(name, x, 2, "[P, T]")
    checks.check_float(name, x)
    if checks.shape_of(x)[1] != t:
      raise ValueError(f"{name} must have shape [P, T] with T = {t} (the "
                       f"length of q {checks.shape_of(q)}), got "
                       f"{checks.shape_of(x)}")
  if checks.shape_of(e) != checks.shape_of(f):
    raise ValueError(f"e and f must have the same shape [P, T], got "
                     f"{checks.shape_of(e)} and {checks.shape_of(f)}")
  scale = default_scale(scale, dk)
  k_proj = jnp.einsum("pt,bthk->bphk", e, k,
                      preferred_element_type=_F32)              # [B, P, h, K]
  v_proj = jnp.einsum("pt,bthv->bphv", f, v,
                      preferred_element_type=_F32)              # [B, P, h, V]
  qg = jnp.asarray(q, _F32).reshape(b, t, hkv, h // hkv, dk)    # [B,T,h,g,K]
  s = scale * jnp.einsum("bthgk,bphk->bhgtp", qg, k_proj,
                         preferred_element_type=_F32)           # [B,h,g,T,P]
  p = jax.nn.softmax(s, axis=-1)
  o = jnp.einsum("bhgtp,bphv->bthgv", p, v_proj,
                 preferred_element_type=_F32)                   # [B,T,h,g,V]
  return o.reshape(b, t, h, dv).astype(v.dtype)
