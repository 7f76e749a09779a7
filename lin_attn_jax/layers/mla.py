"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434, as in
DeepSeek-V3 and Kimi Linear).

Keys and values come from one low-rank latent per token, shared by all
heads; a few key channels carry the position and are shared too::

    c_t = norm(x_t W_dkv)                  latent, [r]
    k^R_t = rope(x_t W_kr)                 shared positional key, [d_R]
    q_h = x W_q (or norm(x W_dq) W_uq)     per head [d_N + d_R] = [q^N; q^R]
    k_h = [c W_uk_h ; k^R],  v_h = c W_uv_h
    o_h = softmax(q_h k_h^T * scale) v_h,  y = [o_1 .. o_H] W_o

(``W_dkv`` and ``W_kr`` are one projection, transformers'
``kv_a_proj_with_mqa``; ``W_uk``, ``W_uv`` are ``kv_b_proj``.) A call
without a cache expands the latent into per-head keys and values and runs
the softmax family's blockwise form (chunk mode, which splits the sequence
over a ``"sequence"`` mesh axis like ``softmax_attn``) or its dense form
(parallel mode).

Decoding caches only ``[c_t ; k^R_t]``, ``r + d_R`` floats per token
whatever the heads, and absorbs the up-projections: since ``q^N_h . (c_j
W_uk_h) = (q^N_h W_uk_h^T) . c_j`` and ``sum_j p_j c_j W_uv_h = (sum_j p_j
c_j) W_uv_h``, a cached call attends with the queries ``[q^N_h W_uk_h^T ;
q^R_h]`` (width ``r + d_R``) over the cached latents as one shared
key/value head (multi-query attention whose values are the first ``r``
channels of the keys, ``values_from_keys``), and maps the result through
``W_uv_h`` afterwards. Every call with a cache (prefill, one-token steps)
and the recurrent mode run this absorbed form; it equals the expanded one
up to float rounding (the tests check decoding against the full forward).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.layers.softmax import scan_steps
from lin_attn_jax.ops import (chunk_softmax_attn, init_kv_cache,
                              parallel_softmax_attn, softmax_attn_extend,
                              softmax_attn_step)
from lin_attn_jax.ops.common import checks


def _deinterleaved(x):
  """``x [..., d]`` with its channels reordered as ``(0, 2, 4, .., 1, 3,
  ..)``: DeepSeek's interleaved rotary pairs ``(2i, 2i + 1)`` laid out as
  RoPE's ``(i, i + d / 2)`` (transformers' ``rope_interleave``)."""
  return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


