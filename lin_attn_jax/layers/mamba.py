"""Mamba block (Gu & Dao, 2023, arXiv:2312.00752), on the selective scan.

``x, z = x W_in`` (each of width ``E = expand * D``); ``x`` goes through a
causal depthwise convolution of ``d_conv`` taps and SiLU; ``x W_x`` gives the
low-rank time step and the input-dependent ``B, C`` (``d_state`` each); the
time step is projected back to ``E`` channels, ``dt = softplus(dt W_dt +
b_dt)``; the selective scan with ``A = -exp(A_log)`` and the skip ``D`` is
gated by ``silu(z)`` and projected back to ``D``. Jamba's variant
(``inner_norms``) normalises the low-rank time step, ``B`` and ``C`` with
RMSNorms before they are used.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms
from lin_attn_jax.ops import (chunk_selective_scan, parallel_selective_scan,
                              recurrent_selective_scan, selective_scan_step)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.mamba.inputs import CHUNK_SIZE

SELECTIVE_SCAN_FORMS = OpForms(chunk_selective_scan, parallel_selective_scan,
                               recurrent_selective_scan, selective_scan_step)


def dt_bias_init(dt_min: float, dt_max: float, floor: float):
  """The time-step bias of Mamba and Mamba-2: ``softplus(bias)`` is drawn
  log-uniformly in ``[dt_min, dt_max]`` and clamped below at ``floor``.

  The inverse of softplus is ``dt + log(-expm1(-dt))``, exact for small dt.
  """

  def init(key, shape, dtype=jnp.float32):
    log_dt = jax.random.uniform(key, shape, jnp.float32, math.log(dt_min),
                                math.log(dt_max))
    dt = jnp.maximum(jnp.exp(log_dt), floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)

  return init


def check_dt_range(dt_min: float, dt_max: float, floor: float) -> None:
  if not 0 < dt_min <= dt_max:
    raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min = {dt_min}, "
                     f"dt_max = {dt_max}")
  if floor <= 0:
    raise ValueError(f"dt_init_floor must be > 0, got {floor}")


def inner_width(d_model: int, expand: float) -> int:
  width = int(expand * d_model)
  if width < 1 or width != expand * d_model:
    raise ValueError(f"expand * d_model must be a positive integer, got "
                     f"{expand} * {d_model}")
  return width


class Mamba(Mixer):
  """The Mamba (S6) block.

  ``n_heads`` has no role in Mamba-1 (every channel has its own SSM); it is
  accepted for the common constructor and ignored.

  Initialisation as in the paper's reference: ``A_log[d, n] = log(n + 1)``
  (S4D-Real, ``A = -(1, ..., N)`` in every channel), ``D = 1``; the time-step
  projection's weight uniform in ``+-dt_scale * dt_rank ** -0.5`` and its bias
  the inverse softplus of a time step drawn log-uniformly in ``[dt_min,
  dt_max]`` (clamped at ``dt_init_floor``); the other projections LeCun
  normal and the convolution as in ``modules.ShortConv``.

  Args:
    d_model: ``D``. n_heads: ignored (see above).
    d_state: ``N``, the state size per channel (16).
    d_conv: taps of the short convolution (4).
    expand: inner width ``E = expand * D`` (2).
    dt_rank: rank of the time-step projection, or ``"auto"`` for
      ``ceil(D / 16)``.
    dt_min, dt_max, dt_init_floor, dt_scale: time-step initialisation
      (1e-3, 1e-1, 1e-4, 1).
    conv_bias: the convolution has a bias (True).
    bias: the input and output projections have biases (False).
    chunk_size: tokens between saved states in the chunk form (speed and
      memory only; the op's default, see ``ops.chunk_selective_scan``).
    inner_norms: RMSNorms (scale 1 at init, float32) of the low-rank time
      step ``[dt_rank]``, of ``B`` and of ``C`` ``[d_state]`` right after
      ``x_proj`` (False; Jamba's ``dt_layernorm``, ``b_layernorm``,
      ``c_layernorm``: parameters ``dt_norm.scale``, ``B_norm.scale``,
      ``C_norm.scale``).
    inner_norm_eps: their epsilon (1e-6, Jamba's ``rms_norm_eps``).

  Cache: ``{"conv": [B, d_conv - 1, E], "ssm": [B, E, N]}``, float32.
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  no_weight_decay = ("A_log", "dt_bias", "D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               d_state: int = 16, d_conv: int = 4, expand: float = 2,
               dt_rank: int | str = "auto", dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               dt_scale: float = 1.0, conv_bias: bool = True,
               bias: bool = False, chunk_size: int = CHUNK_SIZE,
               inner_norms: bool = False, inner_norm_eps: float = 1e-6,
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.set_causal(causal)
    del n_heads
    width = inner_width(d_model, expand)
    if dt_rank == "auto":
      dt_rank = math.ceil(d_model / 16)
    checks.positive_int("dt_rank", dt_rank, also=" or 'auto'")
    if d_state < 1 or d_conv < 1:
      raise ValueError(f"d_state and d_conv must be >= 1, got {d_state} and "
                       f"{d_conv}")
    check_dt_range(dt_min, dt_max, dt_init_floor)
    self.width, self.d_state, self.dt_rank = width, d_state, dt_rank
    self.chunk_size = chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(d_model, 2 * width, use_bias=bias, **kw)
    self.conv = modules.ShortConv(width, d_conv, rngs=rngs, activation="silu",
                                  use_bias=conv_bias, param_dtype=param_dtype)
    self.x_proj = modules.dense(width, dt_rank + 2 * d_state, ("heads", None),
                                **kw)
    bound = dt_scale * dt_rank ** -0.5
    self.dt_proj = modules.dense(dt_rank, width, ("rank", "heads"),
                                 kernel_init=modules.uniform_init(-bound,
                                                                  bound), **kw)
    self.dt_bias = modules.param(
        rngs, dt_bias_init(dt_min, dt_max, dt_init_floor), (width,),
        ("heads",), param_dtype)
    a_log = jnp.log(jnp.arange(1, d_state + 1, dtype=jnp.float32))
    self.A_log = modules.param(rngs, modules.constant_init(a_log),
                               (width, d_state), ("heads", "state"),
                               param_dtype)
    self.D = modules.param(rngs, nnx.initializers.ones_init(), (width,),
                           ("heads",), param_dtype)
    self.out_proj = modules.dense(width, d_model, ("heads", "embed"),
                                  use_bias=bias, **kw)
    norm = dict(rngs=rngs, eps=inner_norm_eps, param_dtype=param_dtype)
    self.dt_norm, self.B_norm, self.C_norm = (
        (modules.ChannelRMSNorm(dt_rank, **norm),
         modules.ChannelRMSNorm(d_state, **norm),
         modules.ChannelRMSNorm(d_state, **norm)) if inner_norms
        else (None, None, None))

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return {"conv": self.conv.init_state(batch_size),
            "ssm": jnp.zeros((batch_size, self.width, self.d_state),
                             jnp.float32)}

  def recurrent_state_floats(self, seq_len):
    """``E x N``."""
    del seq_len
    return self.width * self.d_state

  def conv_state_floats(self):
    return (self.conv.width - 1) * self.conv.channels

  def mix(self, x, ctx: Context):
    cache = ctx.cache
    u, z = jnp.split(self.in_proj(x), 2, axis=-1)               # [B, T, E]
    u, conv_state = self.conv(u, ctx, None if cache is None else cache["conv"])
    delta, B, C = jnp.split(self.x_proj(u),
                            [self.dt_rank, self.dt_rank + self.d_state],
                            axis=-1)                            # [B, T, R|N|N]
    if self.dt_norm is not None:
      delta, B, C = self.dt_norm(delta), self.B_norm(B), self.C_norm(C)
    delta = self.dt_proj(delta)                                 # [B, T, E]
    A = -jnp.exp(self.A_log[...].astype(jnp.float32))           # [E, N]
    # dt = softplus(delta + b_dt), h_t = exp(dt A) h_{t-1} + dt B_t u_t,
    # y_t = (C_t h_t + D u_t) * silu(z_t)
    y, ssm_state = self.apply_forms(
        ctx, SELECTIVE_SCAN_FORMS, dict(u=u, delta=delta, B=B, C=C, z=z),
        None if cache is None else cache["ssm"], A=A, D=self.D[...],
        delta_bias=self.dt_bias[...], delta_softplus=True)      # [B, T, E]
    y = self.out_proj(y)                                        # [B, T, D]
    if cache is None:
      return y, None
    return y, {"conv": conv_state, "ssm": ssm_state}
