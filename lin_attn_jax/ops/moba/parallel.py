"""The definition: MoBA's selection as a ``[T, T]`` mask, then softmax.

For a query at position ``i`` with ``H`` heads (Lu et al., 2025, "MoBA:
Mixture of Block Attention for Long-Context LLMs", arXiv:2502.13189):

1. The keys of the query's document are cut into blocks of ``C =
   block_size`` from the document's first token (``blocks.py``).
2. Each block that ends before the query's own block starts (a past block;
   it holds ``C`` keys) gets the gate ``q_i . mean(k_block)`` (per query
   head, with the means of its key/value head; no scale, float32, no
   gradient).
3. The query keeps the ``top_k - 1`` past blocks of largest gate (all of
   them when it has fewer; of equal gates the earlier block first), and
   its own block, causally.
4. ``o_i = sum_j softmax_j(scale q_i . k_j) v_j`` over the keys of the kept
   blocks (float32).

``top_k = 1`` is plain causal attention over the document:
flash-linear-attention's ``parallel_moba`` short-circuits to it when
``top_k - 1`` leaves no block to select (its docstring: "with topk=1 the op
degenerates to full causal self-attention"), and this definition follows
it. Gradients flow through the attention of step 4, not through the
discrete selection of steps 2-3.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.moba import blocks
from lin_attn_jax.ops.moba.inputs import validate
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32


def moba_mask(q, k, *, q_pos, q_doc, q_start, k_doc, k_start,
              block_size: int, top_k: int):
  """Which keys each query head attends to.

  Key ``j`` sits at position ``j`` (the parallel form's sequence, or a
  full KV cache's slots).

  Args:
    q: ``[B, Tq, H, K]``; k: ``[B, S, Hkv, K]``.
    q_pos, q_doc, q_start: ``[B, Tq]`` int: each query's position,
      document id and block start.
    k_doc, k_start: ``[B, S]`` int: each key's document id (-1: no key)
      and block start.
    block_size, top_k: MoBA's ``C`` and ``k``.
  Returns:
    ``[B, H, Tq, S]`` bool (``[B, 1, Tq, S]`` for ``top_k = 1``).
  """
  b, tq, h, dk = q.shape
  s, hkv = k.shape[1], k.shape[2]
  j = jnp.arange(s, dtype=jnp.int32)
  same_doc = q_doc[:, :, None] == k_doc[:, None, :]             # [B, Tq, S]
  causal = j[None, None] <= q_pos[:, :, None]
  if top_k == 1:
    return (same_doc & causal)[:, None]
  own = same_doc & causal & (k_start[:, None, :] == q_start[:, :, None])
  # A past block is represented by its first key.
  first = (j[None] == k_start) & (k_doc >= 0)                   # [B, S]
  past = same_doc & first[:, None] & (j[None, None] < q_start[:, :, None])

  # The sum of each block's keys, stored at its first key.
  keys = jax.lax.stop_gradient(jnp.asarray(k, _F32))
  keys = jnp.where((k_doc >= 0)[..., None, None], keys, 0.0)
  rows = jnp.arange(b)[:, None]
  sums = jnp.zeros_like(keys).at[rows, jnp.maximum(k_start, 0)].add(keys)
  qg = jax.lax.stop_gradient(jnp.asarray(q, _F32)).reshape(
      b, tq, hkv, h // hkv, dk)                                 # [B,Tq,h,g,K]
  gate = jnp.einsum("bihgk,bjhk->bhgij", qg, sums / block_size,
                    preferred_element_type=_F32)                # [B,h,g,Tq,S]
  gate = jnp.where(past[:, None, None], gate, -jnp.inf)
  values, index = jax.lax.top_k(gate, min(top_k - 1, s))        # [...,Tq,k-1]
  chosen = jnp.put_along_axis(jnp.zeros(gate.shape, bool), index,
                              jnp.isfinite(values), axis=-1,
                              inplace=False)                    # [B,h,g,Tq,S]
  # Key j is selected when the block starting at k_start[j] is.
  where_block = jnp.broadcast_to(jnp.maximum(k_start, 0)[:, None, None, None],
                                 gate.shape)
  selected = (jnp.take_along_axis(chosen, where_block, axis=-1)
              & same_doc[:, None, None])
  return (own[:, None, None] | selected).reshape(b, h, tq, s)


def masked_attention(q, k, v, mask, scale):
  """``softmax(scale q k^T)`` under ``mask [B, H or 1, Tq, S]``, times v.

  q: ``[B, Tq, H, K]``; k: ``[B, S, Hkv, K]``; v: ``[B, S, Hkv, V]``; every
  row of the mask has a True entry. Returns ``o [B, Tq, H, V]`` float32.
  """
  b, tq, h, dk = q.shape
  s, hkv = k.shape[1], k.shape[2]
  g = h // hkv
  qg = jnp.asarray(q, _F32).reshape(b, tq, hkv, g, dk)          # [B,Tq,h,g,K]
  scores = scale * jnp.einsum("bihgk,bjhk->bhgij", qg, jnp.asarray(k, _F32),
                              preferred_element_type=_F32)      # [B,h,g,Tq,S]
  mask = jnp.broadcast_to(mask, (b, h, tq, s)).reshape(b, hkv, g, tq, s)
  p = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
  o = jnp.einsum("bhgij,bjhv->bihgv", p, jnp.asarray(v, _F32),
                 preferred_element_type=_F32)                   # [B,Tq,h,g,V]
  return o.reshape(b, tq, h, v.shape[-1])


def parallel_moba(q, k, v, *, block_size: int, top_k: int, scale=None,
                  segment_ids=None):
  """MoBA with ``[T, T]`` scores; the reference of every other form.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``, with
      ``H`` a multiple of ``Hkv``.
    block_size: ``C``, keys per MoBA block (a model hyperparameter).
    top_k: blocks each query attends to, its own included (``1``: causal
      attention, see the module docstring).
    scale: score scale, ``K ** -0.5`` when None (the gates are unscaled).
    segment_ids: ``[B, T]`` int; documents are cut into blocks from their
      own first token and nothing crosses a change of id.
  Returns:
    ``o [B, T, H, V]`` in v's dtype.

  Example:
    >>> q = jnp.ones((1, 10, 4, 8)); k = v = jnp.ones((1, 10, 2, 8))
    >>> parallel_moba(q, k, v, block_size=4, top_k=2).shape
    (1, 10, 4, 8)
  """
  b, t, _, _, dk, _ = validate(q, k, v, segment_ids, block_size, top_k)
  doc = blocks.documents(segment_ids, b, t)
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  start = blocks.block_starts(pos, blocks.document_starts(doc), block_size)
  mask = moba_mask(q, k, q_pos=pos, q_doc=doc, q_start=start, k_doc=doc,
                   k_start=start, block_size=block_size, top_k=top_k)
  o = masked_attention(q, k, v, mask, default_scale(scale, dk))
  return o.astype(v.dtype)
