"""RWKV time mixing: RWKV-6 (Finch) and RWKV-7 (Goose).

Both read the previous token through a token shift (``modules.token_shift``,
zero at the start of every document) and interpolate between it and the
current token with learned per-channel weights before every projection. An
RWKV block also has a channel-mixing half; here the LM's SwiGLU MLP takes
that place, so these mixers are the time-mixing halves only.

The per-channel inits of the interpolation weights, decays, bonuses and
low-rank projections follow the reference implementation released with the
papers (https://github.com/BlinkDL/RWKV-LM), which grades them by depth
through ``layer_index`` and ``n_layers`` (the defaults describe a first
layer; an ``LM`` passes the same options to every layer). The cache is the
last token (``[B, D]`` float32, for the shift) and the ``[B, H, K, V]``
float32 state.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.feature_maps import orthonormal_columns
from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, zero_state
from lin_attn_jax.ops import (chunk_rwkv6, chunk_rwkv7, parallel_rwkv6,
                              parallel_rwkv7, recurrent_rwkv6, recurrent_rwkv7,
                              rwkv6_step, rwkv7_step)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.delta_rule import l2_normalize
from lin_attn_jax.ops.rwkv6.inputs import bonus as current_token_term

_F32 = jnp.float32
# RWKV-7's log-decay ``-exp(-softplus(-w) - 0.5)`` lies above this bound.
RWKV7_MIN_LOG_DECAY = -math.exp(-0.5)


def depth_ratios(layer_index: int, n_layers: int):
  """``(layer_index / (n_layers - 1), 1 - layer_index / n_layers)``.

  The first grows from 0 (first layer) to 1 (last layer), the second falls
  from 1 to ``1 / n_layers``; a single layer gets ``(0, 1)``.
  """
  if not (isinstance(layer_index, int) and isinstance(n_layers, int)
          and 0 <= layer_index < n_layers):
    raise ValueError(f"need 0 <= layer_index < n_layers, got layer_index = "
                     f"{layer_index!r}, n_layers = {n_layers!r}")
  rising = layer_index / (n_layers - 1) if n_layers > 1 else 0.0
  return rising, 1.0 - layer_index / n_layers


def check_heads(d_model: int, n_heads: int):
  if d_model % n_heads:
    raise ValueError(f"d_model = {d_model} must divide into n_heads = "
                     f"{n_heads} heads of equal size")
  return d_model // n_heads


def check_positive(name: str, value):
  return checks.positive_int(name, value)


RWKV6_FORMS = OpForms(chunk_rwkv6, parallel_rwkv6, recurrent_rwkv6,
                      rwkv6_step)
# The decays' bound lets the chunk form build its scores in one matmul.
RWKV7_FORMS = OpForms(
    functools.partial(chunk_rwkv7, min_log_decay=RWKV7_MIN_LOG_DECAY),
    parallel_rwkv7, recurrent_rwkv7, rwkv7_step)


class RWKV6(Mixer):
  """RWKV-6 "Finch" time mixing (Peng et al. 2024,
  https://arxiv.org/abs/2404.05892).

  With ``x'`` the previous token (token shift) and ``d = x' - x``:

  - data-dependent interpolation (ddlerp): ``x_c = x + d * (mu_c +
    lora_c(x + d * mu_x))`` for ``c`` in ``w, k, v, r, g``, the five LoRAs
    ``tanh(. A) B_c`` sharing ``A`` (``mu_x`` is ``lerp_base``, the other
    ``mu`` are ``lerp_weights``, ``A, B`` are ``lerp_down, lerp_up``);
  - ``r, k, v = x_r W_r, x_k W_k, x_v W_v``, ``g = silu(x_g W_g)``;
  - a decay per channel ``exp(-exp(w))`` with ``w = w_0 + tanh(x_w A_w)
    B_w`` (``decay_base, decay_down, decay_up``), and a bonus ``u`` per
    channel for the current token (``bonus``);
  - the RWKV-6 op (``scale = 1``), a per-head GroupNorm with bias, and
    ``W_o (group_norm(o) * g)``.

  Inits (reference implementation of the first Finch release): ``mu`` from
  the channel index and depth, LoRA matrices uniform in ``+-1e-4``,
  ``w_0`` from -6 to -1 over the channels (decays from 0.9975 down to 0.69),
  ``u`` a depth-graded ramp with a +-0.1 zigzag. The dense projections use
  the package's LeCun normal init (the reference trainer zeroes ``W_r, W_k,
  W_o``, which leaves every parameter of the block without a gradient at
  the first step).

  Args:
    d_model: ``D``. n_heads: ``H``.
    expand_k, expand_v: the receptance/key/decay width is ``expand_k * D``
      and the value/gate width ``expand_v * D``, split over the heads (1.0
      each; flash-linear-attention's RWKV-6 uses ``expand_k = 0.5``).
    mix_low_rank_dim: rank of the ddlerp LoRAs (32).
    decay_low_rank_dim: rank of the decay LoRA (64).
    layer_index, n_layers: depth of this layer, for the inits.
    norm_eps: epsilon of the GroupNorm (64e-5, the reference's ``1e-5 *
      head_size_divisor ** 2``).
    chunk_size: chunk length of the chunk form (speed only); None: 16
      on CPU, 64 on TPU/GPU (``base.resolved_chunk_size``).
  """

  no_weight_decay = ("lerp_base", "lerp_weights", "decay_base", "bonus")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               expand_k: float = 1.0, expand_v: float = 1.0,
               mix_low_rank_dim: int = 32, decay_low_rank_dim: int = 64,
               layer_index: int = 0, n_layers: int = 1,
               norm_eps: float = 64e-5, chunk_size: int | None = None,
               dtype=_F32, param_dtype=_F32):
    key_dim, value_dim = d_model * expand_k, d_model * expand_v
    if key_dim != int(key_dim) or value_dim != int(value_dim):
      raise ValueError(f"expand_k * d_model = {key_dim} and expand_v * "
                       f"d_model = {value_dim} must be integers")
    key_dim, value_dim = int(key_dim), int(value_dim)
    self.head_k = check_heads(key_dim, n_heads)
    self.head_v = check_heads(value_dim, n_heads)
    check_positive("mix_low_rank_dim", mix_low_rank_dim)
    check_positive("decay_low_rank_dim", decay_low_rank_dim)
    rising, falling = depth_ratios(layer_index, n_layers)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    d = d_model
    fraction = np.arange(d) / d

    def p(init, shape, axes):
      return modules.param(rngs, init, shape, axes, param_dtype)

    tiny = modules.uniform_init(-1e-4, 1e-4)
    self.lerp_base = p(modules.constant_init(1 - fraction ** falling), (d,),
                       ("embed",))
    lerp = np.stack([1 - fraction ** falling,                   # w
                     1 - fraction ** falling,                   # k
                     1 - (fraction ** falling + 0.3 * rising),  # v
                     1 - fraction ** (0.5 * falling),           # r
                     1 - fraction ** (0.5 * falling)])          # g
    self.lerp_weights = p(modules.constant_init(lerp), (5, d),
                          (None, "embed"))
    self.lerp_down = p(tiny, (d, 5 * mix_low_rank_dim), ("embed", "rank"))
    self.lerp_up = p(tiny, (5, mix_low_rank_dim, d), (None, "rank", "embed"))
    key_channel = np.arange(key_dim) / max(key_dim - 1, 1)
    self.decay_base = p(modules.constant_init(
        -6 + 5 * key_channel ** (0.7 + 1.3 * rising)), (key_dim,),
                        ("heads",))
    self.decay_down = p(tiny, (d, decay_low_rank_dim), ("embed", "rank"))
    self.decay_up = p(tiny, (decay_low_rank_dim, key_dim), ("rank", "heads"))
    zigzag = ((np.arange(key_dim) + 1) % 3 - 1) * 0.1
    bonus = (rising * (1 - key_channel) + zigzag).reshape(n_heads,
                                                          self.head_k)
    self.bonus = p(modules.constant_init(bonus), (n_heads, self.head_k),
                   ("heads", None))
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.r_proj = modules.dense(d, key_dim, **kw)
    self.k_proj = modules.dense(d, key_dim, **kw)
    self.v_proj = modules.dense(d, value_dim, **kw)
    self.g_proj = modules.dense(d, value_dim, **kw)
    self.norm = modules.HeadNorm(n_heads, self.head_v, rngs=rngs,
                                 kind="layer", eps=norm_eps,
                                 param_dtype=param_dtype)
    self.norm_bias = p(nnx.initializers.zeros_init(), (value_dim,),
                       ("heads",))
    self.o_proj = modules.dense(value_dim, d, ("heads", "embed"), **kw)
    self.d_model = d

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return {"shift": jnp.zeros((batch_size, self.d_model), _F32),
            "state": zero_state(batch_size, self.n_heads, self.head_k,
                                self.head_v)}

  def recurrent_state_floats(self, seq_len):
    """``H x K x V`` (``K = expand_k D / H``, ``V = expand_v D / H``)."""
    del seq_len
    return self.n_heads * self.head_k * self.head_v

  def conv_state_floats(self):
    """The token shift's previous token, ``D``."""
    return self.d_model

  def log_decay(self, xw):
    """``-exp(w_0 + tanh(x_w A_w) B_w)``: ``[B, T, H * K]`` float32, < 0."""
    lora = modules.lora(xw, self.decay_down, self.decay_up, jnp.tanh,
                        dtype=_F32)                             # [B, T, H K]
    return -jnp.exp(self.decay_base[...].astype(_F32) + lora)

  def mix(self, x, ctx: Context):
    b, t, d = x.shape
    h, n, nv = self.n_heads, self.head_k, self.head_v
    cache = {} if ctx.cache is None else ctx.cache
    shifted, last = modules.token_shift(x, ctx, cache.get("shift"))
    delta = shifted - x                                         # [B, T, D]
    base = x + delta * self.lerp_base[...].astype(x.dtype)
    lora = jnp.tanh(modules.linear(base, self.lerp_down))       # [B, T, 5 R]
    up = self.lerp_up[...]                                      # [5, R, D]
    rank = up.shape[1]
    lerp = self.lerp_weights[...].astype(x.dtype)               # [5, D]
    # x_c = x + d * (mu_c + tanh((x + d mu_x) A)_c B_c), each LoRA slice a
    # product of its own.
    xw, xk, xv, xr, xg = (
        x + delta * (lerp[c] + modules.linear(
            lora[..., c * rank:(c + 1) * rank], up[c]))
        for c in range(5))                                      # [B, T, D] each
    w = self.log_decay(xw).reshape(b, t, h, n)                  # [B, T, H, K]
    r = self.r_proj(xr).reshape(b, t, h, n)                     # [B, T, H, K]
    k = self.k_proj(xk).reshape(b, t, h, n)                     # [B, T, H, K]
    v = self.v_proj(xv).reshape(b, t, h, nv)                    # [B, T, H, V]
    # S_t = diag(exp(w_t)) S_{t-1} + k_t^T v_t,
    # o_t = r_t (S_{t-1} + diag(u) k_t^T v_t)
    o, state = self.apply_forms(ctx, RWKV6_FORMS, dict(r=r, k=k, v=v, w=w),
                                cache.get("state"), u=self.bonus[...],
                                scale=1.0)                      # [B, T, H, V]
    o = self.norm(o) + modules.per_channel(self.norm_bias)      # [B, T, H V]
    y = self.o_proj(o * jax.nn.silu(self.g_proj(xg)))           # [B, T, D]
    if ctx.cache is None:
      return y, None
    return y, {"shift": last, "state": state}


def lora_rank(d_model: int, factor: float) -> int:
  """The reference's LoRA rank: ``factor * sqrt(D)`` rounded to a multiple
  of 32, at least 32."""
  return max(32, int(round(factor * math.sqrt(d_model) / 32) * 32))


def scaled_orthogonal(scale: float):
  """Orthogonal init times ``scale`` (and ``sqrt(rows / cols)`` when there
  are more rows than columns), as the reference's ``ortho_init``.

  The draw of ``nnx.initializers.orthogonal``, with ``Q`` by Gram-Schmidt
  (``feature_maps.orthonormal_columns``): no LAPACK QR on CPU.
  """

  def init(key, shape, dtype=_F32):
    rows, cols = shape
    gain = math.sqrt(rows / cols) if rows > cols else 1.0
    tall = (rows, cols) if rows >= cols else (cols, rows)
    q = orthonormal_columns(jax.random.normal(key, tall, _F32))
    q = q if rows >= cols else q.T                              # [rows, cols]
    return (gain * scale * q).astype(dtype)

  return init


class RWKV7(Mixer):
  """RWKV-7 "Goose" time mixing (Peng et al. 2025,
  https://arxiv.org/abs/2503.14456).

  With ``x'`` the previous token (token shift) and ``d = x' - x``:

  - ``x_c = x + d * mu_c`` for ``c`` in ``r, w, k, v, a, g``;
  - ``r = x_r W_r``, ``k = x_k W_k``, ``v = x_v W_v``;
  - the decay ``exp(-exp(w))``, ``w = -softplus(-(w_0 + tanh(x_w A_w) B_w))
    - 0.5``, so every per-channel decay lies in (exp(-e^-0.5), 1);
  - the in-context learning rate ``a = sigmoid(a_0 + x_a A_a B_a)``;
  - the removal key ``kappa = l2_normalize(k * k_k)`` per head and the
    replacement key ``k * (1 + (a - 1) * k_a)``;
  - the state update ``S_t = S_{t-1} (diag(w_t) - kappa^T (a * kappa)) +
    v^T k`` (RWKV's ``[V, K]`` orientation; the RWKV-7 op with ``a =
    -kappa``, ``b = kappa * a``, ``scale = 1``), a per-head GroupNorm with
    bias, plus the bonus ``(sum(r * k * r_k) per head) v``;
  - the output gate ``g = sigmoid(x_g A_g) B_g`` and ``W_o ((.) * g)``.

  Attributes by the paper's names: ``mu`` is ``lerp_weights``; ``w_0, A_w,
  B_w`` are ``decay_base, decay_down, decay_up``; ``a_0, A_a, B_a`` are
  ``iclr_base, iclr_down, iclr_up``; ``A_g, B_g`` are ``gate_down,
  gate_up``; ``k_k, k_a, r_k`` are ``key_norm_scale, key_iclr_mix,
  bonus``.

  The value residual (``value_residual=True``): a layer after the first
  mixes in the first layer's values, ``v + (v_1 - v) * sigmoid(v_0 + x_v A_v
  B_v)`` (``value_base, value_down, value_up``); the LM passes ``v_1`` from
  the first layer (``Context.carry["v_first"]``, written by every layer
  whose ``layer_index`` is 0).

  Inits (reference implementation, ``RWKV-v7/train_temp``): ``mu`` from the
  channel index and depth; ``w_0`` from -6 to 0 over the channels plus 0.5
  and a per-head zigzag; ``a_0 = -0.19`` plus zigzag and ramp; ``k_k = 0.71
  - 0.1 ramp``, ``k_a = 1.02``, ``r_k = -0.04``; each LoRA's first matrix
  zero and second orthogonal times 0.1; ``W_r, W_v`` uniform in ``+-0.5 /
  sqrt(D)``, ``W_k`` in ``+-0.05 / sqrt(D)``; ``W_o`` zero
  (``zero_init_output``), so the block starts as the identity.

  With the zero first LoRA matrices, the second ones of the decay and of
  ``a`` (``decay_up``, ``iclr_up``) get no gradient at init (their input is
  ``tanh(0)`` or 0); the first ones do, so both move after one step.

  Args:
    d_model: ``D``. n_heads: ``H`` (head width ``D / H``).
    decay_low_rank_dim, iclr_low_rank_dim, gate_low_rank_dim: LoRA ranks;
      None for the reference's ``2.5 sqrt(D)``, ``2.5 sqrt(D)`` and ``5
      sqrt(D)`` rounded to multiples of 32 (at least 32).
    layer_index, n_layers: depth of this layer, for the inits.
    zero_init_output: start ``W_o`` at zero as the reference (True); False
      draws it like ``W_r``.
    value_residual: layers with ``layer_index > 0`` mix in the first
      layer's values (False; the paper's models have it).
    value_low_rank_dim: rank of the value-residual LoRA; None for the
      reference's ``1.7 sqrt(D)`` rounded to a multiple of 32 (at least 32).
    norm_eps: epsilon of the GroupNorm (64e-5).
    chunk_size: chunk length of the chunk form (speed only); None: 16
      on CPU, 64 on TPU/GPU (``base.resolved_chunk_size``).
  """

  no_weight_decay = ("lerp_weights", "decay_base", "iclr_base",
                     "key_norm_scale", "key_iclr_mix", "bonus")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               decay_low_rank_dim: int | None = None,
               iclr_low_rank_dim: int | None = None,
               gate_low_rank_dim: int | None = None, layer_index: int = 0,
               n_layers: int = 1, zero_init_output: bool = True,
               value_residual: bool = False,
               value_low_rank_dim: int | None = None,
               norm_eps: float = 64e-5, chunk_size: int | None = None,
               dtype=_F32, param_dtype=_F32):
    self.head_dim = n = check_heads(d_model, n_heads)
    self.first_layer = layer_index == 0
    self.value_residual = value_residual and not self.first_layer
    ranks = []
    for name, value, factor in (("decay_low_rank_dim", decay_low_rank_dim, 2.5),
                                ("iclr_low_rank_dim", iclr_low_rank_dim, 2.5),
                                ("gate_low_rank_dim", gate_low_rank_dim, 5.0)):
      ranks.append(lora_rank(d_model, factor) if value is None
                   else check_positive(name, value))
    decay_rank, iclr_rank, gate_rank = ranks
    rising, falling = depth_ratios(layer_index, n_layers)
    self.n_heads, self.chunk_size = n_heads, chunk_size
    d = d_model
    fraction = np.arange(d) / d
    ramp = np.arange(d) / max(d - 1, 1) - 0.5
    half = max((n - 1) / 2, 0.5)
    zigzag = ((np.arange(d) % n) - (n - 1) / 2) / half
    zigzag = zigzag * np.abs(zigzag)

    def p(init, shape, axes):
      return modules.param(rngs, init, shape, axes, param_dtype)

    powers = (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)                      # r w k v a g
    lerp = np.stack([1 - fraction ** (power * falling) for power in powers])
    self.lerp_weights = p(modules.constant_init(lerp), (6, d),
                          (None, "embed"))
    zeros = nnx.initializers.zeros_init()
    lora_up = scaled_orthogonal(0.1)
    decay = -6 + 6 * (ramp + 0.5) ** (1 + rising ** 0.3)
    self.decay_base = p(modules.constant_init(decay + 0.5 + 2.5 * zigzag),
                        (d,), ("heads",))
    self.decay_down = p(zeros, (d, decay_rank), ("embed", "rank"))
    self.decay_up = p(lora_up, (decay_rank, d), ("rank", "heads"))
    self.iclr_base = p(modules.constant_init(-0.19 + 0.3 * zigzag + 0.4 * ramp),
                       (d,), ("heads",))
    self.iclr_down = p(zeros, (d, iclr_rank), ("embed", "rank"))
    self.iclr_up = p(lora_up, (iclr_rank, d), ("rank", "heads"))
    self.gate_down = p(zeros, (d, gate_rank), ("embed", "rank"))
    self.gate_up = p(lora_up, (gate_rank, d), ("rank", "heads"))
    if self.value_residual:
      value_rank = (lora_rank(d_model, 1.7) if value_low_rank_dim is None
                    else check_positive("value_low_rank_dim",
                                        value_low_rank_dim))
      self.value_base = p(modules.constant_init(0.73 - 0.4 * ramp), (d,),
                          ("heads",))
      self.value_down = p(zeros, (d, value_rank), ("embed", "rank"))
      self.value_up = p(lora_up, (value_rank, d), ("rank", "heads"))
    self.key_norm_scale = p(modules.constant_init(0.71 - 0.1 * ramp), (d,),
                            ("heads",))
    self.key_iclr_mix = p(modules.constant_init(1.02), (d,), ("heads",))
    self.bonus = p(modules.constant_init(-0.04), (n_heads, n),
                   ("heads", None))
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    wide = 0.5 / math.sqrt(d)
    self.r_proj = modules.dense(d, d, kernel_init=modules.uniform_init(
        -wide, wide), **kw)
    self.k_proj = modules.dense(d, d, kernel_init=modules.uniform_init(
        -0.1 * wide, 0.1 * wide), **kw)
    self.v_proj = modules.dense(d, d, kernel_init=modules.uniform_init(
        -wide, wide), **kw)
    self.norm = modules.HeadNorm(n_heads, n, rngs=rngs, kind="layer",
                                 eps=norm_eps, param_dtype=param_dtype)
    self.norm_bias = p(zeros, (d,), ("heads",))
    self.o_proj = modules.dense(
        d, d, ("heads", "embed"),
        kernel_init=zeros if zero_init_output else modules.uniform_init(
            -wide, wide), **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    d = self.n_heads * self.head_dim
    return {"shift": jnp.zeros((batch_size, d), _F32),
            "state": zero_state(batch_size, self.n_heads, self.head_dim,
                                self.head_dim)}

  def recurrent_state_floats(self, seq_len):
    """``H x (D / H) x (D / H)``."""
    del seq_len
    return self.n_heads * self.head_dim * self.head_dim

  def conv_state_floats(self):
    """The token shift's previous token, ``D``."""
    return self.n_heads * self.head_dim

  def log_decay(self, xw):
    """``-exp(w)`` with ``w = -softplus(-(w_0 + lora(x_w))) - 0.5``:
    ``[B, T, D]`` float32 in (-exp(-0.5), 0)."""
    w = modules.lora(xw.astype(_F32), self.decay_down, self.decay_up,
                     jnp.tanh, self.decay_base)                 # [B, T, D]
    return -jnp.exp(-jax.nn.softplus(-w) - 0.5)

  def iclr(self, xa):
    """In-context learning rate ``sigmoid(a_0 + x_a A_a B_a)``: ``[B, T, D]``
    float32 in (0, 1)."""
    return jax.nn.sigmoid(modules.lora(xa.astype(_F32), self.iclr_down,
                                       self.iclr_up, bias=self.iclr_base))

  def mix(self, x, ctx: Context):
    b, t, d = x.shape
    h, n = self.n_heads, self.head_dim
    cache = {} if ctx.cache is None else ctx.cache
    shifted, last = modules.token_shift(x, ctx, cache.get("shift"))
    delta = shifted - x                                         # [B, T, D]
    lerp = self.lerp_weights[...].astype(x.dtype)               # [6, D]
    xr, xw, xk, xv, xa, xg = (x + delta * modules.per_channel(lerp[c])
                              for c in range(6))                # [B, T, D] each
    r = self.r_proj(xr).reshape(b, t, h, n)                     # [B, T, H, K]
    w = self.log_decay(xw).reshape(b, t, h, n)                  # [B, T, H, K]
    k = self.k_proj(xk)                                         # [B, T, D]
    v = self.v_proj(xv)                                         # [B, T, D]
    carry = ctx.carry
    if self.first_layer and carry is not None:
      carry = dict(carry, v_first=v)
    elif self.value_residual:
      if carry is None or "v_first" not in carry:
        raise ValueError("an RWKV-7 layer with value_residual needs the first "
                         "layer's values: run it inside an LM (Mixer.run "
                         "with the carry of layer 0)")
      mix = jax.nn.sigmoid(modules.lora(
          xv.astype(_F32), self.value_down, self.value_up,
          bias=self.value_base))                                # [B, T, D]
      vf = v.astype(_F32)
      v = (vf + (carry["v_first"].astype(_F32) - vf) * mix).astype(v.dtype)
    v = v.reshape(b, t, h, n)                                   # [B, T, H, V]
    a = self.iclr(xa)                                           # [B, T, D]
    gate = modules.lora(xg, self.gate_down, self.gate_up,
                        jax.nn.sigmoid)                         # [B, T, D]
    kf = k.astype(_F32)
    kappa = l2_normalize((kf * modules.per_channel(self.key_norm_scale))
                         .reshape(b, t, h, n))                  # [B, T, H, K]
    k = kf * (1 + (a - 1) * modules.per_channel(self.key_iclr_mix))
    k = k.astype(x.dtype).reshape(b, t, h, n)                   # [B, T, H, K]
    a = a.reshape(b, t, h, n)                                   # [B, T, H, K]
    # S_t = S_{t-1} (diag(w_t) - kappa_t^T (a_t * kappa_t)) + v_t^T k_t,
    # o_t = S_t r_t: the op's transition diag(w) + a^T b with a = -kappa,
    # b = kappa * a.
    o, state = self.apply_forms(
        ctx, RWKV7_FORMS, dict(r=r, w=w, k=k, v=v, a=-kappa, b=kappa * a),
        cache.get("state"), scale=1.0)                          # [B, T, H, V]
    # RWKV-6's current-token term, outside the op: (r . (u * k)) v.
    now = current_token_term(r, k, v, self.bonus[...], 1.0)    # [B, T, H, V]
    o = (self.norm(o).astype(_F32) + modules.per_channel(self.norm_bias)
         + now.reshape(b, t, d))                                # [B, T, D]
    y = self.o_proj((o * gate.astype(_F32)).astype(x.dtype))
    new_cache = None if ctx.cache is None else {"shift": last, "state": state}
    return y, new_cache, carry