class MultiHeadLatentAttention(Mixer):
  """MLA (see the module docstring), transformers' ``DeepseekV3Attention``
  and ``KimiLinearAttention`` (Kimi Linear's MLA layers use no RoPE:
  ``use_rope=False``; its ``d_R`` channels stay in the keys, unrotated).

  Args:
    d_model: ``D``. n_heads: ``H``.
    q_lora_rank: rank of the low-rank query path ``norm(x W_dq) W_uq``;
      None for one projection ``x W_q`` (None, as Kimi Linear; DeepSeek-V3
      1536).
    kv_lora_rank: ``r``, the latent width (None: ``D / 4``; the references
      512).
    qk_nope_head_dim: ``d_N``, key/query channels without position per head
      (None: ``D / H``; the references 128).
    qk_rope_head_dim: ``d_R``, the shared positional channels (None: ``D /
      (2 H)``; the references 64); even when ``use_rope``.
    v_head_dim: value width per head (None: ``D / H``; the references 128).
    use_rope: RoPE on ``q^R`` and ``k^R`` (True; Kimi Linear False).
    rope_base: base of the RoPE frequencies (10000).
    rope_interleave: the checkpoint's rotary channels are interleaved pairs
      (transformers' ``rope_interleave``, DeepSeek-V3 True); they are
      de-interleaved before RoPE, which leaves every score unchanged.
    softmax_scale: the score scale (None: ``(d_N + d_R)^-1/2``; with YaRN,
      transformers multiplies it by ``mscale^2``: pass the product).
    attention_bias: ``W_dq``, ``W_dkv`` and ``W_o`` have biases (False, as
      the references' ``attention_bias``).
    norm_eps: epsilon of the latent RMSNorms (1e-6, the references' norms
      are built without the config's eps).
    block_size: positions per block of the blockwise form (speed only).

  Parameters against transformers' (a kernel is the transpose of a
  ``Linear`` weight; ``d_Q = d_N + d_R``):

  - ``q_proj.kernel [D, H d_Q]``: ``q_proj.weight [H d_Q, D]`` (per head
    ``d_N`` then ``d_R`` rows); with ``q_lora_rank``: ``q_a_proj.kernel
    [D, r_q]`` (``q_a_proj.weight``, ``.bias``), ``q_a_norm.scale [r_q]``
    (``q_a_layernorm.weight``), ``q_b_proj.kernel [r_q, H d_Q]``
    (``q_b_proj.weight``);
  - ``kv_a_proj.kernel [D, r + d_R]``: ``kv_a_proj_with_mqa.weight [r +
    d_R, D]`` (and ``.bias``); ``kv_a_norm.scale [r]``:
    ``kv_a_layernorm.weight``;
  - ``kv_b_proj.kernel [r, H (d_N + d_V)]``: ``kv_b_proj.weight [H (d_N +
    d_V), r]`` (per head ``d_N`` key rows then ``d_V`` value rows);
  - ``o_proj.kernel [H d_V, D]``: ``o_proj.weight`` (and ``.bias``).

  Cache: a ``KVCache`` of one key/value head whose keys are the latents
  ``[c ; k^R]`` (``[B, S, 1, r + d_R]``, in the dtype given to
  ``init_cache``) and whose values are zero-width (the first ``r`` key
  channels serve as values); ``state_size(T) = T (r + d_R)``.
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               q_lora_rank: int | None = None,
               kv_lora_rank: int | None = None,
               qk_nope_head_dim: int | None = None,
               qk_rope_head_dim: int | None = None,
               v_head_dim: int | None = None, use_rope: bool = True,
               rope_base: float = 10000.0, rope_interleave: bool = False,
               softmax_scale: float | None = None,
               attention_bias: bool = False, norm_eps: float = 1e-6,
               block_size: int = 128, dtype=jnp.float32,
               param_dtype=jnp.float32):
    checks.positive_int("d_model", d_model)
    checks.positive_int("n_heads", n_heads)
    checks.positive_int("block_size", block_size)
    base = max(d_model // n_heads, 2)
    dims = {"kv_lora_rank": kv_lora_rank or max(d_model // 4, 1),
            "qk_nope_head_dim": qk_nope_head_dim or base,
            "qk_rope_head_dim": qk_rope_head_dim or 2 * (base // 4) or 2,
            "v_head_dim": v_head_dim or base}
    for name, value in dims.items():
      checks.positive_int(name, value)
    if q_lora_rank is not None:
      checks.positive_int("q_lora_rank", q_lora_rank)
    if use_rope and dims["qk_rope_head_dim"] % 2:
      raise ValueError(f"RoPE needs an even qk_rope_head_dim, got "
                       f"{dims['qk_rope_head_dim']}")
    self.n_heads = n_heads
    self.kv_lora_rank = r = dims["kv_lora_rank"]
    self.nope_dim = dn = dims["qk_nope_head_dim"]
    self.rope_dim = dr = dims["qk_rope_head_dim"]
    self.v_head_dim = dv = dims["v_head_dim"]
    self.use_rope, self.rope_base = use_rope, rope_base
    self.rope_interleave = rope_interleave
    self.scale = (float(softmax_scale) if softmax_scale is not None
                  else (dn + dr) ** -0.5)
    self.block_size = block_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    norm = dict(rngs=rngs, eps=norm_eps, axis_name="rank",
                param_dtype=param_dtype)
    q_width = n_heads * (dn + dr)
    lora = q_lora_rank is not None
    self.q_proj = None if lora else modules.dense(d_model, q_width, **kw)
    self.q_a_proj = (modules.dense(d_model, q_lora_rank, ("embed", "rank"),
                                   use_bias=attention_bias, **kw)
                     if lora else None)
    self.q_a_norm = (modules.ChannelRMSNorm(q_lora_rank, **norm)
                     if lora else None)
    self.q_b_proj = (modules.dense(q_lora_rank, q_width, ("rank", "heads"),
                                   **kw) if lora else None)
    self.kv_a_proj = modules.dense(d_model, r + dr, ("embed", "rank"),
                                   use_bias=attention_bias, **kw)
    self.kv_a_norm = modules.ChannelRMSNorm(r, **norm)
    self.kv_b_proj = modules.dense(r, n_heads * (dn + dv), ("rank", "heads"),
                                   **kw)
    self.o_proj = modules.dense(n_heads * dv, d_model, ("heads", "embed"),
                                use_bias=attention_bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return init_kv_cache(batch_size, 1, self.kv_lora_rank + self.rope_dim, 0,
                         max_length=max_len, dtype=dtype)

  def recurrent_state_floats(self, seq_len):
    """The cached latents, ``T x (r + d_R)``."""
    return seq_len * (self.kv_lora_rank + self.rope_dim)

  def rotate(self, x, positions):
    """RoPE of the positional channels ``x [B, T, h, d_R]`` (none without
    ``use_rope``)."""
    if self.rope_interleave:
      x = _deinterleaved(x)
    if not self.use_rope:
      return x
    return modules.rotary(x, positions, self.rope_base)

  def up_kernels(self):
    """``(W_uk [r, H, d_N], W_uv [r, H, d_V])`` from ``kv_b_proj``."""
    w = self.kv_b_proj.kernel[...].reshape(self.kv_lora_rank, self.n_heads,
                                           self.nope_dim + self.v_head_dim)
    return w[..., :self.nope_dim], w[..., self.nope_dim:]

  def attend(self, q, k, v, ctx: Context):
    """``o [B, T, H, d_V]`` of a call without a cache: the blockwise form in
    chunk mode, the dense form in parallel mode."""
    if ctx.mode == "chunk":
      return chunk_softmax_attn(q, k, v, scale=self.scale,
                                segment_ids=ctx.segment_ids,
                                block_size=self.block_size)
    return parallel_softmax_attn(q, k, v, scale=self.scale,
                                 segment_ids=ctx.segment_ids)

  def attend_latent(self, q, latent, ctx: Context, cache):
    """The absorbed form: ``q [B, T, H, r + d_R]``, ``latent [B, T, 1, r +
    d_R]`` -> ``(o [B, T, H, r], cache)``, the softmax weights applied to
    the latents."""
    b, t = q.shape[:2]
    empty = latent[..., :0]                                     # [B, T, 1, 0]
    kw = dict(scale=self.scale, values_from_keys=self.kv_lora_rank)
    if ctx.decoding:
      o, cache = softmax_attn_step(q[:, 0], latent[:, 0], empty[:, 0], cache,
                                   reset=ctx.restart, **kw)
      return o[:, None], cache
    if ctx.mode == "recurrent":
      start = cache
      if cache is None:
        start = self.init_mixer_cache(b, t, latent.dtype)

      def step(cache, reset, q, k, v):
        return softmax_attn_step(q, k, v, cache, reset=reset, **kw)

      o, scanned = scan_steps(step, dict(q=q, k=latent, v=empty), start,
                              ctx.segment_ids, ctx.restart)
      return o, None if cache is None else scanned
    return softmax_attn_extend(q, latent, empty, cache,
                               segment_ids=ctx.segment_ids,
                               reset=ctx.restart, **kw)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, r, dn, dr = self.n_heads, self.kv_lora_rank, self.nope_dim, self.rope_dim
    if self.q_proj is not None:
      q = self.q_proj(x)
    else:
      q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
    q = q.reshape(b, t, h, dn + dr)                             # [B, T, H, dQ]
    q_nope, q_rope = q[..., :dn], q[..., dn:]
    c, k_rope = self.kv_a_proj.parts(x, [r])                    # [B, T, r|dR]
    c = self.kv_a_norm(c)
    q_rope = self.rotate(q_rope, ctx.positions)                 # [B, T, H, dR]
    k_rope = self.rotate(k_rope[:, :, None], ctx.positions)     # [B, T, 1, dR]
    w_uk, w_uv = self.up_kernels()                              # [r, H, dN|dV]
    cache = ctx.cache
    if cache is None and ctx.mode != "recurrent":
      kv = self.kv_b_proj(c).reshape(b, t, h, dn + self.v_head_dim)
      k = jnp.concatenate(
          [kv[..., :dn], jnp.broadcast_to(k_rope, (b, t, h, dr)).astype(
              kv.dtype)], axis=-1)                              # [B, T, H, dQ]
      o = self.attend(jnp.concatenate([q_nope, q_rope], axis=-1), k,
                      kv[..., dn:], ctx)                        # [B, T, H, dV]
    else:
      q_latent = jnp.einsum("bthn,rhn->bthr", q_nope,
                            w_uk.astype(q_nope.dtype))          # [B, T, H, r]
      latent = jnp.concatenate([c, k_rope[:, :, 0].astype(c.dtype)],
                               axis=-1)[:, :, None]             # [B, T, 1, r+dR]
      o_latent, cache = self.attend_latent(
          jnp.concatenate([q_latent, q_rope.astype(q_latent.dtype)], axis=-1),
          latent, ctx, cache)                                   # [B, T, H, r]
      o = jnp.einsum("bthr,rhv->bthv", o_latent,
                     w_uv.astype(o_latent.dtype))               # [B, T, H, dV]
    y = self.o_proj(o.reshape(b, t, h * self.v_head_dim))       # [B, T, D]
    return y, cache
