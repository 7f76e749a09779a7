"""The chunkwise form of Based: the Taylor kernel in XLA
(``taylor_kernel.py``), or linear attention on the features."""

from __future__ import annotations

from lin_attn_jax.ops.based.inputs import based_features
from lin_attn_jax.ops.based.taylor_kernel import taylor_chunk
from lin_attn_jax.ops.linear_attn.on_features import (check_feature_inputs,
                                                      run_on_features)
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
  dk = check_feature_inputs(
      q, k, v, initial_state, segment_ids, chunk_size, impl,
      state_rows=lambda dk: 1 + dk + dk * dk, rows_layout="1 + K + K^2")[3]

  def xla():
    o, final = taylor_chunk(
        q, k, with_normalizer(v), scale=dk ** -0.5 if scale is None else scale,
        initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size)
    return divide(o, v.dtype), final

  return run_on_features(
      lambda: based_features(q, k, scale), xla, v,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)
