"""Mamba-3 block (Lahoti et al. 2026, "Mamba-3: Improved Sequence Modeling
using State Space Principles"), SISO or MIMO, on the ``mamba3`` and
``mamba3_mimo`` ops.

One input projection gives ``z`` and ``x`` (width ``E = expand * D``, ``H``
heads of ``P``), ``B`` and ``C`` (``G`` groups of ``N``), and per head the
time step, the decay rate and the trapezoid's ``lambda`` pre-activations,
plus ``A`` rotation rates shared by the heads. There is no short
convolution: ``B`` and ``C`` are RMS-normalised over ``N`` and get a
learnt bias per head; the op turns them by the cumulative angles and runs
the trapezoidal recurrence; the skip ``D x``, the gate ``silu(z)`` and the
output projection follow. MIMO (``is_mimo``) projects ``R`` of each of
``B`` and ``C``, scales ``x`` and ``z`` per rank and channel into ``R``
values and gates, and sums the ``R`` outputs per channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms, checked_impl
from lin_attn_jax.layers.mamba import check_dt_range, dt_bias_init
from lin_attn_jax.ops import (chunk_mamba3, chunk_mamba3_mimo, mamba3_mimo_step,
                              mamba3_step, parallel_mamba3,
                              parallel_mamba3_mimo, recurrent_mamba3,
                              recurrent_mamba3_mimo)
from lin_attn_jax.ops.mamba3 import interleave_halves
from lin_attn_jax.ops.mamba3.inputs import mimo_state_shape, zero_state

MAMBA3_FORMS = OpForms(chunk_mamba3, parallel_mamba3, recurrent_mamba3,
                       mamba3_step)
MAMBA3_MIMO_FORMS = OpForms(chunk_mamba3_mimo, parallel_mamba3_mimo,
                            recurrent_mamba3_mimo, mamba3_mimo_step)


def rope_angles(d_state: int, rope_fraction: float) -> int:
  """The reference's number of rotated pairs ``A``: ``N * rope_fraction``
  rounded down to an even number, halved."""
  split = int(d_state * rope_fraction)
  return (split - split % 2) // 2


class Mamba3(Mixer):
  """The Mamba-3 block (fla's ``layers/mamba3.py``).

  Per head ``h`` of group ``g``::

      dt = softplus(dd_dt + dt_bias),   A = min(-softplus(dd_A), -A_floor)
      k = rms_norm(B_g) + B_bias_h,      q = rms_norm(C_g) + C_bias_h
      y = mamba3(q, k, x, A dt, dt, trap, angles) + D x
      out = out_proj(y * silu(z))        (or norm(y) * silu(z) per head,
                                          with is_outproj_norm)

  MIMO (``is_mimo``, rank ``R``): ``B`` and ``C`` are ``R`` vectors per
  group (in_proj's layout ``(r g n)``) with biases per head and rank, and::

      v_r = x * mimo_x_r,   (q_r, k_r) from C_r, B_r as above
      y_r = mamba3_mimo(q, k, v, ...)_r + D v_r
      out = out_proj(sum_r mimo_o_r * y_r * silu(z * mimo_z_r))
            (or norm(y_r) * silu(z * mimo_z_r) per head, with
             is_outproj_norm)

  (``*`` per channel; ``mimo_x, mimo_z, mimo_o [H, R, P]``), and the
  rotation turns the pairs ``(i, i + N / 2)`` as the reference's MIMO
  kernels do (``interleave_halves`` before the op).

  Initialisation as fla's: ``dt_bias`` the inverse softplus of a time step
  drawn log-uniformly in ``[dt_min, dt_max]`` (clamped at
  ``dt_init_floor``), ``D = 1``, the biases of ``B`` and ``C`` 1, the norms'
  scales 1, ``mimo_x = mimo_o = 1 / R``, ``mimo_z = 1``; projections LeCun
  normal (fla's model re-draws them at ``initializer_range``).

  Args:
    d_model: ``D``. n_heads: ``H``; with ``head_dim`` None, ``P = E / H``.
    d_state: ``N`` (128).
    expand: inner width ``E = expand * D`` (2).
    head_dim: ``P`` (None: ``E / n_heads``); given, ``E = H P``.
    n_groups: ``G``, groups of heads sharing ``B`` and ``C`` (1).
    rope_fraction: the share of ``N`` that rotates, 0.5 or 1.0 (0.5).
    dt_min, dt_max, dt_init_floor: time-step initialisation (1e-3, 1e-1,
      1e-4).
    A_floor: the decay rate's floor, ``A <= -A_floor`` (1e-4).
    is_outproj_norm: a per-head gated RMSNorm before the output
      projection instead of the plain gate (False).
    is_mimo: ``R`` inputs and outputs per head (False: SISO).
    mimo_rank: ``R`` (4; with ``is_mimo`` only).
    bias: the projections have biases (False).
    norm_eps: epsilon of the norms (1e-5).
    chunk_size: chunk length of the chunk form (speed only).
    impl: the chunk form's implementation (``"auto"``, ``"xla"``,
      ``"pallas"``: the gated-linear core's kernels).

  Cache: ``[B, H, N + 1, P + 1]`` float32, the op's state (MIMO: ``[B, H,
  N + R, P + R]``).
  """

  no_weight_decay = ("dt_bias", "D")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               d_state: int = 128, expand: float = 2,
               head_dim: int | None = None, n_groups: int = 1,
               rope_fraction: float = 0.5, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               A_floor: float = 1e-4, is_outproj_norm: bool = False,
               is_mimo: bool = False, mimo_rank: int = 4,
               bias: bool = False,
               norm_eps: float = 1e-5, chunk_size: int = 64,
               impl: str = "auto", dtype=jnp.float32,
               param_dtype=jnp.float32):
    if is_mimo and mimo_rank < 1:
      raise ValueError(f"mimo_rank must be >= 1, got {mimo_rank}")
    if is_mimo and d_state % 2:
      raise ValueError(f"MIMO rotates the halves of d_state = {d_state}, "
                       "which must be even")
    rank = mimo_rank if is_mimo else 1
    width = (int(expand * d_model) if head_dim is None
             else n_heads * head_dim)
    if n_heads < 1 or width % n_heads:
      raise ValueError(f"the inner width {width} must divide into n_heads = "
                       f"{n_heads}")
    if n_groups < 1 or n_heads % n_groups:
      raise ValueError(f"n_groups = {n_groups} must divide n_heads = "
                       f"{n_heads}")
    if rope_fraction not in (0.5, 1.0):
      raise ValueError(f"rope_fraction must be 0.5 or 1.0, got "
                       f"{rope_fraction}")
    n_angles = rope_angles(d_state, rope_fraction)
    if n_angles < 1:
      raise ValueError(f"d_state * rope_fraction = {d_state * rope_fraction}"
                       " is too small for a rotation")
    if A_floor <= 0:
      raise ValueError(f"A_floor must be > 0, got {A_floor}")
    check_dt_range(dt_min, dt_max, dt_init_floor)
    self.width, self.n_heads, self.head_dim = width, n_heads, width // n_heads
    self.d_state, self.n_groups, self.n_angles = d_state, n_groups, n_angles
    self.A_floor, self.norm_eps = A_floor, norm_eps
    self.is_mimo, self.rank = is_mimo, rank
    self.chunk_size, self.impl = chunk_size, checked_impl(impl)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(
        d_model,
        2 * width + 2 * rank * n_groups * d_state + 3 * n_heads + n_angles,
        use_bias=bias, **kw)
    self.dt_bias = modules.param(
        rngs, dt_bias_init(dt_min, dt_max, dt_init_floor), (n_heads,),
        ("heads",), param_dtype)
    ones = nnx.initializers.ones_init()
    bias_shape, bias_axes = (((n_heads, rank, d_state), ("heads", None, None))
                             if is_mimo else
                             ((n_heads, d_state), ("heads", None)))
    self.B_bias = modules.param(rngs, ones, bias_shape, bias_axes,
                                param_dtype)
    self.C_bias = modules.param(rngs, ones, bias_shape, bias_axes,
                                param_dtype)
    self.B_norm = modules.param(rngs, ones, (d_state,), (None,), param_dtype)
    self.C_norm = modules.param(rngs, ones, (d_state,), (None,), param_dtype)
    self.D = modules.param(rngs, ones, (n_heads,), ("heads",), param_dtype)
    if is_mimo:
      per_rank = (n_heads, rank, self.head_dim)
      axes = ("heads", None, None)
      by_rank = nnx.initializers.constant(1.0 / rank)
      self.mimo_x = modules.param(rngs, by_rank, per_rank, axes, param_dtype)
      self.mimo_z = modules.param(rngs, ones, per_rank, axes, param_dtype)
      self.mimo_o = modules.param(rngs, by_rank, per_rank, axes, param_dtype)
    self.norm = (modules.HeadNorm(n_heads, self.head_dim, rngs=rngs,
                                  eps=norm_eps, param_dtype=param_dtype)
                 if is_outproj_norm else None)
    self.out_proj = modules.dense(width, d_model, ("heads", "embed"),
                                  use_bias=bias, **kw)

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del max_len, dtype
    if self.is_mimo:
      return jnp.zeros(mimo_state_shape(batch_size, self.n_heads, self.rank,
                                        self.d_state, self.head_dim),
                       jnp.float32)
    return zero_state(batch_size, self.n_heads, self.d_state, self.head_dim)

  def recurrent_state_floats(self, seq_len):
    """``H (N + R) (P + R)``: the state, the last keys and the last values
    (``R = 1`` for SISO)."""
    del seq_len
    return (self.n_heads * (self.d_state + self.rank)
            * (self.head_dim + self.rank))

  def _bc(self, x, scale, bias):
    """``rms_norm(x) * scale`` over ``N`` (float32), groups to heads, plus
    the per-head bias (if not None): ``[B, T, G, N] -> [B, T, H, N]``."""
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True)
                          + self.norm_eps) * scale[...].astype(jnp.float32)
    x = jnp.repeat(x, self.n_heads // self.n_groups, axis=2)
    return x if bias is None else x + bias[...].astype(jnp.float32)

  def _bc_mimo(self, x, scale, bias):
    """``_bc`` per rank: ``[B, T, R, G, N] -> [B, T, H, R, N]``, the halves
    of ``N`` interleaved (``interleave_halves``)."""
    b, t, r, g, n = x.shape
    x = self._bc(x.reshape(b, t * r, g, n), scale, None)
    x = jnp.swapaxes(x.reshape(b, t, r, self.n_heads, n), 2, 3)
    return interleave_halves(x + bias[...].astype(jnp.float32))

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    e, h, g, n = self.width, self.n_heads, self.n_groups, self.d_state
    r = self.rank
    gn = r * g * n
    z, xs, B, C, dd_dt, dd_a, trap, angles = self.in_proj.parts(
        x, [e, 2 * e, 2 * e + gn, 2 * e + 2 * gn, 2 * e + 2 * gn + h,
            2 * e + 2 * gn + 2 * h, 2 * e + 2 * gn + 3 * h])
    xs = xs.reshape(b, t, h, self.head_dim)                     # [B, T, H, P]
    if self.is_mimo:
      k = self._bc_mimo(B.reshape(b, t, r, g, n), self.B_norm, self.B_bias)
      q = self._bc_mimo(C.reshape(b, t, r, g, n), self.C_norm, self.C_bias)
    else:
      k = self._bc(B.reshape(b, t, g, n), self.B_norm, self.B_bias)
      q = self._bc(C.reshape(b, t, g, n), self.C_norm, self.C_bias)
    dt = jax.nn.softplus(dd_dt.astype(jnp.float32)
                         + self.dt_bias[...].astype(jnp.float32))  # [B, T, H]
    a = jnp.minimum(-jax.nn.softplus(dd_a.astype(jnp.float32)),
                    -self.A_floor)                              # [B, T, H]
    angles = jnp.broadcast_to(angles.astype(jnp.float32)[:, :, None],
                              (b, t, h, self.n_angles))         # [B, T, H, A]
    if self.is_mimo:
      return self._mix_mimo(x, ctx, q, k, xs, z, a, dt, trap, angles)
    y, state = self.apply_forms(
        ctx, MAMBA3_FORMS,
        dict(q=q, k=k, v=xs, g=a * dt, dt=dt,
             trap=trap.astype(jnp.float32), angles=angles),
        ctx.cache)                                              # [B, T, H, P]
    y = y.astype(jnp.float32) + (self.D[...].astype(jnp.float32)[:, None]
                                 * xs.astype(jnp.float32))
    if self.norm is None:
      y = (y.reshape(b, t, e)
           * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
    else:
      y = self.norm(y.astype(x.dtype), z)
    return self.out_proj(y), state

  def _mix_mimo(self, x, ctx, q, k, xs, z, a, dt, trap, angles):
    b, t, _ = x.shape
    h, p = self.n_heads, self.head_dim
    f32 = jnp.float32
    v = jnp.einsum("bthp,hrp->bthrp", xs.astype(f32),
                   self.mimo_x[...].astype(f32))             # [B, T, H, R, P]
    gate = jnp.einsum("bthp,hrp->bthrp", z.reshape(b, t, h, p).astype(f32),
                      self.mimo_z[...].astype(f32))          # [B, T, H, R, P]
    y, state = self.apply_forms(
        ctx, MAMBA3_MIMO_FORMS,
        dict(q=q, k=k, v=v.astype(xs.dtype), g=a * dt, dt=dt,
             trap=trap.astype(f32), angles=angles),
        ctx.cache)                                           # [B, T, H, R, P]
    y = y.astype(f32) + self.D[...].astype(f32)[:, None, None] * v
    if self.norm is None:
      y = y * jax.nn.silu(gate)
    else:
      ranks = lambda u: jnp.moveaxis(u, 3, 2).reshape(b, t * self.rank, h, p)
      y = self.norm(ranks(y), ranks(gate).reshape(b, t * self.rank, h * p))
      y = jnp.moveaxis(y.astype(f32).reshape(b, t, self.rank, h, p), 2, 3)
    y = jnp.einsum("bthrp,hrp->bthp", y, self.mimo_o[...].astype(f32))
    return self.out_proj(y.reshape(b, t, h * p).astype(x.dtype)), state
