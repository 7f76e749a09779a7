"""Linear attention without decay (Katharopoulos et al. 2020,
https://arxiv.org/abs/2006.16236): ``S_t = S_{t-1} + k_t v_t^T``,
``o_t = S_t^T q_t``, optionally divided by ``q_t . sum_{j<=t} k_j``.

Apply a feature map (``lin_attn_jax.feature_maps``) to q and k first.

With ``normalize=True`` the state carries the running key sum as one extra
value column: ``initial_state`` and ``final_state`` are ``[B, H, K, V + 1]``
and ``o = num / (den + eps)`` (``eps = 1e-6``); the features must then be
positive so that the denominator is.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.gated_linear import (chunk_gated_linear,
                                           gated_linear_step,
                                           naive_recurrent_gated_linear,
                                           parallel_gated_linear,
                                           recurrent_gated_linear)

NORMALIZER_EPS = 1e-6


def _with_normalizer(v):
  """Appends the all-ones value column that accumulates ``q . sum k``."""
  vf = jnp.asarray(v, jnp.float32)
  return jnp.concatenate([vf, jnp.ones_like(vf[..., :1])], axis=-1)


def _divide(o_aug, dtype):
  o = o_aug[..., :-1] / (o_aug[..., -1:] + NORMALIZER_EPS)
  return o.astype(dtype)


def run_linear(form, q, k, v, normalize, **kwargs):
  """Calls a core form with no decay, normalising when asked."""
  if not normalize:
    return form(q, k, v, None, **kwargs)
  o, state = form(q, k, _with_normalizer(v), None, **kwargs)
  return _divide(o, v.dtype), state


def naive_recurrent_linear_attn(q, k, v, *, scale=None, normalize=False,
                                initial_state=None, output_final_state=False,
                                segment_ids=None):
  """Reference recurrence; arguments as in ``chunk_linear_attn``."""
  return run_linear(naive_recurrent_gated_linear, q, k, v, normalize,
                    scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state,
                    segment_ids=segment_ids)


def parallel_linear_attn(q, k, v, *, scale=None, normalize=False,
                         initial_state=None, output_final_state=False,
                         segment_ids=None):
  """Quadratic masked form; arguments as in ``chunk_linear_attn``."""
  return run_linear(parallel_gated_linear, q, k, v, normalize, scale=scale,
                    initial_state=initial_state,
                    output_final_state=output_final_state,
                    segment_ids=segment_ids)


def chunk_linear_attn(q, k, v, *, scale=None, normalize=False,
                      initial_state=None, output_final_state=False,
                      segment_ids=None, chunk_size=64, impl="auto"):
  """Chunkwise linear attention.

  Args:
    q, k: ``[B, T, H, K]`` (features already mapped); v: ``[B, T, H, V]``.
    scale: query scale, ``K ** -0.5`` when None.
    normalize: divide by ``q_t . sum_{j<=t} k_j`` (positive features).
    initial_state: ``[B, H, K, V]`` (``V + 1`` when normalizing) float32.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int; the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``, as in ``chunk_gated_linear``.
  Returns:
    ``(o [B, T, H, V], final_state or None)``.
  """
  return run_linear(chunk_gated_linear, q, k, v, normalize, scale=scale,
                    initial_state=initial_state,
                    output_final_state=output_final_state,
                    segment_ids=segment_ids, chunk_size=chunk_size, impl=impl)


def recurrent_linear_attn(q, k, v, *, scale=None, normalize=False,
                          initial_state=None, output_final_state=False,
                          segment_ids=None):
  """Token-by-token scan; arguments as in ``chunk_linear_attn``."""
  return run_linear(recurrent_gated_linear, q, k, v, normalize, scale=scale,
                    initial_state=initial_state,
                    output_final_state=output_final_state,
                    segment_ids=segment_ids)


def linear_attn_step(q, k, v, state=None, *, scale=None, normalize=False,
                     reset=None):
  """One decoding step: q, k ``[B, H, K]``, v ``[B, H, V]``, state
  ``[B, H, K, V]`` (``V + 1`` when normalizing). Returns ``(o, state)``."""
  if not normalize:
    return gated_linear_step(q, k, v, None, state, scale=scale, reset=reset)
  o, state = gated_linear_step(q, k, _with_normalizer(v), None, state,
                               scale=scale, reset=reset)
  return _divide(o, v.dtype), state
