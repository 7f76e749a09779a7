"""The non-causal linear scan (``causal=False`` on its sequence forms): LION.

    h_i = sum_{j in i's document} M_ij b_j,
    M_ij = prod_{m=j+1}^{i} a_m  (j <= i),   prod_{m=i+1}^{j} a_m  (j >= i)

(``lin_attn_jax/ops/common/bidirectional.py``): the forward scan, plus the
scan of the reversed sequence with every decay one token earlier
(``h^B_i = a_{i+1} h^B_{i+1} + b_i``), minus ``b_i``, counted by both.
``lion_definition`` is the dense ``[T, T]`` form; the RG-LRU and Mamba's
selective scan reach the others through their coefficients ``(a, b)``.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from lin_attn_jax.ops.common import bidirectional
from lin_attn_jax.ops.common.segments import document_index, same_document_mask

_F32 = jnp.float32


def lion_definition(a, b, segment_ids):
  """Dense ``h [B, T, ...]`` float32 from ``a, b: [B, T, ...]``.

  The decays between two tokens are cumulative products of the terms
  strictly after the earlier token up to the later one (``a`` may be any
  real number, so no logarithms).
  """
  a, b = jnp.asarray(a, _F32), jnp.asarray(b, _F32)
  batch, length = a.shape[:2]
  rest = (1,) * (a.ndim - 2)
  strict = jnp.tril(jnp.ones((length, length), bool), -1).reshape(
      (1, length, length) + rest)                            # [1, I, J, ...]
  terms = jnp.where(strict, a[:, :, None], 1.0)              # [B, I, J, ...]
  lower = jnp.cumprod(terms, axis=1)                         # j <= i
  below = jnp.tril(jnp.ones((length, length), bool)).reshape(strict.shape)
  decay = jnp.where(below, lower, jnp.swapaxes(lower, 1, 2))
  doc = document_index(segment_ids, batch, length)
  same = same_document_mask(doc, doc).reshape((batch, length, length) + rest)
  return jnp.sum(jnp.where(same, decay, 0.0) * b[:, None], axis=2)


def lion_scan(scan: Callable, a, b, segment_ids):
  """``h`` float32 from ``scan(a, b, segment_ids) -> h`` (a causal scan of
  float32 coefficients ``[B, T, ...]``): forward, backward, ``- b``."""

  def causal(a, b, segment_ids):
    return scan(a, b, segment_ids)

  a, b = jnp.asarray(a, _F32), jnp.asarray(b, _F32)
  return bidirectional.lion(causal, dict(b=b), dict(a=a), b,
                            segment_ids=segment_ids, fill=1.0)
