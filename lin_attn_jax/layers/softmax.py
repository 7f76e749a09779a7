"""Causal softmax attention layers: full, sliding window, Sparse Transformer.

All three share one layer: ``q = x W_q`` with ``H`` heads, ``k = x W_k`` and
``v = x W_v`` with ``Hkv`` heads (grouped-query attention, Ainslie et al.,
2023, arXiv:2305.13245; ``Hkv = H`` is plain multi-head attention), head
width ``D / H``, RoPE (Su et al., 2021, arXiv:2104.09864) on ``q`` and ``k``
at absolute positions, ``o = softmax(q k^T / sqrt(D / H) + mask) v`` and
``y = o W_o``. Projections have no bias and start LeCun normal (variance
``1 / fan_in``; the papers fix no initialisation). Only the mask differs:
causal (Vaswani et al., 2017), a sliding window (Beltagy et al., 2020), or a
Sparse Transformer pattern (Child et al., 2019).

The forms of every mode:

- no cache, ``"chunk"``: the blockwise online-softmax op (never ``[T, T]``);
- no cache, ``"parallel"``: the dense masked reference op;
- ``"recurrent"``: a ``lax.scan`` of one-token KV-cache steps over a fresh
  cache (or over the given one), the decoding path applied to every token;
- with a cache, ``T > 1`` in ``"chunk"`` or ``"parallel"``: the new tokens
  are appended with ``softmax_attn_extend`` (they see the cached entries and
  each other); ``T = 1``: one step.

The cache is a ``KVCache`` (keys after RoPE, values, and the position of
every entry) in the dtype given to ``init_cache``; it holds ``max_len``
entries, or ``window_size`` for the sliding window (a ring buffer). A full
cache does not store tokens past ``max_len`` under ``jit`` (outside ``jit``
the op raises), so build it for the whole length to be decoded.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer
from lin_attn_jax.ops import (chunk_softmax_attn, init_kv_cache,
                              parallel_softmax_attn, parallel_sparse_attn,
                              softmax_attn_extend, softmax_attn_step,
                              sparse_attn_reference)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.softmax_attn.inputs import check_window
from lin_attn_jax.ops.sparse_attn.patterns import check_pattern, pattern_mask


def head_layout(d_model: int, n_heads: int, n_kv_heads,
                head_dim: int | None = None) -> tuple[int, int]:
  """``(Hkv, head_dim)`` after checking that the widths divide; a given
  ``head_dim`` need not divide ``d_model`` (the heads' total width ``H
  head_dim`` is then not ``D``)."""
  n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
  for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
    checks.positive_int(name, value)
  if head_dim is not None:
    checks.positive_int("head_dim", head_dim)
  elif d_model % n_heads:
    raise ValueError(f"d_model = {d_model} must divide into n_heads = "
                     f"{n_heads}")
  if n_heads % n_kv_heads:
    raise ValueError(f"n_heads = {n_heads} must be a multiple of n_kv_heads "
                     f"= {n_kv_heads} (each key/value head serves a group of "
                     f"query heads)")
  return n_kv_heads, head_dim or d_model // n_heads


def cache_step(q, k, v, cache, reset, mask_fn=None):
  """One token into a ``KVCache``: ``q [B, H, K]``, ``k [B, Hkv, K]``, ``v
  [B, Hkv, V]`` -> ``(o [B, H, V], cache)``; ``mask_fn`` a pattern on
  absolute positions beyond causality and the window, or None."""
  if mask_fn is None:
    return softmax_attn_step(q, k, v, cache, reset=reset)
  o, cache = softmax_attn_extend(q[:, None], k[:, None], v[:, None], cache,
                                 reset=reset, mask_fn=mask_fn)
  return o[:, 0], cache


def scan_steps(step, tokens: dict, cache, segment_ids=None, restart=None):
  """A decoding step scanned over T tokens from ``cache``.

  Args:
    step: ``step(cache, reset [B], **token) -> (o [B, ...], cache)``.
    tokens: the step's per-token inputs by argument name, ``[B, T, ...]``
      arrays (``"q"`` among them) or None.
    segment_ids: ``[B, T]`` or None: a token resets where its document
      starts. restart: ``[B]`` bool or None, whether the first one does.
  Returns:
    ``(o [B, T, ...], cache)``.
  """
  b, t = tokens["q"].shape[:2]
  resets = reset_flags(segment_ids, b, t)                       # [B, T]
  if restart is not None:
    resets = resets.at[:, 0].set(restart)

  def one_token(cache, xs):
    token, reset_t = xs
    o, cache = step(cache, reset_t, **token)
    return cache, o

  token_major = {name: None if x is None else jnp.swapaxes(x, 0, 1)
                 for name, x in tokens.items()}
  cache, o = jax.lax.scan(one_token, cache, (token_major, resets.T))
  return jnp.swapaxes(o, 0, 1), cache                           # [B, T, ...]


def token_by_token(ctx: Context, q, k, v, cache, mask_fn=None):
  """``cache_step`` scanned over T; a token resets where its document
  starts. Returns ``(o [B, T, H, V], cache)``."""
  return scan_steps(
      lambda cache, reset, q, k, v: cache_step(q, k, v, cache, reset,
                                               mask_fn),
      dict(q=q, k=k, v=v), cache, ctx.segment_ids, ctx.restart)


def window_attend(q, k, v, ctx: Context, *, window_size: int | None,
                  block_size: int, causal: bool = True):
  """Softmax attention of a call without a cache, in a window of
  ``window_size`` tokens (None: no window; symmetric, ``|i - j| < w``, when
  not ``causal``): the blockwise form in chunk mode, the dense masked form
  in parallel mode. ``o [B, T, H, V]``."""
  if ctx.mode == "chunk":
    return chunk_softmax_attn(q, k, v, window_size=window_size,
                              segment_ids=ctx.segment_ids,
                              block_size=block_size, causal=causal)
  return parallel_softmax_attn(q, k, v, window_size=window_size,
                               segment_ids=ctx.segment_ids, causal=causal)


def attend_with_cache(ctx: Context, q, k, v, cache, *, attend: Callable,
                      empty_cache: Callable, mask_fn=None):
  """Softmax attention of ``ctx``'s mode, the KV-cache counterpart of
  ``Mixer.apply_forms`` (see the module docstring for the forms).

  Args:
    ctx: the mixer's ``Context``.
    q: ``[B, T, H, K]``; k: ``[B, T, Hkv, K]``; v: ``[B, T, Hkv, V]``.
    cache: the cached ``KVCache`` or None.
    attend: ``(q, k, v, ctx) -> o``, the chunk or parallel form of a call
      without a cache.
    empty_cache: ``() -> KVCache``, the buffer the recurrent mode scans
      over without a cache.
    mask_fn: a pattern on absolute positions beyond causality and the
      window, or None.

  Returns:
    ``(o [B, T, H, V], new cache or None)``.
  """
  if ctx.decoding:
    o, cache = cache_step(q[:, 0], k[:, 0], v[:, 0], cache, ctx.restart,
                          mask_fn)
    return o[:, None], cache
  if ctx.mode == "recurrent":
    o, scanned = token_by_token(ctx, q, k, v,
                                empty_cache() if cache is None else cache,
                                mask_fn)
    return o, None if cache is None else scanned
  if cache is not None:
    return softmax_attn_extend(q, k, v, cache, segment_ids=ctx.segment_ids,
                               reset=ctx.restart, mask_fn=mask_fn)
  return attend(q, k, v, ctx), None


# The kinds of ``qk_norm``: none, RMSNorm with scale ``w``, or with scale
# ``1 + w`` (``w`` starting at 0; Qwen3-Next's norms).
QK_NORMS = (None, "rms", "rms_zero_centered")


class CausalAttention(Mixer):
  """The shared layer; subclasses choose the mask (see the module docstring).

  Beyond the plain layer, options of the attention layers of hybrid models
  (all off by default): a per-head sigmoid output gate (Qwen3-Next), q/k
  RMSNorms per head (Qwen3-Next, LFM2), a multiplier on the keys
  (Falcon-H1's muP ``key_multiplier``), a head width of its own and biases
  on the q/k/v projections. With them the layer computes, per head,

      q, g = x W_q (the two halves of each head's 2 K columns with the gate)
      k = norm_k(x W_k) * key_multiplier,  q = norm_q(q),  v = x W_v
      o = softmax(rope(q) rope(k)^T / sqrt(K) + mask) v
      y = (o * sigmoid(g)) W_o

  Args:
    d_model: ``D``. n_heads: ``H``; the head width is ``K = D / H`` unless
      ``head_dim`` is given (even, for RoPE).
    n_kv_heads: ``Hkv``, key/value heads, a divisor of ``H``; None for
      ``H``.
    rope_base: base of the RoPE frequencies (10000).
    rope_fraction: RoPE rotates the first ``rope_fraction * K`` channels of
      every head and leaves the rest (1.0; RecurrentGemma 0.5, Qwen3-Next's
      ``partial_rotary_factor`` 0.25); 0 is no position encoding at all
      (Jamba's and Nemotron-H's attention, Granite 4.0-H's ``"nope"``).
    out_bias: the output projection has a bias (False; RecurrentGemma's
      has one).
    head_dim: ``K`` (None: ``D / H``); given, the heads' width ``H K`` need
      not be ``D`` (Qwen3-Next: 16 heads of 256 at ``D = 2048``).
    qkv_bias: the q, k and v projections have biases (False).
    output_gate: ``W_q`` also gives a gate ``g`` per query channel, and
      ``o * sigmoid(g)`` goes into ``W_o`` (False; Qwen3-Next True).
      ``W_q`` is then ``[D, H 2 K]``, each head's query columns followed by
      its gate columns, as transformers' ``Qwen3NextAttention.q_proj``.
    qk_norm: one of ``QK_NORMS``: RMSNorm of each head of ``q`` and ``k``
      over its ``K`` channels, one scale ``[K]`` for all heads, before RoPE
      (None; LFM2 ``"rms"``, Qwen3-Next ``"rms_zero_centered"``).
    qk_norm_eps: the q/k norms' epsilon (1e-6).
    key_multiplier: factor on ``k`` after its norm, before RoPE (1.0;
      Falcon-H1's ``key_multiplier``).
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  # w of a sliding window (the cache is then a ring buffer), None for none.
  window_size = None

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, rope_base: float = 10000.0,
               rope_fraction: float = 1.0, out_bias: bool = False,
               head_dim: int | None = None, qkv_bias: bool = False,
               output_gate: bool = False, qk_norm: str | None = None,
               qk_norm_eps: float = 1e-6, key_multiplier: float = 1.0,
               causal: bool = True,
               dtype=jnp.float32, param_dtype=jnp.float32):
    self.set_causal(causal)
    self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads, n_kv_heads,
                                                 head_dim)
    self.rope_dim = int(rope_fraction * self.head_dim)
    if (self.rope_dim % 2 or not 0 <= rope_fraction <= 1
        or self.rope_dim != rope_fraction * self.head_dim):
      raise ValueError(f"RoPE needs an even number of rotated channels, got "
                       f"rope_fraction * head width = {rope_fraction} * "
                       f"{self.head_dim}")
    if qk_norm not in QK_NORMS:
      raise ValueError(f"qk_norm must be one of {QK_NORMS}, got {qk_norm!r}")
    self.n_heads, self.rope_base = n_heads, rope_base
    self.output_gate, self.key_multiplier = output_gate, float(key_multiplier)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    q_dim, kv_dim = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
    self.q_proj = modules.dense(d_model, q_dim * (2 if output_gate else 1),
                                use_bias=qkv_bias, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"),
                                use_bias=out_bias, **kw)
    norm = dict(rngs=rngs, eps=qk_norm_eps, param_dtype=param_dtype,
                zero_centered=qk_norm == "rms_zero_centered")
    self.q_norm = (None if qk_norm is None
                   else modules.ChannelRMSNorm(self.head_dim, **norm))
    self.k_norm = (None if qk_norm is None
                   else modules.ChannelRMSNorm(self.head_dim, **norm))

  def rotate(self, x, positions):
    """RoPE on the first ``rope_dim`` channels of ``x: [B, T, H, K]``."""
    if self.rope_dim == 0:
      return x
    if self.rope_dim == self.head_dim:
      return modules.rotary(x, positions, self.rope_base)
    rotated = modules.rotary(x[..., :self.rope_dim], positions, self.rope_base)
    return jnp.concatenate([rotated, x[..., self.rope_dim:]], axis=-1)

  @property
  def mask_fn(self):
    """``(i, j) -> bool`` on absolute positions, a pattern beyond causality
    and the window (None for none)."""
    return None

  def attend(self, q, k, v, ctx: Context):
    """``o [B, T, H, V]`` of a call without a cache in chunk or parallel
    mode."""
    raise NotImplementedError

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return init_kv_cache(batch_size, self.n_kv_heads, self.head_dim,
                         self.head_dim, max_length=max_len,
                         window_size=self.window_size, dtype=dtype)

  def recurrent_state_floats(self, seq_len):
    """The keys and values of the KV cache, ``2 x T x Hkv x head_dim``
    (``min(w, T)`` entries under a window)."""
    entries = (seq_len if self.window_size is None
               else min(seq_len, self.window_size))
    return 2 * entries * self.n_kv_heads * self.head_dim

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    hd = self.head_dim
    q = self.q_proj(x)
    gate = None
    if self.output_gate:
      q, gate = jnp.split(q.reshape(b, t, self.n_heads, 2 * hd), 2,
                          axis=-1)                              # [B, T, H, K]
      gate = gate.reshape(b, t, self.n_heads * hd)              # [B, T, H K]
    q = q.reshape(b, t, self.n_heads, hd)                       # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, K]
    v = self.v_proj(x).reshape(b, t, self.n_kv_heads, hd)       # [B, T, Hkv, V]
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.key_multiplier != 1.0:
      k = k * self.key_multiplier
    q = self.rotate(q, ctx.positions)
    k = self.rotate(k, ctx.positions)
    # o = softmax(q k^T / sqrt(K) + mask) v
    o, cache = attend_with_cache(
        ctx, q, k, v, ctx.cache, attend=self.attend, mask_fn=self.mask_fn,
        empty_cache=lambda: self.init_mixer_cache(b, t, k.dtype))
    o = o.reshape(b, t, self.n_heads * hd)                      # [B, T, H V]
    if gate is not None:
      o = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(o.dtype)
    return self.o_proj(o), cache                                # [B, T, D]


class SoftmaxAttention(CausalAttention):
  """Causal multi-head softmax attention (Vaswani et al., 2017,
  arXiv:1706.03762) with RoPE and optional grouped key/value heads.

  Args:
    d_model, n_heads, n_kv_heads, rope_base, rope_fraction, out_bias,
      head_dim, qkv_bias, output_gate, qk_norm, qk_norm_eps, key_multiplier:
      as in ``CausalAttention``.
    block_size: query and key positions per block of the chunk form (speed
      only).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, rope_base: float = 10000.0,
               rope_fraction: float = 1.0, out_bias: bool = False,
               head_dim: int | None = None, qkv_bias: bool = False,
               output_gate: bool = False, qk_norm: str | None = None,
               qk_norm_eps: float = 1e-6, key_multiplier: float = 1.0,
               block_size: int = 128, causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    checks.positive_int("block_size", block_size)
    super().__init__(d_model, n_heads, rngs=rngs, n_kv_heads=n_kv_heads,
                     rope_base=rope_base, rope_fraction=rope_fraction,
                     out_bias=out_bias, head_dim=head_dim, qkv_bias=qkv_bias,
                     output_gate=output_gate, qk_norm=qk_norm,
                     qk_norm_eps=qk_norm_eps, key_multiplier=key_multiplier,
                     causal=causal, dtype=dtype, param_dtype=param_dtype)
    self.block_size = block_size

  def attend(self, q, k, v, ctx: Context):
    return window_attend(q, k, v, ctx, window_size=self.window_size,
                         block_size=self.block_size, causal=self.causal)


class GatedAttention(SoftmaxAttention):
  """Qwen3-Next's gated attention (transformers' ``Qwen3NextAttention``):
  ``SoftmaxAttention`` with its defaults set to Qwen3-Next's, a sigmoid
  output gate per query channel, zero-centred q/k RMSNorms (scale ``1 +
  w``, eps 1e-6) and RoPE on the first quarter of every head
  (``partial_rotary_factor`` 0.25), with grouped key/value heads.

  Parameters against transformers' (``H`` heads of ``K``, ``Hkv`` key/value
  heads; a kernel is the transpose of a ``Linear`` weight):

  - ``q_proj.kernel [D, 2 H K]``: ``q_proj.weight [2 H K, D]`` (per head
    ``K`` query rows, then ``K`` gate rows);
  - ``k_proj.kernel``, ``v_proj.kernel [D, Hkv K]``: ``k_proj.weight``,
    ``v_proj.weight [Hkv K, D]``; ``o_proj.kernel [H K, D]``:
    ``o_proj.weight [D, H K]`` (biases ``*.bias`` with
    ``attention_bias``: ``qkv_bias`` and ``out_bias``);
  - ``q_norm.scale``, ``k_norm.scale [K]``: ``q_norm.weight``,
    ``k_norm.weight [K]`` (both stored as ``w`` of ``1 + w``).

  The options are ``SoftmaxAttention``'s; the config maps as
  ``num_key_value_heads -> n_kv_heads``, ``head_dim``,
  ``partial_rotary_factor -> rope_fraction``, ``rope_theta -> rope_base``,
  ``rms_norm_eps -> qk_norm_eps``.
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, rope_base: float = 10000.0,
               rope_fraction: float = 0.25, out_bias: bool = False,
               head_dim: int | None = None, qkv_bias: bool = False,
               output_gate: bool = True,
               qk_norm: str | None = "rms_zero_centered",
               qk_norm_eps: float = 1e-6, key_multiplier: float = 1.0,
               block_size: int = 128, dtype=jnp.float32,
               param_dtype=jnp.float32):
    super().__init__(d_model, n_heads, rngs=rngs, n_kv_heads=n_kv_heads,
                     rope_base=rope_base, rope_fraction=rope_fraction,
                     out_bias=out_bias, head_dim=head_dim, qkv_bias=qkv_bias,
                     output_gate=output_gate, qk_norm=qk_norm,
                     qk_norm_eps=qk_norm_eps, key_multiplier=key_multiplier,
                     block_size=block_size, dtype=dtype,
                     param_dtype=param_dtype)


