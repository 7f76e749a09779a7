"""RWKV-6, chunkwise: the GLA core's chunk form, strictly causal, plus bonus."""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.gated_linear.chunk import chunk_gated_linear
from lin_attn_jax.ops.rwkv6.inputs import bonus, default_scale, validate


def chunk_rwkv6(r, k, v, w, u, *, scale=None, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                sub_chunk_size=8):
  """RWKV-6 (Finch), chunkwise; the training path.

  ``o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale * r_t)``, ``S_t =
  diag(exp(w_t)) S_{t-1} + k_t v_t^T``: gated linear attention whose output
  reads the state before the token (``chunk_gated_linear(...,
  strictly_causal=True)``), plus the current token weighted by ``u``.

  Args:
    r, k: ``[B, T, H, K]`` receptance and key; v: ``[B, T, H, V]``.
    w: ``[B, T, H, K]`` natural-log decay ``<= 0``.
    u: ``[H, K]`` bonus of the current token.
    scale: receptance scale, ``K ** -0.5`` when None (RWKV models use 1.0).
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size, sub_chunk_size: as in ``chunk_gated_linear`` (speed only).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> r = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> w = jnp.full((1, 100, 2, 16), -0.1); u = jnp.ones((2, 16))
    >>> o, _ = chunk_rwkv6(r, k, v, w, u, scale=1.0)
    >>> o.shape
    (1, 100, 2, 32)
  """
  dk = validate(r, k, v, w, u, initial_state, segment_ids)[3]
  scale = default_scale(scale, dk)
  # float32 values, so the output is rounded to v's dtype once, after the
  # bonus is added.
  o, final_state = chunk_gated_linear(
      r, k, jnp.asarray(v, jnp.float32), w, scale=scale,
      initial_state=initial_state, output_final_state=output_final_state,
      segment_ids=segment_ids, chunk_size=chunk_size,
      sub_chunk_size=sub_chunk_size, strictly_causal=True)
  o = o + bonus(r, k, v, u, scale)
  return o.astype(v.dtype), final_state
