"""Lightning attention as MiniMax-01 runs it (MiniMax 2025, "MiniMax-01:
Scaling Foundation Models with Lightning Attention", arXiv:2501.08313;
transformers' ``MiniMaxLightningAttention``).

Linear attention with a fixed decay per head, the ``simple_gla`` core with
``g_gamma``::

    q, k, v = silu(x W_qkv)                 per head [K] each
    S_t = exp(-s_h) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t   (no 1/sqrt(K))
    y = (rms_norm(o) * sigmoid(x W_g)) W_o

The RMSNorm runs over all ``H K`` channels at once (one scale ``[H K]``),
not per head. The decay rates are Lightning attention's ALiBi-like slopes,
smaller in deeper layers: for head ``h`` (from 0) of layer ``l`` of ``L``,

    s_h = b^(h + 1) * (1 - l / (L - 1 + 1e-5) + 1e-5),   b = 2^(-8 / H)

fixed by the layer's place, not learned. The cache is the state ``[B, H,
K, K]`` float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, MatrixStateMixer, OpForms
from lin_attn_jax.layers.base import checked_impl
from lin_attn_jax.ops import (chunk_simple_gla, parallel_simple_gla,
                              recurrent_simple_gla, simple_gla_step)
from lin_attn_jax.ops.common import checks

SIMPLE_GLA_FORMS = OpForms(chunk_simple_gla, parallel_simple_gla,
                           recurrent_simple_gla, simple_gla_step)


def lightning_slopes(n_heads: int, layer_index: int,
                     n_layers: int) -> np.ndarray:
  """``[H]`` float32, the decay rates ``s_h`` of the module docstring (as
  transformers computes them, in float32)."""
  base = 1 / (2 ** (8 / n_heads))
  rate = np.float32(base) ** np.arange(1, n_heads + 1, dtype=np.float32)
  factor = 1 - layer_index / (n_layers - 1 + 1e-5) + 1e-5
  return (rate * np.float32(factor)).astype(np.float32)


class LightningAttention(MatrixStateMixer):
  """MiniMax's lightning attention layer (see the module docstring).

  Args:
    d_model: ``D``. n_heads: ``H``.
    head_dim: ``K``, the width of each head's q, k and v (None: ``D / H``).
    layer_index, n_layers: the layer's place, which sets its decay rates
      (the LM passes both).
    norm_eps: the output RMSNorm's epsilon (1e-6, transformers' default:
      MiniMax builds this norm without the config's epsilon).
    chunk_size: chunk length of the chunk form (speed only; None: the
      backend's default, ``base.resolved_chunk_size``).
    impl: ``"auto"``, ``"xla"`` or ``"pallas"``: the chunk form's
      implementation.

  Parameters against transformers' (a kernel is the transpose of a
  ``Linear`` weight): ``qkv_proj.kernel [D, 3 H K]``: ``qkv_proj.weight``
  (per head ``K`` query, then key, then value rows); ``output_gate.kernel
  [D, H K]``: ``output_gate.weight``; ``norm.scale [H K]``:
  ``norm.weight``; ``out_proj.kernel [H K, D]``: ``out_proj.weight``. No
  biases. Projections start LeCun normal, the norm at one.
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               head_dim: int | None = None, layer_index: int = 0,
               n_layers: int = 1, norm_eps: float = 1e-6,
               chunk_size: int | None = None, impl: str = "auto",
               dtype=jnp.float32, param_dtype=jnp.float32):
    checks.positive_int("d_model", d_model)
    checks.positive_int("n_heads", n_heads)
    checks.positive_int("n_layers", n_layers)
    checks.positive_int("head_dim", head_dim, allow_none=True)
    if head_dim is None and d_model % n_heads:
      raise ValueError(f"d_model = {d_model} must divide into n_heads = "
                       f"{n_heads} (or give head_dim)")
    if not 0 <= layer_index < n_layers:
      raise ValueError(f"layer_index must be in [0, n_layers = {n_layers}), "
                       f"got {layer_index}")
    self.n_heads = n_heads
    self.head_k = self.head_v = head_dim or d_model // n_heads
    self.chunk_size = chunk_size
    self.impl = checked_impl(impl)
    self.slopes = tuple(float(s) for s in lightning_slopes(
        n_heads, layer_index, n_layers))
    width = n_heads * self.head_k
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = modules.dense(d_model, 3 * width, **kw)
    self.output_gate = modules.dense(d_model, width, **kw)
    self.norm = modules.rms_norm(width, axis_name="heads", eps=norm_eps,
                                 **kw)
    self.out_proj = modules.dense(width, d_model, ("heads", "embed"), **kw)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, k = self.n_heads, self.head_k
    qkv = jax.nn.silu(self.qkv_proj(x)).reshape(b, t, h, 3 * k)
    q, key, v = jnp.split(qkv, 3, axis=-1)                      # [B, T, H, K]
    # S_t = exp(-s_h) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t
    g_gamma = -jnp.asarray(self.slopes, jnp.float32)            # [H]
    o, state = self.apply_forms(ctx, SIMPLE_GLA_FORMS,
                                dict(q=q, k=key, v=v), ctx.cache,
                                g_gamma=g_gamma, scale=1.0)     # [B, T, H, K]
    o = self.norm(o.reshape(b, t, h * k))                       # [B, T, H K]
    gate = jax.nn.sigmoid(self.output_gate(x).astype(jnp.float32))
    return self.out_proj((gate * o.astype(jnp.float32)).astype(o.dtype)), state
