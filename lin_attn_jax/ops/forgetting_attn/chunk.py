"""Blockwise forgetting attention (flash-attention style) in plain JAX.

The decay bias factors through the cumulative gate, ``D_ij = c_i - c_j``
(``gate_sums.gate_cumsum``): a value per query row and one per key column,
so the blockwise form is the softmax family's block-sparse online softmax
(``softmax_attn/blocksparse.py``) with that row and column bias added to
each ``[C, C]`` score block before the mask. Only the block pairs of the
causal pattern (and of the window) are computed; the backward pass
recomputes each block from the log-sum-exp and returns the bias gradients,
``d c_i = sum_j ds_ij - sum_r ds_ri``, which the cumulative sum carries back
to ``g``. Nothing ``[T, T]`` exists in either direction: memory is linear in
``T``. Derivation: ``README.md`` in this folder.

``block_size`` changes speed, never results beyond float tolerance.

``impl="pallas"`` runs the same computation on the Pallas kernels of
``pallas_kernels.forgetting_attn`` (flash attention with the bias ``c_i -
c_j``): the op computes ``c`` as above, restarting in every document, and
the kernels take it with q, k, v and the segment ids; ``d g`` follows from
their ``d c`` through the same cumulative sum.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common import (context_parallel, dispatch,
                                    kernel_sharding)
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.forgetting_attn import context_parallel as split
from lin_attn_jax.ops.forgetting_attn.gate_sums import gate_cumsum
from lin_attn_jax.ops.forgetting_attn.inputs import validate
from lin_attn_jax.ops.softmax_attn import masks
from lin_attn_jax.ops.softmax_attn.blocksparse import blocksparse_attention
from lin_attn_jax.ops.softmax_attn.chunk import (padded_positions,
                                                 sequence_block_pairs)
from lin_attn_jax.ops.softmax_attn.inputs import (check_block_size,
                                                  default_scale)
from pallas_kernels.forgetting_attn import forgetting_attention

# The widest head (the larger of K and V) on which ``impl="auto"`` runs the
# kernels: the widths whose tiles ``make compile-check`` compiles for every
# TPU and GPU target without a spill (pallas_kernels/README.md); wider heads
# run the XLA form unless ``impl="pallas"`` asks for the kernels.
AUTO_MAX_WIDTH = 128


def causal_rule(window_size):
  """The mask rule of the blockwise passes: causal, within the window."""
  return masks.WindowGlobalRule(causal=True, window_size=window_size,
                                global_flags=np.zeros((0,), bool))


@context_parallel.splits_sequence(
    lambda: split.context_parallel_forgetting_attn)
def chunk_forgetting_attn(q, k, v, g, *, scale=None, window_size=None,
                          segment_ids=None, block_size=128, impl="auto"):
  """Blockwise forgetting attention; never forms ``[T, T]``.

  Arguments and result as in ``parallel_forgetting_attn``, plus:
    block_size: ``C``, query and key positions per block of the XLA form
      (speed only); the kernels use their own tiles
      (``pallas_kernels.forgetting_attn.BlockSizes.default``).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"`` (see
      ``lin_attn_jax.ops.common.dispatch``): this blockwise form in XLA, or
      the Pallas kernels of ``pallas_kernels.forgetting_attn`` (interpret
      mode on CPU). ``"auto"`` runs what ``dispatch.AUTO_ON_TPU`` and
      ``AUTO_ON_CUDA`` say for ``"forgetting_attn"``, when ``K`` and
      ``V`` are at most ``AUTO_MAX_WIDTH``, and this form otherwise. Under a
      mesh set with ``jax.set_mesh`` the kernels run per shard of the batch
      and key/value heads (``lin_attn_jax.ops.common.kernel_sharding``).
      The kernels take ``scale`` as a Python float.

  Cost: ``N (N + 1) / 2`` block pairs for ``N = ceil(T / C)`` blocks, or
  ``N (ceil((w - 1) / C) + 1)`` with a window; memory ``O(T)`` forward and
  backward. The bias ``c_i - c_j`` is float32 and exact to about ``eps *
  |c_i|`` (``gate_sums.gate_cumsum``), for both implementations.

  Example:
    >>> q = jnp.ones((1, 300, 4, 8)); k = v = jnp.ones((1, 300, 2, 8))
    >>> g = jnp.full((1, 300, 4), -0.1)
    >>> chunk_forgetting_attn(q, k, v, g, block_size=32).shape
    (1, 300, 4, 8)
  """
  b, t, h, hkv, dk, dv = validate(q, k, v, g, segment_ids, window_size)
  check_block_size(block_size)
  dispatch.check_impl(impl)
  scale = default_scale(scale, dk)
  gates = gate_cumsum(g, segment_ids)                           # [B, T, H]
  xla = functools.partial(_blockwise, q, k, v, gates, scale=scale,
                          window_size=window_size, segment_ids=segment_ids,
                          block_size=block_size)

  def pallas():
    # Split over key/value heads: a shard of Hkv / n of them holds exactly
    # the query heads that read them, the H / n next to each other.
    return kernel_sharding.per_shard(
        functools.partial(forgetting_attention, scale=scale,
                          window_size=window_size),
        dict(q=q, k=k, v=v, c=gates, segment_ids=segment_ids),
        dict(q="bthk", k="bthk", v="bthv", c="bth", segment_ids="bt"),
        "bthv", batch=b, heads=hkv)

  if impl == "auto" and max(dk, dv) > AUTO_MAX_WIDTH:
    return xla()
  return dispatch.run(impl, xla, pallas, family="forgetting_attn")


def _blockwise(q, k, v, gates, *, scale, window_size, segment_ids,
               block_size):
  """The blockwise form in XLA, given the gate sums ``gates [B, T, H]``."""
  b, t = q.shape[:2]
  c = min(block_size, t)
  pos = padded_positions(np.arange(t), c)                       # [N*C]
  doc = (None if segment_ids is None
         else pad_time(document_index(segment_ids, b, t), c, mode="edge"))
  qp, kp, vp = (pad_time(jnp.asarray(x, jnp.float32), c) for x in (q, k, v))
  gates = pad_time(gates, c)                                    # [B, N*C, H]
  o, _ = blocksparse_attention(
      qp, kp, vp, doc, doc, q_pos=pos, k_pos=pos,
      pairs=sequence_block_pairs(t, c, np.zeros((0,), np.int64), causal=True,
                                 window_size=window_size),
      rule=causal_rule(window_size), block_size=c, scale=scale,
      q_bias=gates, k_bias=gates)
  return o[:, :t].astype(v.dtype)
