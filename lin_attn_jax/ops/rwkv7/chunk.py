"""RWKV-7, chunkwise, with the WY representation of its rank-one updates.

Inside a chunk, with ``x_i = S_{i-1}^T a_i`` the value that the rank-one term
reads and ``S_in`` the entering state (derivation in README.md):

1. Log-decays local to sub-chunks (``common.chunk_scores``).
2. Intra-chunk score matrices (``common.chunk_scores``): strictly causal
   (reading the state before i) ``A_ab``, ``A_ak`` with a as the query,
   causal ``P_rb``, ``P_rk`` with r as the query; all masked to one
   document.
3. WY: ``[W | U] = (I - A_ab)^{-1} [exp(G_{i-1}) * A | A_ak V]`` (one small
   unit-lower-triangular inverse per chunk, ``invert_unit_lower``); then
   ``X = W S_in + U``.
4. Chunk transitions ``S_out = (D + B_end^T W) S_in + B_end^T U + K_end^T V``
   and a ``lax.scan`` over chunks.
5. Outputs ``o = (exp(G) * R) S_in + P_rb X + P_rk V``.

Letters as in ``delta_rule/chunk.py``.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel
from lin_attn_jax.ops.common.chunk_scores import (exclusive_local,
                                                  intra_chunk_scores,
                                                  sub_chunk_log_decays)
from lin_attn_jax.ops.common.chunking import (merge_chunks, pad_time,
                                             split_chunks)
from lin_attn_jax.ops.delta_rule.chunk import (check_chunk_sizes, chunk_layout,
                                               document_masks,
                                               invert_unit_lower,
                                               scan_chunk_states)
from lin_attn_jax.ops.rwkv7 import context_parallel as split
from lin_attn_jax.ops.rwkv7.inputs import default_scale, validate

_F32 = jnp.float32


def _mm(subscripts, *operands):
  return jnp.einsum(subscripts, *operands, preferred_element_type=_F32)


@context_parallel.splits_sequence(lambda: split.context_parallel_rwkv7)
def chunk_rwkv7(r, w, k, v, a, b, *, scale=None, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                sub_chunk_size=8):
  """RWKV-7 (Goose), chunkwise; the training path.

  ``S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T`` (the
  transpose of RWKV-7's ``S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t
  k_t^T``), ``o_t = S_t^T (scale * r_t)``.

  Args:
    r, k: ``[B, T, H, K]`` receptance and key; v: ``[B, T, H, V]``.
    w: ``[B, T, H, K]`` natural-log decay ``<= 0``.
    a, b: ``[B, T, H, K]`` the rank-one term (RWKV-7 uses ``a = -kappa``,
      ``b = kappa * eta`` with a unit "removal key" kappa and in-context
      learning rate eta, which keeps the transition stable).
    scale: receptance scale, ``K ** -0.5`` when None (RWKV models use 1.0).
    initial_state: ``[B, H, K, V]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size, sub_chunk_size: tokens per chunk and per sub-chunk of the
      decay factors (speed only).
  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or
    None)``.

  Example:
    >>> r = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> w = jnp.full((1, 100, 2, 16), -0.1)
    >>> kappa = jnp.full((1, 100, 2, 16), 0.25)
    >>> o, _ = chunk_rwkv7(r, w, k, v, -kappa, 0.5 * kappa, scale=1.0)
    >>> o.shape
    (1, 100, 2, 32)
  """
  bs, t, h, dk, dv = validate(r, w, k, v, a, b, initial_state, segment_ids)
  check_chunk_sizes(chunk_size, sub_chunk_size)
  scale = default_scale(scale, dk)
  chunk, c = chunk_layout(t, chunk_size, sub_chunk_size)
  out_dtype = v.dtype
  r, w, k, v, a, b = (pad_time(jnp.asarray(x, _F32), chunk)
                      for x in (r, w, k, v, a, b))
  same_doc, reached, in_last_doc, passes = document_masks(segment_ids, bs, t,
                                                          chunk)

  def sub_chunks(x):                                            # [B,N,S,c,...]
    return split_chunks(split_chunks(x, chunk), c, axis=2)

  def head_major(x):                                            # [B,N,H,C,...]
    return jnp.moveaxis(split_chunks(x, chunk), 3, 2)

  r_s, w_s, k_s, a_s, b_s = (sub_chunks(x) for x in (scale * r, w, k, a, b))
  r_h, k_h, v_h, a_h, b_h = (head_major(x) for x in (scale * r, k, v, a, b))

  # Step 1: log-decays from the chunk start to i (and to i - 1), and from j
  # to the chunk end, [B, N, H, C, K].
  decays = sub_chunk_log_decays(w_s)
  before_sub = decays.before_sub[:, :, :, None]                 # [B,N,S,1,H,K]

  def merged(x):
    return jnp.moveaxis(merge_chunks(x, axis=2), 3, 2)

  from_start = merged(decays.local + before_sub)
  before = merged(exclusive_local(decays.local) + before_sub)
  to_end = merged(decays.to_sub_end + decays.after_sub[:, :, :, None])

  # Step 2: intra-chunk scores, [B, N, H, C, C] each.
  def scores(x, y, strict):
    return jnp.where(same_doc, intra_chunk_scores(x, y, decays,
                                                  strict=strict), 0.0)

  a_b, a_k = scores(a_s, b_s, True), scores(a_s, k_s, True)
  r_b, r_k = scores(r_s, b_s, False), scores(r_s, k_s, False)

  # Step 3: W and U from one triangular inverse per chunk.
  a_from_start = jnp.where(reached, a_h * jnp.exp(before), 0.0)  # [B,N,H,C,K]
  rhs = jnp.concatenate([a_from_start, _mm("bnhij,bnhjv->bnhiv", a_k, v_h)],
                        axis=-1)                                # [B,N,H,C,K+V]
  wu = _mm("bnhij,bnhjx->bnhix", invert_unit_lower(-a_b), rhs)
  w_, u = wu[..., :dk], wu[..., dk:]

  # Step 4: chunk transitions, then the state entering every chunk.
  decay_to_end = jnp.where(in_last_doc, jnp.exp(to_end), 0.0)   # [B,N,H,C,K]
  b_to_end, k_to_end = b_h * decay_to_end, k_h * decay_to_end
  decay = jnp.where(passes, jnp.exp(decays.chunk_total), 0.0)   # [B,N,H,K]
  transition = (decay[..., :, None] * jnp.eye(dk, dtype=_F32)
                + _mm("bnhjk,bnhjl->bnhkl", b_to_end, w_))      # [B,N,H,K,K]
  own = (_mm("bnhjk,bnhjv->bnhkv", b_to_end, u)
         + _mm("bnhjk,bnhjv->bnhkv", k_to_end, v_h))            # [B,N,H,K,V]
  state0 = (jnp.zeros((bs, h, dk, dv), _F32) if initial_state is None
            else jnp.asarray(initial_state, _F32))
  final_state, entering = scan_chunk_states(transition, own, state0)

  # Step 5: outputs.
  x = u + _mm("bnhik,bnhkv->bnhiv", w_, entering)               # [B,N,H,C,V]
  r_from_start = jnp.where(reached, r_h * jnp.exp(from_start), 0.0)
  o = (_mm("bnhij,bnhjv->bnihv", r_b, x)
       + _mm("bnhij,bnhjv->bnihv", r_k, v_h)
       + _mm("bnhik,bnhkv->bnihv", r_from_start, entering))     # [B,N,C,H,V]
  o = merge_chunks(o)[:, :t]
  return o.astype(out_dtype), (final_state if output_final_state else None)
