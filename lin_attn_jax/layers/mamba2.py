"""Mamba-2 block (Dao & Gu, 2024, arXiv:2405.21060), on SSD.

One input projection gives ``z`` (width ``E = expand * D``), ``x`` (width
``E``, ``H`` heads of ``P = E / H``), ``B, C`` (``G`` groups of ``d_state``)
and the time step (one per head). ``x, B, C`` go together through a causal
depthwise convolution and SiLU; SSD with a scalar decay ``exp(dt A)`` per
head and the skip ``D x`` follows, then the gated RMSNorm ``norm(y *
silu(z))`` and the output projection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import (Context, Mixer, OpForms, checked_impl,
                                      zero_state)
from lin_attn_jax.layers.mamba import check_dt_range, dt_bias_init, inner_width
from lin_attn_jax.ops import chunk_ssd, parallel_ssd, recurrent_ssd, ssd_step

SSD_FORMS = OpForms(chunk_ssd, parallel_ssd, recurrent_ssd, ssd_step)


def _log_uniform_a(low: float, high: float):
  """``A_log = log(A)`` with ``A`` uniform in ``[low, high]``."""

  def init(key, shape, dtype=jnp.float32):
    a = modules.uniform_init(low, high)(key, shape, jnp.float32)
    return jnp.log(a).astype(dtype)

  return init


class Mamba2(Mixer):
  """The Mamba-2 block.

  The output norm is the reference's gated RMSNorm, ``rms_norm(y *
  silu(z))`` over each group's ``E / G`` channels (the full width with one
  group, as in the paper), computed by ``modules.HeadNorm`` with one "head"
  per group and ``gate_first=True``.

  Initialisation as in the paper's reference: ``A`` uniform in
  ``A_init_range`` per head (stored as ``A_log = log A``, the decay is
  ``exp(-dt exp(A_log))``), ``dt_bias`` the inverse softplus of a time step
  drawn log-uniformly in ``[dt_min, dt_max]`` (clamped at ``dt_init_floor``),
  ``D = 1``, the norm's scale 1; projections LeCun normal and the
  convolution as in ``modules.ShortConv``.

  Args:
    d_model: ``D``. n_heads: ``H``; the head dimension is ``P = E / H``
      unless ``head_dim`` is given.
    d_state: ``N``, the state size per head (64).
    d_conv: taps of the short convolution (4).
    expand: inner width ``E = expand * D`` (2).
    n_groups: ``G``, groups of heads sharing ``B`` and ``C`` (1).
    A_init_range: range of the uniform draw of ``A`` ((1, 16)).
    dt_min, dt_max, dt_init_floor: time-step initialisation (1e-3, 1e-1,
      1e-4).
    conv_bias: the convolution has a bias (True).
    bias: the input and output projections have biases (False).
    norm_eps: epsilon of the gated RMSNorm (1e-5).
    head_dim: ``P``; given, the inner width is ``E = H * P`` and ``expand``
      is not used (None: ``P = expand * D / H``).
    time_step_limit: ``(low, high)``: the time step ``softplus(dt +
      dt_bias)`` is clamped to it, in every form (the reference's
      ``time_step_limit``; ``(0, inf)`` is no clamp).
    chunk_size: chunk length of the chunk form (speed only).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation (``lin_attn_jax.ops.common.dispatch``).
    rms_norm: the gated RMSNorm before the output projection; False: ``y *
      silu(z)`` alone (True; Falcon-H1's ``mamba_rms_norm`` False).
    norm_before_gate: the norm is ``rms_norm(y) * silu(z)`` instead of
      ``rms_norm(y * silu(z))`` (False; Falcon-H1's
      ``mamba_norm_before_gate`` True).
    out_bias: the output projection has a bias (None: as ``bias``;
      Falcon-H1's ``projectors_bias``).
    in_proj_multipliers: five factors on the input projection's parts ``(z,
      x, B, C, dt)``, applied before the convolution and the time step's
      softplus (None for none; Falcon-H1's ``ssm_multipliers``, its muP
      vector).

  Cache: ``{"conv": [B, d_conv - 1, E + 2 G N], "ssm": [B, H, N, P]}``,
  float32.
    causal: False for the non-causal layer: every token reads its
      whole document in both directions (``Mixer.set_causal``).
  """

  no_weight_decay = ("A_log", "dt_bias", "D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               d_state: int = 64, d_conv: int = 4, expand: float = 2,
               n_groups: int = 1, A_init_range: tuple[float, float] = (1, 16),
               dt_min: float = 1e-3, dt_max: float = 1e-1,
               dt_init_floor: float = 1e-4, conv_bias: bool = True,
               bias: bool = False, norm_eps: float = 1e-5,
               head_dim: int | None = None,
               time_step_limit: tuple[float, float] = (0.0, float("inf")),
               chunk_size: int = 64, impl: str = "auto",
               rms_norm: bool = True, norm_before_gate: bool = False,
               out_bias: bool | None = None,
               in_proj_multipliers: tuple[float, ...] | None = None,
               causal: bool = True, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.set_causal(causal)
    if head_dim is None:
      width = inner_width(d_model, expand)
    elif isinstance(head_dim, int) and head_dim >= 1 and n_heads >= 1:
      width = n_heads * head_dim
    else:
      raise ValueError(f"head_dim must be a positive int or None, got "
                       f"{head_dim!r} (n_heads = {n_heads})")
    low, high = (float(v) for v in time_step_limit)
    if not 0 <= low < high:
      raise ValueError(f"time_step_limit must be (low, high) with 0 <= low < "
                       f"high, got {time_step_limit}")
    self.time_step_limit = None if (low, high) == (0.0, float("inf")) else (
        low, high)
    if n_heads < 1 or width % n_heads:
      raise ValueError(f"the inner width expand * d_model = {width} must "
                       f"divide into n_heads = {n_heads}")
    if n_groups < 1 or n_heads % n_groups:
      raise ValueError(f"n_groups = {n_groups} must divide n_heads = "
                       f"{n_heads}")
    if d_state < 1 or d_conv < 1:
      raise ValueError(f"d_state and d_conv must be >= 1, got {d_state} and "
                       f"{d_conv}")
    a_low, a_high = A_init_range
    if not 0 < a_low <= a_high:
      raise ValueError(f"A_init_range must satisfy 0 < low <= high, got "
                       f"{A_init_range}")
    check_dt_range(dt_min, dt_max, dt_init_floor)
    if in_proj_multipliers is not None:
      in_proj_multipliers = tuple(float(m) for m in in_proj_multipliers)
      if len(in_proj_multipliers) != 5:
        raise ValueError(f"in_proj_multipliers must be five factors (z, x, "
                         f"B, C, dt), got {in_proj_multipliers}")
    self.in_proj_multipliers = in_proj_multipliers
    self.width, self.n_heads, self.head_dim = width, n_heads, width // n_heads
    self.d_state, self.n_groups, self.chunk_size = d_state, n_groups, chunk_size
    self.impl = checked_impl(impl)
    conv_width = width + 2 * n_groups * d_state
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(d_model, width + conv_width + n_heads,
                                 use_bias=bias, **kw)
    self.conv = modules.ShortConv(conv_width, d_conv, rngs=rngs,
                                  activation="silu", use_bias=conv_bias,
                                  param_dtype=param_dtype)
    self.dt_bias = modules.param(
        rngs, dt_bias_init(dt_min, dt_max, dt_init_floor), (n_heads,),
        ("heads",), param_dtype)
    self.A_log = modules.param(rngs, _log_uniform_a(a_low, a_high),
                               (n_heads,), ("heads",), param_dtype)
    self.D = modules.param(rngs, nnx.initializers.ones_init(), (n_heads,),
                           ("heads",), param_dtype)
    self.norm = (modules.HeadNorm(n_groups, width // n_groups, rngs=rngs,
                                  eps=norm_eps,
                                  gate_first=not norm_before_gate,
                                  param_dtype=param_dtype)
                 if rms_norm else None)
    self.out_proj = modules.dense(width, d_model, ("heads", "embed"),
                                  use_bias=bias if out_bias is None
                                  else out_bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    return {"conv": self.conv.init_state(batch_size),
            "ssm": zero_state(batch_size, self.n_heads, self.d_state,
                              self.head_dim)}

  def recurrent_state_floats(self, seq_len):
    """``H x N x P`` (``N x E``)."""
    del seq_len
    return self.n_heads * self.d_state * self.head_dim

  def conv_state_floats(self):
    return (self.conv.width - 1) * self.conv.channels

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    e, h, g, n = self.width, self.n_heads, self.n_groups, self.d_state
    cache = ctx.cache
    # The parts as arrays of their own (``Dense.parts``, ``ShortConv.parts``).
    z, xs, B, C, dt = self.in_proj.parts(
        x, [e, 2 * e, 2 * e + g * n, 2 * e + 2 * g * n])   # [B, T, E|E|GN|GN|H]
    if self.in_proj_multipliers is not None:
      z, xs, B, C, dt = (part * m for part, m in zip(
          (z, xs, B, C, dt), self.in_proj_multipliers))
    (xs, B, C), conv_state = self.conv.parts(
        [xs, B, C], ctx, None if cache is None else cache["conv"])
    xs = xs.reshape(b, t, h, self.head_dim)                     # [B, T, H, P]
    B = B.reshape(b, t, g, n)                                   # [B, T, G, N]
    C = C.reshape(b, t, g, n)                                   # [B, T, G, N]
    A = -jnp.exp(self.A_log[...].astype(jnp.float32))           # [H]
    params = dict(D=self.D[...], dt_bias=self.dt_bias[...], dt_softplus=True)
    if self.time_step_limit is not None:
      dt = jnp.clip(jax.nn.softplus(dt.astype(jnp.float32)
                                    + self.dt_bias[...].astype(jnp.float32)),
                    *self.time_step_limit)                      # [B, T, H]
      params = dict(D=self.D[...])
    # h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T,  y_t = h_t^T C_t + D x_t
    y, ssm_state = self.apply_forms(
        ctx, SSD_FORMS, dict(x=xs, dt=dt, B=B, C=C),
        None if cache is None else cache["ssm"], A=A,
        **params)                                               # [B, T, H, P]
    if self.norm is None:
      y = y.reshape(b, t, e) * jax.nn.silu(z.astype(jnp.float32)).astype(
          y.dtype)                                              # [B, T, E]
    else:
      y = self.norm(y.reshape(b, t, g, e // g), z)              # [B, T, E]
    y = self.out_proj(y)
    if cache is None:
      return y, None
    return y, {"conv": conv_state, "ssm": ssm_state}
