"""Based's linear attention (Arora et al. 2024, https://arxiv.org/abs/2402.18668):
normalized linear attention with the second-order Taylor feature map,
``phi(q) . phi(k) = 1 + s q.k + (s q.k)^2 / 2`` with ``s = scale``.

q and k have a small feature dimension ``K`` (16 in the paper); the state is
``[B, H, 1 + K + K^2, V + 1]`` (the last value column is the normalizer).
The sliding-window softmax half of a Based block lives in the layer.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from lin_attn_jax import feature_maps
from lin_attn_jax.ops.based.chunk import taylor_chunk
from lin_attn_jax.ops.common import checks, context_parallel, dispatch
from lin_attn_jax.ops.linear_attn import (NORMALIZER_EPS, chunk_linear_attn,
                                          linear_attn_step,
                                          naive_recurrent_linear_attn,
                                          parallel_linear_attn,
                                          recurrent_linear_attn)


def based_features(q, k, scale=None):
  """Taylor features of q and k (``[..., K] -> [..., 1 + K + K^2]``)."""
  checks.check_float("q", q)
  checks.check_float("k", k)
  return feature_maps.taylor(q, scale), feature_maps.taylor(k, scale)


def _call(form, q, k, v, scale, **kwargs):
  fq, fk = based_features(q, k, scale)
  return form(fq, fk, v, scale=1.0, normalize=True, **kwargs)


def naive_recurrent_based(q, k, v, *, scale=None, initial_state=None,
                          output_final_state=False, segment_ids=None):
  """Reference recurrence; arguments as in ``chunk_based``."""
  return _call(naive_recurrent_linear_attn, q, k, v, scale,
               initial_state=initial_state,
               output_final_state=output_final_state, segment_ids=segment_ids)


def parallel_based(q, k, v, *, scale=None, initial_state=None,
                   output_final_state=False, segment_ids=None):
  """Quadratic masked form; arguments as in ``chunk_based``."""
  return _call(parallel_linear_attn, q, k, v, scale,
               initial_state=initial_state,
               output_final_state=output_final_state, segment_ids=segment_ids)


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

  The XLA form (``ops/based/chunk.py``) evaluates the Taylor kernel from
  ``q . k`` inside chunks and carries the state in blocks; the Pallas
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
  features = functools.partial(
      _call, chunk_linear_attn, q, k, v, scale, initial_state=initial_state,
      output_final_state=output_final_state, segment_ids=segment_ids,
      chunk_size=chunk_size)
  if context_parallel.sequence_parallel_size() > 1:
    return features(impl=impl)

  def xla():
    vf = jnp.asarray(v, jnp.float32)
    v_aug = jnp.concatenate([vf, jnp.ones_like(vf[..., :1])], axis=-1)
    o, final = taylor_chunk(
        q, k, v_aug, scale=dk ** -0.5 if scale is None else scale,
        initial_state=initial_state, output_final_state=output_final_state,
        segment_ids=segment_ids, chunk_size=chunk_size)
    o = o[..., :-1] / (o[..., -1:] + NORMALIZER_EPS)
    return o.astype(v.dtype), final

  return dispatch.run(impl, xla, lambda: features(impl="pallas"),
                      family="gated_linear")


def recurrent_based(q, k, v, *, scale=None, initial_state=None,
                    output_final_state=False, segment_ids=None):
  """Token-by-token scan; arguments as in ``chunk_based``."""
  return _call(recurrent_linear_attn, q, k, v, scale,
               initial_state=initial_state,
               output_final_state=output_final_state, segment_ids=segment_ids)


def based_step(q, k, v, state=None, *, scale=None, reset=None):
  """One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``."""
  fq, fk = based_features(q, k, scale)
  return linear_attn_step(fq, fk, v, state, scale=1.0, normalize=True,
                          reset=reset)
