"""The chunkwise form of Based: the Taylor kernel in XLA
(``taylor_kernel.py``), or linear attention on the features."""

from __future__ import annotations

import functools

from lin_attn_jax.ops.based.inputs import based_features
from lin_attn_jax.ops.based.taylor_kernel import taylor_chunk
from lin_attn_jax.ops.common import checks, context_parallel, dispatch
from lin_attn_jax.ops.linear_attn.chunk import chunk_linear_attn
from lin_attn_jax.ops.linear_attn.inputs import divide, with_normalizer


def chunk_based(q, k, v, *, scale=None, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                impl="auto"):
  """Chunkwise Based linear attention.

  Args:
    q, k: ``[B, T, H, K]`` (raw, before the Taylor map); v: ``[B, T, H, V]``.
    scale: ``s`` in the Taylor kernel, ``K ** -0.5`` when None.
    initial_state: ``[B, H, 1 + K + K^2, V + 1]`` float32.
    output_final_state, segment_ids ``[B, T]``, chunk_size, impl: as in
      ``chunk_linear_attn``.
  Returns:
    ``(o [B, T, H, V], final_state or None)``.

  The XLA form (``ops/based/taylor_kernel.py``) evaluates the Taylor kernel
  from ``q . k`` inside chunks and carries the state in blocks; the Pallas
  kernels and the context-parallel split run ``chunk_linear_attn`` on the
  features.
  """
  b, t, h, dk, dv = checks.check_qkv(q, k, v)
  checks.check_float("q", q)
  checks.check_float("k", k)
  checks.check_state("initial_state", initial_state,
                     (b, h, 1 + dk + dk * dk, dv + 1),
                     "[B, H, 1 + K + K^2, V + 1]")
  checks.check_segment_ids(segment_ids, b, t)
  checks.check_chunk_size(chunk_size)
  dispatch.check_impl(impl)

  def features(impl):
    fq, fk = based_features(q, k, scale)
    return chunk_linear_attn(fq, fk, v, scale=1.0, normalize=True,
                             initial_state=initial_state,
                             output_final_state=output_final_state,
                             segment_ids=segment_ids, chunk_size=chunk_size,
                             impl=impl)

  if context_parallel.sequence_parallel_size() > 1:
    return features(impl)

  def xla():
    o, final = taylor_chunk(
        q, k, with_normalizer(v), scale=dk ** -0.5 if scale is None else scale,
        initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size)
    return divide(o, v.dtype), final

  return dispatch.run(impl, xla, functools.partial(features, "pallas"),
                      family="gated_linear")
