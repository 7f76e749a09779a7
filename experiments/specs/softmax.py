"""Specs of the softmax attention family: full causal attention, a sliding
window, Longformer's window plus global tokens, the Sparse Transformer's
patterns and Linformer.

These ops keep no recurrent state and return ``o`` only; their forms here
return ``(o, None)``. The reference is the dense ``[T, T]`` form. The
decoding forms run ``softmax_attn_step`` over the sequence with a KV cache
(a ring buffer of ``WINDOW`` entries for the window) or prefill the whole
sequence into an empty cache with ``softmax_attn_extend``. Keys and values
have half the query heads when ``Dims.heads`` is even (grouped queries).
Linformer is not causal and has no form but its definition.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.specs.base import OpSpec, StepForm
from lin_attn_jax import ops

WINDOW = 16
STRIDE = 4
SUMMARY = 2
LINFORMER_RANK = 16


def _segments(key, batch, length):
  starts = jax.random.bernoulli(key, 0.05, (batch, length)).astype(jnp.int32)
  return jnp.cumsum(starts, axis=1)


def _inputs(key, dims, strong, global_tokens=False, projections=False):
  del strong
  kq, kk, kv, kseg, ke, kf = jax.random.split(key, 6)
  b, t, h, dk, dv = (dims.batch, dims.length, dims.heads, dims.dim_k,
                     dims.dim_v)
  hkv = h // 2 if h % 2 == 0 else h
  inputs = dict(q=jax.random.normal(kq, (b, t, h, dk), jnp.float32),
                k=jax.random.normal(kk, (b, t, hkv, dk), jnp.float32),
                v=jax.random.normal(kv, (b, t, hkv, dv), jnp.float32))
  if projections:
    shape = (LINFORMER_RANK, t)
    inputs["e"] = jax.random.normal(ke, shape, jnp.float32) * t ** -0.5
    inputs["f"] = jax.random.normal(kf, shape, jnp.float32) * t ** -0.5
  else:
    inputs["segment_ids"] = _segments(kseg, b, t)
  if global_tokens:
    # Static positions (not an array): the first token and the middle one.
    inputs["global_positions"] = (0, t // 2)
  return inputs


def _o_only(fn, block_arg=None, **static):
  """``fn`` returning ``o`` as a form returning ``(o, None)``; the chunk size
  of the verifier goes to ``block_arg``."""
  def form(*, initial_state=None, output_final_state=False, chunk_size=None,
           **inputs):
    del output_final_state
    if initial_state is not None:
      raise ValueError("softmax attention has no initial state")
    if chunk_size is not None:
      inputs[block_arg] = chunk_size
    return fn(**inputs, **static), None
  return form


def _empty_cache(window_size, q, k, v, **unused):
  """A cache for the whole of ``k`` [B, T, Hkv, K] (read from its ends, so
  that a k of the wrong rank reaches the op, which names it)."""
  del q, unused
  return ops.init_kv_cache(k.shape[0], k.shape[-2], k.shape[-1], v.shape[-1],
                           max_length=max(k.shape[:-2], default=1),
                           window_size=window_size, dtype=k.dtype)


def _cached_step(q, k, v, state, reset, scale=None):
  return ops.softmax_attn_step(q, k, v, state, scale=scale, reset=reset)


def _prefill(q, k, v, *, segment_ids=None, window_size=None, scale=None):
  cache = _empty_cache(window_size, q, k, v)
  return ops.softmax_attn_extend(q, k, v, cache, scale=scale,
                                 segment_ids=segment_ids)[0]


def _attention_forms(window_size=None):
  window = dict(window_size=window_size)
  return {
      "naive": _o_only(ops.parallel_softmax_attn, **window),
      "chunk": _o_only(ops.chunk_softmax_attn, "block_size", **window),
      "step": StepForm(_cached_step, ("q", "k", "v"),
                       init_state=functools.partial(_empty_cache, window_size),
                       final_state=False),
      "prefill": _o_only(_prefill, **window),
  }


def _sparse_forms(pattern):
  static = dict(stride=STRIDE, pattern=pattern, summary_size=SUMMARY)
  return {
      "naive": _o_only(ops.sparse_attn_reference, **static),
      "parallel": _o_only(ops.parallel_sparse_attn, "block_size", **static),
  }


_QKV = ("q", "k", "v")

SPECS = [
    OpSpec("softmax_attn", _attention_forms(), _inputs, _QKV),
    OpSpec("sliding_window_attn", _attention_forms(WINDOW), _inputs, _QKV),
    OpSpec("longformer_attn",
           {"naive": _o_only(ops.parallel_softmax_attn, window_size=WINDOW),
            "chunk": _o_only(ops.chunk_softmax_attn, "block_size",
                             window_size=WINDOW)},
           functools.partial(_inputs, global_tokens=True), _QKV),
    OpSpec("sparse_attn_strided", _sparse_forms("strided"), _inputs, _QKV,
           chunked=("parallel",)),
    OpSpec("sparse_attn_fixed", _sparse_forms("fixed"), _inputs, _QKV,
           chunked=("parallel",)),
    OpSpec("linformer_attn", {"naive": _o_only(ops.linformer_attn)},
           functools.partial(_inputs, projections=True), _QKV + ("e", "f"),
           chunked=()),
]