class SlidingWindowAttention(SoftmaxAttention):
  """Causal sliding-window softmax attention (Longformer's local attention,
  Beltagy et al., 2020, arXiv:2004.05150): each token sees itself and the
  ``window_size - 1`` tokens before it.

  The cache is a ring buffer of ``window_size`` entries whatever ``max_len``
  is, so a decoding step costs ``O(window_size)``. Longformer's global
  tokens are not offered: the ring buffer forgets a global key once it
  leaves the window, and a global query would need every earlier key, so
  decoding with them would need a full cache.

  Args:
    d_model, n_heads, n_kv_heads, rope_base, rope_fraction, out_bias,
      block_size: as in ``SoftmaxAttention``.
    window_size: ``w`` (512).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               window_size: int = 512, n_kv_heads: int | None = None,
               rope_base: float = 10000.0, rope_fraction: float = 1.0,
               out_bias: bool = False, block_size: int = 128,
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    if window_size is None:
      raise ValueError("window_size must be an integer >= 1, got None (use "
                       "softmax_attn for full attention)")
    check_window(window_size)
    super().__init__(d_model, n_heads, rngs=rngs, n_kv_heads=n_kv_heads,
                     rope_base=rope_base, rope_fraction=rope_fraction,
                     out_bias=out_bias, block_size=block_size, causal=causal,
                     dtype=dtype, param_dtype=param_dtype)
    self.window_size = int(window_size)


class SparseAttention(CausalAttention):
  """Sparse Transformer attention (Child et al., 2019, arXiv:1904.10509).

  Each query attends to the union of the pattern's two sets (the paper's
  merged head), causally: ``"strided"``, the previous ``stride`` positions
  and every ``stride``-th position before; ``"fixed"``, the query's own block
  of ``stride`` positions and the last ``summary_size`` positions of every
  earlier block. The pattern is laid on absolute positions of the packed
  stream (not restarted at document starts), and nothing crosses a
  document. RoPE replaces the paper's learned position embeddings (the LM
  has none). The cache is a full KV cache of ``max_len`` entries.

  Args:
    d_model, n_heads, n_kv_heads, rope_base: as in ``CausalAttention``.
    pattern: ``"strided"`` or ``"fixed"``.
    stride: ``l``, about ``sqrt(T)`` in the paper (128).
    summary_size: ``c`` of the fixed pattern, in ``[1, stride]`` (8; the
      paper uses 8 to 32 for ``l`` of 128 or 256).
    block_size: positions per block of the block-sparse chunk form (speed
      only).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               pattern: str = "strided", stride: int = 128,
               summary_size: int = 8, n_kv_heads: int | None = None,
               rope_base: float = 10000.0, block_size: int = 64,
               dtype=jnp.float32, param_dtype=jnp.float32):
    check_pattern(pattern, stride, summary_size)
    checks.positive_int("block_size", block_size)
    super().__init__(d_model, n_heads, rngs=rngs, n_kv_heads=n_kv_heads,
                     rope_base=rope_base, dtype=dtype, param_dtype=param_dtype)
    self.pattern, self.stride = pattern, stride
    self.summary_size, self.block_size = summary_size, block_size

  @property
  def mask_fn(self):
    return functools.partial(pattern_mask, pattern=self.pattern,
                             stride=self.stride,
                             summary_size=self.summary_size, causal=True)

  def attend(self, q, k, v, ctx: Context):
    kw = dict(pattern=self.pattern, stride=self.stride,
              summary_size=self.summary_size, segment_ids=ctx.segment_ids)
    if ctx.mode == "chunk":
      return parallel_sparse_attn(q, k, v, block_size=self.block_size, **kw)
    return sparse_attn_reference(q, k, v, **kw)
