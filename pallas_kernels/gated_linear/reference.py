"""The kernels' algorithm in plain ``jnp``, float32: a ``lax.scan`` over
sub-chunks, each computed exactly (see ``sub_chunk.py`` for the equations).

It documents what the kernels compute, checks them in the tests, and runs
wherever XLA does; its gradient is JAX's autodiff of the scan.

Letters: n sub-chunk, b batch, i and j position in a sub-chunk, h head,
k key channel, v value channel, g gate width (1 or K).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def _sub_chunks(x, c):
  """``[B, T, ...] -> [N, B, c, ...]`` (T a multiple of c)."""
  b, t = x.shape[:2]
  return jnp.moveaxis(x.reshape(b, t // c, c, *x.shape[2:]), 1, 0)


def chunk_gated_linear_attention_reference(
    q, k, v, g=None, *, scale=None, initial_state=None,
    output_final_state=False, segment_ids=None, sub_chunk=16):
  """Arguments and returns as ``chunk_gated_linear_attention``."""
  b, t, h, dk = q.shape
  dv, out_dtype = v.shape[-1], v.dtype
  scale = dk ** -0.5 if scale is None else scale
  c = sub_chunk
  pad = (-t) % c
  if g is None:
    g = jnp.zeros((b, t, h, 1), _F32)
  g = jnp.asarray(g, _F32)
  g = g[..., None] if g.ndim == 3 else g
  if segment_ids is None:
    doc = jnp.zeros((b, t), _F32)
  else:
    ids = jnp.asarray(segment_ids)
    doc = jnp.cumsum(jnp.pad((ids[:, 1:] != ids[:, :-1]).astype(_F32),
                             ((0, 0), (1, 0))), axis=1)
  doc = jnp.pad(doc, ((0, 0), (0, pad)), mode="edge")           # [B, T]
  prev = jnp.concatenate([jnp.zeros_like(doc[:, :1]), doc[:, :-1]], axis=1)
  widths = ((0, 0), (0, pad), (0, 0), (0, 0))
  qs, k, v, g = (_sub_chunks(jnp.pad(jnp.asarray(x, _F32), widths), c)
                 for x in (scale * jnp.asarray(q, _F32), k, v, g))
  doc, prev = _sub_chunks(doc, c), _sub_chunks(prev, c)         # [N, B, c]
  # Every log-decay summed from its own gates, never a difference of sums.
  local = jnp.cumsum(g, axis=2)                                 # [N,B,c,H,G]
  after = jax.lax.cumsum(g, axis=2, reverse=True)               # m >= j
  to_end = jnp.pad(after[:, :, 1:], ((0, 0), (0, 0), (0, 1), (0, 0),
                                     (0, 0)))                   # m > j
  idx = jnp.arange(c)
  spans = ((idx[None, None, :] > idx[None, :, None])
           & (idx[None, None, :] <= idx[:, None, None])).astype(_F32)
  causal = jnp.tril(jnp.ones((c, c), dtype=bool))

  def step(state, xs):
    q_n, k_n, v_n, g_n, local_n, to_end_n, doc_n, prev_n = xs
    total = jnp.sum(g_n, axis=1)                                # [B, H, G]
    first, last = prev_n[:, :1], doc_n[:, -1:]                  # [B, 1]
    reach = (doc_n == first)[..., None, None]                   # [B,c,1,1]
    keep = (doc_n == last)[..., None, None]                     # [B,c,1,1]
    passes = (last == first)[..., None, None]                   # [B,1,1,1]
    mask = causal & (doc_n[:, :, None] == doc_n[:, None, :])    # [B, i, j]
    pair = jnp.einsum("ijm,bmhg->bijhg", spans, g_n,
                      precision=_HIGHEST)                       # [B,i,j,H,G]
    decay = jnp.exp(jnp.where(mask[..., None, None], pair, -jnp.inf))
    decay = jnp.broadcast_to(decay, decay.shape[:-1] + (dk,))   # [B,i,j,H,K]
    scores = jnp.einsum("bihk,bjhk,bijhk->bhij", q_n, k_n, decay,
                        precision=_HIGHEST)
    q_in = q_n * jnp.exp(local_n) * reach                       # [B,c,H,K]
    k_out = k_n * jnp.exp(to_end_n) * keep                      # [B,c,H,K]
    o = (jnp.einsum("bihk,bhkv->bihv", q_in, state, precision=_HIGHEST)
         + jnp.einsum("bhij,bjhv->bihv", scores, v_n, precision=_HIGHEST))
    state = (jnp.where(passes, jnp.exp(total)[..., None], 0.0) * state
             + jnp.einsum("bjhk,bjhv->bhkv", k_out, v_n, precision=_HIGHEST))
    return state, o

  state = (jnp.zeros((b, h, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  state, o = jax.lax.scan(step, state,
                          (qs, k, v, g, local, to_end, doc, prev))
  o = jnp.moveaxis(o, 0, 1).reshape(b, -1, h, dv)[:, :t]
  return o.astype(out_dtype), (state if output_final_state else None)
