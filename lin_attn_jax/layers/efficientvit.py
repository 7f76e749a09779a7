"""EfficientViT's multi-scale linear attention (Cai et al. 2023,
arXiv:2205.14756), the reference's ``LiteMLA``, on sequences.

``qkv = x W_qkv`` (``H`` heads of q, k and v). Each scale ``s`` adds
multi-scale tokens: a depthwise convolution of width ``s`` of ``qkv``, then
a grouped pointwise projection, one ``[K, K]`` matrix per head and per q, k
and v (the reference's ``groups=3 H``). The ``H (1 + len(scales))`` heads
then run ReLU linear attention (``ops.chunk_relu_linear_attn``, ``eps =
1e-15``, float32), and ``y = concat(heads) W_o``. The reference's
convolutions are 2-D over an image (``s x s``); on 1-D sequences they are
1-D ``same`` convolutions of width ``s`` that read only the token's
document. The reference's batch norm after ``W_o`` is left out (the
blocks' norms stand in for it).

Not causal: no cache, no recurrent mode. Packed documents are bounded by
``segment_ids`` in the convolutions and the attention, and the chunk mode
splits a sequence over a ``"sequence"`` mesh axis.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, resolved_chunk_size
from lin_attn_jax.layers.encoder_modules import checks_width, conv_weight
from lin_attn_jax.layers.softmax import head_layout
from lin_attn_jax.ops import chunk_relu_linear_attn, relu_linear_attn_reference
from lin_attn_jax.ops.common.pooling import same_depthwise_conv
from lin_attn_jax.ops.relu_linear_attn.inputs import RELU_EPS


class EfficientViTAttention(Mixer):
  """ReLU linear attention over single- and multi-scale tokens.

  Args:
    d_model: ``D``. n_heads: ``H`` (the reference takes the head width,
      8; here ``K = D / H``).
    scales: the widths of the multi-scale convolutions (odd; the
      reference's ``(5,)``), ``()`` for ReLU linear attention alone.
    eps: added to the denominator (1e-15, the reference's).
    chunk_size: tokens per chunk of the chunk mode (speed only).
  """

  causal = False

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               scales: Sequence[int] = (5,), eps: float = RELU_EPS,
               chunk_size: int | None = None, dtype=jnp.float32,
               param_dtype=jnp.float32):
    _, self.head_dim = head_layout(d_model, n_heads, None)
    for s in scales:
      checks_width(s)
    self.n_heads, self.scales, self.eps = n_heads, tuple(scales), eps
    self.chunk_size, self.dtype = chunk_size, dtype
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = modules.dense(d_model, 3 * d_model, **kw)
    self.o_proj = modules.dense(d_model * (1 + len(self.scales)), d_model,
                                ("heads", "embed"), **kw)
    hd = self.head_dim
    self.conv_weights = nnx.List(
        [conv_weight(rngs, 3 * d_model, s, param_dtype) for s in scales])
    # The grouped pointwise convolution: PyTorch's default init, fan-in K.
    bound = hd ** -0.5
    self.group_weights = nnx.List(
        [modules.param(rngs, modules.uniform_init(-bound, bound),
                       (3, n_heads, hd, hd), (None, "heads", None, None),
                       param_dtype) for _ in scales])

  def init_mixer_cache(self, batch_size, max_len, dtype):
    raise ValueError("EfficientViTAttention is not causal: it has no cache")

  def mix(self, x, ctx: Context):
    b, t, d = x.shape
    h, hd = self.n_heads, self.head_dim
    qkv = self.qkv_proj(x)                                      # [B, T, 3 D]
    tokens = [qkv.reshape(b, t, 3, h, hd)]
    for conv, group in zip(self.conv_weights, self.group_weights):
      local = same_depthwise_conv(qkv, conv[...],
                                  segment_ids=ctx.segment_ids)  # [B, T, 3 D]
      tokens.append(jnp.einsum(
          "btchk,chkj->btchj", local.reshape(b, t, 3, h, hd),
          jnp.asarray(group[...], jnp.float32)).astype(qkv.dtype))
    qkv = jnp.concatenate(tokens, axis=3)                       # [B,T,3,H',K]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]          # [B,T,H',K]
    if ctx.mode == "parallel":
      o = relu_linear_attn_reference(q, k, v, eps=self.eps,
                                     segment_ids=ctx.segment_ids)
    else:
      o = chunk_relu_linear_attn(
          q, k, v, eps=self.eps, segment_ids=ctx.segment_ids,
          chunk_size=resolved_chunk_size(self.chunk_size))      # [B,T,H',V]
    return self.o_proj(o.reshape(b, t, -1)), None
