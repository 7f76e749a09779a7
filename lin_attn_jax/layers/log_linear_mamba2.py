"""Log-linear Mamba-2 (Guo et al. 2025, arXiv:2506.04761), on log-linear
attention.

Mamba-2's block (``layers/mamba2.py``) with SSD replaced by log-linear
attention: the input projection gives, after ``z, x, B, C`` and the time
step, ``L`` level inputs per head ``dl``; the level weights are
``lambda_t^(l) = softplus(L_param[h, l] * dl_t[h, l])``, and with ``q = C``,
``k = B``, ``v = x dt``, ``g = dt A``, scale 1 the op keeps ``L`` Fenwick
states per head (``ops/log_linear_attn``). ``D x``, the gated RMSNorm and
the output projection follow as in Mamba-2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, OpForms
from lin_attn_jax.layers.mamba2 import Mamba2
from lin_attn_jax.ops import (chunk_log_linear_attn, log_linear_attn_step,
                              parallel_log_linear_attn,
                              recurrent_log_linear_attn)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.log_linear_attn.inputs import positions

LOG_LINEAR_FORMS = OpForms(chunk_log_linear_attn, parallel_log_linear_attn,
                           recurrent_log_linear_attn, log_linear_attn_step)
# fla's MAX_NUM_LEVELS: ceil(log2(16384)) + 1, the levels of 16384 positions.
N_LEVELS = 15


def _log_arange(key, shape, dtype=jnp.float32):
  """``A_log = log(1, 2, ..., H)``: fla's log-linear Mamba-2 (not Mamba-2's
  uniform draw)."""
  del key
  return jnp.log(jnp.arange(1, shape[0] + 1, dtype=jnp.float32)).astype(dtype)


class LogLinearMamba2(Mamba2):
  """The log-linear Mamba-2 block (fla's ``LogLinearMamba2``).

  Initialisation as fla's: ``A_log = log(1..H)``, ``L_param = 1`` (``[H,
  L]``), ``D = 1``, ``dt_bias`` the inverse softplus of a log-uniform time
  step in ``[dt_min, dt_max]`` (floored at ``dt_init_floor``), the norm's
  scale 1; projections and the convolution as in ``Mamba2``. Defaults as
  fla's ``LogLinearMamba2Config`` (a ``Mamba2Config``): ``d_state = 128``,
  no projection biases, a convolution bias, gated RMSNorm ``norm(y *
  silu(z))`` per group.

  Args:
    d_model, n_heads, d_state, d_conv, expand, n_groups, dt_min, dt_max,
    dt_init_floor, conv_bias, bias, norm_eps, head_dim, chunk_size, impl:
      as in ``Mamba2``.
    n_levels: ``L``, the Fenwick levels per head (15, fla's: every
      position of a 16384-token document in its own bucket). Positions from
      ``2^(L-1)`` on share the top level with the buckets above it; a cache
      for more than ``2^(L-1)`` tokens is refused.

  Cache: ``{"conv": [B, d_conv - 1, E + 2 G N], "ssm": [B, H, L_c, N, P]
  float32, "offset": [B] int32}``: ``L_c = bits(max_len - 1) + 1 <= L``
  levels, as many as ``max_len`` positions fill (``cache_levels``; the
  state grows as ``log T``, and ``state_size(T)`` counts ``L_c`` levels),
  and ``offset`` the position in its document of the next token (which
  says which levels merge before it enters).
  """

  no_weight_decay = ("A_log", "dt_bias", "D", "L")

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               d_state: int = 128, d_conv: int = 4, expand: float = 2,
               n_groups: int = 1, n_levels: int = N_LEVELS,
               dt_min: float = 1e-3, dt_max: float = 1e-1,
               dt_init_floor: float = 1e-4, conv_bias: bool = True,
               bias: bool = False, norm_eps: float = 1e-5,
               head_dim: int | None = None, chunk_size: int | None = None,
               impl: str = "auto", dtype=jnp.float32,
               param_dtype=jnp.float32):
    checks.positive_int("n_levels", n_levels)
    super().__init__(d_model, n_heads, rngs=rngs, d_state=d_state,
                     d_conv=d_conv, expand=expand, n_groups=n_groups,
                     dt_min=dt_min, dt_max=dt_max,
                     dt_init_floor=dt_init_floor, conv_bias=conv_bias,
                     bias=bias, norm_eps=norm_eps, head_dim=head_dim,
                     chunk_size=chunk_size, impl=impl, dtype=dtype,
                     param_dtype=param_dtype)
    self.n_levels = n_levels
    width, h = self.width, self.n_heads
    conv_width = width + 2 * n_groups * d_state
    self.in_proj = modules.dense(
        d_model, width + conv_width + h + h * n_levels, use_bias=bias,
        rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.A_log = modules.param(rngs, _log_arange, (h,), ("heads",),
                               param_dtype)
    self.L = modules.param(rngs, nnx.initializers.ones_init(),
                           (h, n_levels), ("heads", None), param_dtype)

  def cache_levels(self, max_len: int) -> int:
    """Levels of a cache for ``max_len`` tokens: ``bits(max_len - 1) +
    1``, every position below ``max_len`` in its own bucket."""
    checks.positive_int("max_len", max_len)
    levels = (max_len - 1).bit_length() + 1
    if levels > self.n_levels:
      raise ValueError(
          f"max_len = {max_len} needs {levels} Fenwick levels, more than the "
          f"n_levels = {self.n_levels} of this layer (they hold "
          f"{2 ** (self.n_levels - 1)} positions); raise n_levels")
    return levels

  def init_mixer_cache(self, batch_size, max_len, dtype):
    del dtype
    return {"conv": self.conv.init_state(batch_size),
            "ssm": jnp.zeros((batch_size, self.n_heads,
                              self.cache_levels(max_len), self.d_state,
                              self.head_dim), jnp.float32),
            "offset": jnp.zeros((batch_size,), jnp.int32)}

  def recurrent_state_floats(self, seq_len):
    """``H x N x P`` per level of a cache for ``seq_len`` tokens:
    ``min(L, bits(seq_len - 1) + 1)`` levels, O(log T)."""
    levels = min(self.n_levels, (seq_len - 1).bit_length() + 1)
    return levels * self.n_heads * self.d_state * self.head_dim

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    e, h, g, n = self.width, self.n_heads, self.n_groups, self.d_state
    cache = ctx.cache
    z, xs, B, C, dt, dl = self.in_proj.parts(
        x, [e, 2 * e, 2 * e + g * n, 2 * e + 2 * g * n,
            2 * e + 2 * g * n + h])                  # [B, T, E|E|GN|GN|H|HL]
    (xs, B, C), conv_state = self.conv.parts(
        [xs, B, C], ctx, None if cache is None else cache["conv"])
    xs = xs.reshape(b, t, h, self.head_dim)                     # [B, T, H, P]
    B = jnp.repeat(B.reshape(b, t, g, n), h // g, axis=2)       # [B, T, H, N]
    C = jnp.repeat(C.reshape(b, t, g, n), h // g, axis=2)       # [B, T, H, N]
    f32 = jnp.float32
    step = jax.nn.softplus(dt.astype(f32)
                           + self.dt_bias[...].astype(f32))     # [B, T, H]
    A = -jnp.exp(self.A_log[...].astype(f32))                   # [H]
    lam = jax.nn.softplus(
        self.L[...].astype(f32)
        * dl.reshape(b, t, h, self.n_levels).astype(f32))       # [B, T, H, L]
    v = (xs * step[..., None].astype(xs.dtype))                 # [B, T, H, P]
    if cache is None:
      offset = 0
    else:
      # The cache's levels (``cache_levels``): no position of its tokens
      # reaches the others.
      lam = lam[..., :cache["ssm"].shape[2]]
      offset = cache["offset"]
      if ctx.restart is not None:
        offset = jnp.where(ctx.restart, 0, offset)
    # o_t = sum_l lambda_t^(l) S_l^T C_t over the Fenwick levels S_l of
    # exp(dt A)-decayed B_s (x_s dt_s)^T, then y = o + D x.
    o, state = self.apply_forms(
        ctx, LOG_LINEAR_FORMS,
        dict(q=C, k=B, v=v, g=step * A, level_scales=lam),
        None if cache is None else cache["ssm"], scale=1.0, offset=offset)
    y = o + self.D[...].astype(o.dtype)[:, None] * xs           # [B, T, H, P]
    y = y.reshape(b, t, g, e // g)                              # [B, T, G, E/G]
    y = self.out_proj(self.norm(y, z))
    if cache is None:
      return y, None
    following = positions(ctx.segment_ids, offset, b, t)[:, -1] + 1
    return y, {"conv": conv_state, "ssm": state, "offset": following}
