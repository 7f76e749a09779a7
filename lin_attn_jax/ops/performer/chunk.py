"""The chunkwise form of Performer's FAVOR+ attention (see the package
docstring)."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.linear_attn.chunk import chunk_linear_attn
from lin_attn_jax.ops.linear_attn.on_features import (check_feature_inputs,
                                                      run_on_features)
from lin_attn_jax.ops.linear_attn.inputs import NORMALIZER_EPS
from lin_attn_jax.ops.performer.heads_first import (favor_chunk,
                                                    heads_first_features)


def favor_features(q, k, projection):
  """Query and key features ``[B, T, H, K] -> [B, T, H, M]`` float32, as
  ``chunk_favor_attn`` uses them."""
  return tuple(
      jnp.swapaxes(heads_first_features(x, projection, query=query), 1, 2)
      for x, query in ((q, True), (k, False)))


def chunk_favor_attn(q, k, v, projection, *, initial_state=None,
                     output_final_state=False, segment_ids=None,
                     chunk_size=64, impl="auto", causal=True):
  """Normalized causal FAVOR+ attention, chunkwise.

  ``phi(k) = exp(W k' - |k'|^2 / 2) / sqrt(M)`` (``k' = k / K ** 0.25``);
  queries the same shifted by their largest exponent, a per-query factor
  that cancels; ``o_t = phi(q_t)^T sum_{j<=t} phi(k_j) v_j^T / (phi(q_t) .
  sum_{j<=t} phi(k_j) + eps)``.

  Args:
    q, k: ``[B, T, H, K]`` (raw); v: ``[B, T, H, V]``.
    projection: ``[M, K]``, the random projection ``W``.
    initial_state: ``[B, H, M, V + 1]`` float32 (the last column the key
      feature sum).
    output_final_state, segment_ids ``[B, T]``, chunk_size, impl, causal: as
      in ``chunk_linear_attn`` (``causal=False``: normalized non-causal
      linear attention of the features, ``chunk_linear_attn``'s).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, M, V + 1] or None)``.
  """
  dk = checks.check_qkv(q, k, v)[3]
  checks.check_rank("projection", projection, 2, "[M, K]")
  if projection.shape[1] != dk:
    raise ValueError(f"projection must be [M, K] with K = {dk}, got "
                     f"{projection.shape}")
  check_feature_inputs(q, k, v, initial_state, segment_ids, chunk_size, impl,
                       state_rows=lambda dk: projection.shape[0],
                       rows_layout="M")
  if not causal:
    fq, fk = favor_features(q, k, projection)
    return chunk_linear_attn(fq, fk, v, scale=1.0, normalize=True,
                             initial_state=initial_state,
                             output_final_state=output_final_state,
                             segment_ids=segment_ids, chunk_size=chunk_size,
                             impl=impl, causal=False)
  xla = functools.partial(
      favor_chunk, q, k, v, projection, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size, eps=NORMALIZER_EPS)
  return run_on_features(
      lambda: favor_features(q, k, projection), xla, v,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)
