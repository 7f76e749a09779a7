"""Linformer layer (Wang et al., 2020, arXiv:2006.04768).

``q, k, v = x W_q, x W_k, x W_v`` with ``H`` heads of width ``D / H``; the
keys and values are projected along time by learned ``E, F: [P, max_len]``,
``K' = E K``, ``V' = F V``, and ``y = softmax(q K'^T / sqrt(D / H)) V' W_o``,
``O(T P)`` instead of ``O(T^2)``.

Every projected key mixes all ``T`` positions, so the layer is not causal: it
has no cache, no recurrent mode and no decoding (an encoder layer; inside the
decoder LM each token sees the whole sequence).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.softmax import head_layout
from lin_attn_jax.ops import linformer_attn
from lin_attn_jax.ops.common import checks


class Linformer(Mixer):
  """Softmax attention over keys and values projected to ``P`` positions.

  ``E`` and ``F`` are shared by all heads (the paper's headwise sharing);
  ``share_kv=True`` also uses ``E`` for the values (key-value sharing). They
  start with i.i.d. ``N(0, 1 / P)`` entries, the random projection of the
  paper's Theorem 2; the other projections have no bias and start LeCun
  normal. A sequence of ``T < max_len`` tokens uses the first ``T`` columns
  of ``E`` and ``F``, which is the same as padding it with zero keys and
  values to ``max_len``; ``T > max_len`` raises ``ValueError``. No position
  embedding is added: the columns of ``E`` and ``F`` depend on position.

  Packed documents (``segment_ids``) are refused with ``ValueError``: a
  projected key sums over every position of the row, so documents packed in
  one row would see each other.

  Args:
    d_model: ``D``. n_heads: ``H``.
    max_len: the longest sequence, the width of ``E`` and ``F`` (512, the
      paper's pretraining length).
    projected_length: ``P``, the projected length (256; the paper tries 64
      to 256 for ``n = 512``).
    share_kv: use one projection for keys and values.
  """

  causal = False
  segments = False

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               max_len: int = 512, projected_length: int = 256,
               share_kv: bool = False, dtype=jnp.float32,
               param_dtype=jnp.float32):
    _, self.head_dim = head_layout(d_model, n_heads, None)
    checks.positive_int("max_len", max_len)
    checks.positive_int("projected_length", projected_length)
    self.n_heads, self.max_len, self.dtype = n_heads, max_len, dtype
    self.share_kv = share_kv
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.o_proj = modules.dense(d_model, d_model, ("heads", "embed"), **kw)
    init = nnx.initializers.normal(stddev=projected_length ** -0.5)
    shape = (projected_length, max_len)
    self.e = modules.param(rngs, init, shape, ("rank", None), param_dtype)
    self.f = (None if share_kv else
              modules.param(rngs, init, shape, ("rank", None), param_dtype))

  def init_mixer_cache(self, batch_size, max_len, dtype):
    raise ValueError("Linformer is not causal: it has no cache")

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    if ctx.segment_ids is not None:
      raise ValueError(
          "Linformer does not take segment_ids: each projected key and value "
          "sums over all positions of a row, so packed documents would see "
          "each other; give one document per row")
    if t > self.max_len:
      raise ValueError(f"Linformer was built for max_len = {self.max_len} "
                       f"tokens, got a sequence of T = {t}")
    h, hd = self.n_heads, self.head_dim
    q = self.q_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    v = self.v_proj(x).reshape(b, t, h, hd)                     # [B, T, H, V]
    e = self.e[:, :t].astype(self.dtype)                        # [P, T]
    f = e if self.f is None else self.f[:, :t].astype(self.dtype)
    o = linformer_attn(q, k, v, e, f)                           # [B, T, H, V]
    return self.o_proj(o.reshape(b, t, h * hd)), None
