"""The chunk form shared by linear attention over a fixed feature map of q
and k (Based's Taylor features, Performer's FAVOR+): an XLA path of its own
that never forms the features in full, and normalized ``chunk_linear_attn``
on the features for the Pallas kernels and the context-parallel split."""

from __future__ import annotations

from typing import Callable

from lin_attn_jax.ops.common import checks, context_parallel, dispatch
from lin_attn_jax.ops.linear_attn.chunk import chunk_linear_attn


def check_feature_inputs(q, k, v, initial_state, segment_ids, chunk_size,
                         impl, *, state_rows: Callable[[int], int],
                         rows_layout: str):
  """Checks the arguments of a feature-map chunk form; ``state_rows(K)`` is
  the state's feature width (``rows_layout`` names it). Returns
  ``(B, T, H, K, V)``."""
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  checks.check_float("q", q)
  checks.check_float("k", k)
  checks.check_state("initial_state", initial_state,
                     (b, h, state_rows(dk), dv + 1),
                     f"[B, H, {rows_layout}, V + 1]")
  checks.check_segment_ids(segment_ids, b, t)
  checks.check_chunk_size(chunk_size)
  dispatch.check_impl(impl)
  return b, t, h, dk, dv


def run_on_features(features: Callable, xla: Callable, v, *, initial_state,
                    output_final_state, segment_ids, chunk_size, impl):
  """``xla()``, or normalized ``chunk_linear_attn`` (scale 1) on the
  ``features() -> (phi(q), phi(k))`` under a sequence split or with
  ``impl="pallas"``."""

  def on_features(impl):
    fq, fk = features()
    return chunk_linear_attn(fq, fk, v, scale=1.0, normalize=True,
                             initial_state=initial_state,
                             output_final_state=output_final_state,
                             segment_ids=segment_ids, chunk_size=chunk_size,
                             impl=impl)

  if context_parallel.sequence_parallel_size() > 1:
    return on_features(impl)
  return dispatch.run(impl, xla, lambda: on_features("pallas"),
                      family="gated_linear")
