"""The definition of native sparse attention, with dense ``[T, T]`` masks.

Native sparse attention (Yuan et al., 2025, arXiv:2502.11089), as
flash-linear-attention defines it (``fla.ops.nsa.naive``): blocks of
``l = block_size`` tokens (compression block, stride and selection block
all ``l``), laid on positions within each document (``blocks.py``). For a
query at position ``i`` of block ``c_i``:

1. compressed: attention over the means of the complete blocks that end at
   or before ``i`` (a block's mean stands at its last token); none yet
   gives zero;
2. selected: the key/value heads rank their candidate blocks, those of the
   query's document that start at or before ``i``: the first block, the
   previous and the current one are forced (ranked first), every other by
   the compressed branch's attention probabilities summed over the query
   heads of the group; ties go to the earlier block. Each query attends
   causally to the tokens of the top ``block_counts`` blocks of its
   key/value head;
3. window: causal attention to itself and the ``window_size - 1`` tokens
   before it (``softmax_attn``), when ``window_size`` is given;

``o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa``. The selection is a
discrete choice: gradients reach every input through the three attentions
and the gates, none through which blocks were chosen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.nsa import blocks
from lin_attn_jax.ops.nsa.inputs import validate
from lin_attn_jax.ops.softmax_attn.inputs import default_scale
from lin_attn_jax.ops.softmax_attn.parallel import parallel_softmax_attn

_F32 = jnp.float32


def _attend(qg, k, v, mask):
  """``qg [B, T, Hkv, G, K]`` (scaled) against ``k [B, T, Hkv, K]`` under
  ``mask`` broadcastable to ``[B, Hkv, G, T, T]``: ``(o [B, T, Hkv, G, V],
  p [B, Hkv, G, T, T])``."""
  s = jnp.einsum("bihgk,bjhk->bhgij", qg, k,
                 preferred_element_type=_F32)              # [B, Hkv, G, T, T]
  p = blocks.masked_softmax(s, mask)
  o = jnp.einsum("bhgij,bjhv->bihgv", p, v,
                 preferred_element_type=_F32)              # [B, T, Hkv, G, V]
  return o, p


def parallel_nsa(q, k, v, g_cmp, g_slc, g_swa=None, *, block_size=64,
                 block_counts=16, window_size=None, scale=None,
                 segment_ids=None):
  """Native sparse attention with ``[T, T]`` masks; the reference.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``,
      ``H`` a multiple of ``Hkv``.
    g_cmp, g_slc, g_swa: ``[B, T, H]`` weights of the compressed, selected
      and window branches (a layer passes sigmoids); ``g_swa`` only with a
      window.
    block_size: ``l``, tokens per block of the compression and of the
      selection.
    block_counts: ``n``, blocks selected per query and key/value head (the
      forced ones included).
    window_size: ``w`` of the window branch, None for no window branch.
    scale: score scale of all three branches, ``K ** -0.5`` when None.
    segment_ids: ``[B, T]`` int; blocks restart at every document, and no
      branch attends across a change of id.
  Returns:
    ``o [B, T, H, V]`` in v's dtype; float32 inside.

  Example:
    >>> q = jnp.ones((1, 10, 4, 8)); k = v = jnp.ones((1, 10, 2, 8))
    >>> g = jnp.full((1, 10, 4), 0.5)
    >>> parallel_nsa(q, k, v, g, g, g, block_size=4, block_counts=2,
    ...              window_size=3).shape
    (1, 10, 4, 8)
  """
  gates = (g_cmp, g_slc, g_swa)
  b, t, h, hkv, dk, _ = validate(q, k, v, gates, segment_ids,
                                 block_size=block_size,
                                 block_counts=block_counts,
                                 window_size=window_size)
  scale = default_scale(scale, dk)
  l = block_size
  q32, k32, v32 = (jnp.asarray(x, _F32) for x in (q, k, v))
  qg = scale * q32.reshape(b, t, hkv, h // hkv, dk)       # [B, T, Hkv, G, K]

  pos = jnp.arange(t, dtype=jnp.int32)
  doc = document_index(segment_ids, b, t)                   # [B, T]
  within = pos - blocks.document_start(segment_ids, b, t)   # [B, T]
  block = within // l                                       # [B, T]
  same_doc = doc[:, :, None] == doc[:, None, :]             # [B, T, T]
  causal = pos[:, None] >= pos[None, :]                     # [T, T]

  # Compressed: the mean of a complete block stands at its last token.
  same_block = (same_doc & (block[:, :, None] == block[:, None, :])).astype(
      _F32)                                                 # [B, T, T]
  k_mean, v_mean = (jnp.einsum("bij,bjhd->bihd", same_block, x,
                               preferred_element_type=_F32) / l
                    for x in (k32, v32))                    # [B, T, Hkv, *]
  is_end = within % l == l - 1                              # [B, T]
  visible = same_doc & causal & is_end[:, None, :]          # [B, T, T]
  o_cmp, p_cmp = _attend(qg, k_mean, v_mean, visible[:, None, None])

  # Selection: candidates are the block starts of the query's document at
  # or before it; a block's score is its probability at its last token.
  importance = jnp.sum(jax.lax.stop_gradient(p_cmp), axis=2)  # [B, Hkv, T, T]
  shift = min(l - 1, t)
  at_start = jnp.pad(importance[..., shift:],
                     [(0, 0)] * 3 + [(0, shift)])           # [B, Hkv, T, T]
  candidate = same_doc & causal & (within % l == 0)[:, None, :]
  blk_q, blk_k = block[:, :, None], block[:, None, :]
  forced = candidate & ((blk_k == 0) | (blk_k == blk_q) | (blk_k == blk_q - 1))
  rank_key = jnp.where(forced[:, None], jnp.inf,
                       jnp.where(candidate[:, None], at_start, -jnp.inf))
  top_key, top = jax.lax.top_k(rank_key, min(block_counts, t))  # [.., T, n]
  chosen = (top[..., None] == pos) & (top_key > -jnp.inf)[..., None]
  selected_start = jnp.any(chosen, axis=-2)                 # [B, Hkv, T, T]
  # Token j is selected with the block that starts at j - within_j % l.
  own_start = (pos - within % l)[:, None, None, :]          # [B, 1, 1, T]
  selected = jnp.take_along_axis(
      selected_start, jnp.broadcast_to(own_start, selected_start.shape),
      axis=-1) & (same_doc & causal)[:, None]               # [B, Hkv, T, T]
  o_slc, _ = _attend(qg, k32, v32, selected[:, :, None])

  o_swa = None
  if window_size is not None:
    o_swa = parallel_softmax_attn(q32, k32, v32, scale=scale,
                                  window_size=window_size,
                                  segment_ids=segment_ids)
  branches = (o_cmp.reshape(b, t, h, -1), o_slc.reshape(b, t, h, -1), o_swa)
  return blocks.mix(branches, gates, v.dtype)
