"""The whole sequence as one chunk of the WY form (README.md).

    A[i, j] = beta_i k_i . (exp(G_i - G_j) * k_j)   j < i, same document
    P[i, j] = q_i . (exp(G_i - G_j) * k_j)          j <= i, same document
    (I + A) [W | U] = diag(beta) [exp(G) * K | V]   (W only for S_0)
    o = (exp(G) * Q) S_0 + P (U - W S_0)

``wy_sequence`` takes the erase keys ``e = beta * k`` (the rows of ``A``
and of the right-hand side) and the written values ``beta * v``, so Gated
DeltaNet-2 (``../gdn2/parallel.py``) runs it with its own. The
decay-weighted scores are ``common.chunk_scores.sequence_scores`` (the
chunk form's score stage over the whole sequence), so ``G_i - G_j`` is always
a sum of the gates between j and i. Memory and the triangular solve are
quadratic in T: this form is for checking and for short sequences.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common.chunk_scores import sequence_scores
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum, shift
from lin_attn_jax.ops.common.segments import document_index, same_document_mask
from lin_attn_jax.ops.delta_rule.chunk import solve_unit_lower
from lin_attn_jax.ops.delta_rule.inputs import (default_scale,
                                                expand_query_key, validate)

_F32 = jnp.float32


def parallel_delta_rule(q, k, v, beta, g=None, *, scale=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None, use_qk_l2norm=False):
  """Quadratic form. Shapes as in ``chunk_delta_rule``."""
  b, t, h, hv, dk, dv, g = validate(q, k, v, beta, g, initial_state,
                                    segment_ids)
  scale = default_scale(scale, dk)
  q, k = expand_query_key(q, k, hv, use_qk_l2norm)              # [B,T,HV,K]
  beta = jnp.asarray(beta, _F32)[..., None]                     # [B,T,HV,1]
  if g is None:
    g = jnp.zeros((b, t, hv, 1), _F32)
  o, final_state = wy_sequence(
      scale * q, k, beta * k, beta * jnp.asarray(v, _F32), g,
      segment_ids=segment_ids, initial_state=initial_state,
      output_final_state=output_final_state)
  return o.astype(v.dtype), final_state


def wy_sequence(q, k, erase, written, g, *, segment_ids, initial_state,
                output_final_state, read_before_decay=False):
  """The parallel form from the erase keys and written values.

  The update of token i is "decay, read the state along the erase key
  ``e_i``, write ``k_i (x_i - S'_i^T e_i)^T``" (the delta rule: ``e_i =
  beta_i k_i``, ``x_i = beta_i v_i``; Gated DeltaNet-2: ``b_i * k_i`` and
  ``w_i * v_i``); with ``read_before_decay`` the state is read before the
  token's decay (Comba, ``chunk.chunk_terms``).

  Args:
    q (scaled), k, erase: ``[B, T, HV, K]``; written: ``[B, T, HV, V]``;
      g: ``[B, T, HV, G]``; all float32.
    segment_ids: ``[B, T]`` or None; initial_state: ``[B, HV, K, V]`` or
      None for zeros.
  Returns:
    ``(o [B, T, HV, V] float32, final state [B, HV, K, V] float32 or
    None)``.
  """
  bs, t, _, dk = k.shape
  dv = written.shape[-1]
  doc = document_index(segment_ids, bs, t)                      # [B, T]
  mask = (jnp.tril(jnp.ones((t, t), dtype=bool))
          & same_document_mask(doc, doc)[:, None])              # [B, 1, T, T]
  strict = mask & ~jnp.eye(t, dtype=bool)
  scores = sequence_scores(q, k, g, mask)                       # [B, HV, T, T]
  a = sequence_scores(erase, k, g, strict,
                      strict=read_before_decay)                 # [B, HV, T, T]

  first_doc = (doc == 0)[:, :, None, None]                      # [B, T, 1, 1]
  from_start = jnp.exp(jnp.cumsum(g, axis=1))                   # [B, T, HV, G]
  rhs = [written]
  if initial_state is not None:
    s0 = jnp.asarray(initial_state, _F32)
    erase_decay = (jnp.exp(shift(jnp.cumsum(g, axis=1), 1, axis=1))
                   if read_before_decay else from_start)        # [B,T,HV,G]
    rhs.insert(0, jnp.where(first_doc, erase * erase_decay, 0.0))
  rhs = jnp.moveaxis(jnp.concatenate(rhs, axis=-1), 1, 2)       # [B,HV,T,*]
  wu = solve_unit_lower(a, rhs)
  u = wu[..., -dv:]                                             # [B, HV, T, V]
  if initial_state is not None:
    u = u - jnp.einsum("bhjk,bhkv->bhjv", wu[..., :dk], s0)
  o = jnp.einsum("bhij,bhjv->bihv", scores, u)                  # [B, T, HV, V]
  if initial_state is not None:
    q_from_start = jnp.where(first_doc, q * from_start, 0.0)
    o = o + jnp.einsum("bihk,bhkv->bihv", q_from_start, s0)

  final_state = None
  if output_final_state:
    last_doc = doc[:, -1:]                                      # [B, 1]
    to_end = reverse_exclusive_cumsum(g, axis=1)                # [B, T, HV, G]
    to_end = jnp.where((doc == last_doc)[:, :, None, None], to_end, -jnp.inf)
    final_state = jnp.einsum("bjhk,bhjv->bhkv", k * jnp.exp(to_end), u)
    if initial_state is not None:
      keep = (last_doc[:, 0] == 0)[:, None, None, None]
      total = jnp.exp(jnp.sum(g, axis=1))[..., None]            # [B, HV, G, 1]
      final_state = final_state + jnp.where(keep, total * s0, 0.0)
  return o, final_state
