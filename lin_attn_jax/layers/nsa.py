"""Native sparse attention (Yuan et al., 2025, arXiv:2502.11089), as
flash-linear-attention's ``NativeSparseAttention`` layer.

``q = x W_q`` with ``H`` heads, ``k = x W_k`` and ``v = x W_v`` with
``Hkv`` heads of width ``head_dim``, RoPE on ``q`` and ``k`` at absolute
positions, three gates per query head ``g = sigmoid(x W_g)`` (``W_g: [D, H
x 3]``, ordered compressed, selected, window within each head), ``o =
g_cmp o_cmp + g_slc o_slc + g_swa o_swa`` (``ops.parallel_nsa``) and ``y =
o W_o``. Projections start LeCun normal; fla's layer has no
initialisation of its own (its model's ``_init_weights`` draws every
linear from ``N(0, 0.02^2)``, which ``convert`` loads as it is).

The forms of every mode:

- no cache, ``"chunk"``: the blockwise op (never ``[T, T]``);
- no cache, ``"parallel"``: the dense reference op;
- ``"recurrent"``: a ``lax.scan`` of one-token steps over a fresh cache
  (or over the given one);
- with a cache, ``T > 1`` in ``"chunk"`` or ``"parallel"``: ``nsa_extend``
  (the new tokens see the cache and each other); ``T = 1``: one step.

The cache is an ``NSACache``: every key and value (``max_len`` entries),
the compressed blocks, and the window branch's ring buffer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lin_attn_jax.layers import modules
from lin_attn_jax.layers.base import Context, Mixer, OpForms
from lin_attn_jax.layers.softmax import head_layout, scan_steps
from lin_attn_jax.ops import (chunk_nsa, init_nsa_cache, nsa_extend, nsa_step,
                              parallel_nsa)
from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.nsa.inputs import check_options

GATES = ("g_cmp", "g_slc", "g_swa")


def _without_state(op):
  """``op`` (a sequence form returning ``o``) as a form of ``OpForms``."""
  def form(*, initial_state=None, output_final_state=False, **inputs):
    del initial_state, output_final_state
    return op(**inputs), None
  return form


def token_by_token(tokens, cache, *, block_counts, segment_ids=None,
                   restart=None):
  """``nsa_step`` scanned over T from ``cache``; a token resets where its
  document starts (``restart``: ``[B]``, the first token's). Returns ``(o
  [B, T, H, V], cache)``."""
  return scan_steps(
      lambda cache, reset, **token: nsa_step(
          **token, cache=cache, block_counts=block_counts, reset=reset),
      tokens, cache, segment_ids, restart)


def _recurrent(*, initial_state=None, output_final_state=False,
               segment_ids=None, block_size, block_counts, window_size,
               **tokens):
  """The recurrent form of ``OpForms``: steps over a fresh cache."""
  del initial_state, output_final_state
  k, v = tokens["k"], tokens["v"]
  cache = init_nsa_cache(k.shape[0], k.shape[2], k.shape[3], v.shape[3],
                         max_length=k.shape[1], block_size=block_size,
                         window_size=window_size, dtype=k.dtype)
  return token_by_token(tokens, cache, block_counts=block_counts,
                        segment_ids=segment_ids)[0], None


def _step(*, state, reset=None, block_size, block_counts, window_size,
          **token):
  del block_size, window_size
  return nsa_step(**token, cache=state, block_counts=block_counts,
                  reset=reset)


NSA_FORMS = OpForms(chunk=_without_state(chunk_nsa),
                    parallel=_without_state(parallel_nsa),
                    recurrent=_recurrent, step=_step)


class NativeSparseAttention(Mixer):
  """Native sparse attention with grouped key/value heads and RoPE.

  Args:
    d_model: ``D``. n_heads: ``H``.
    n_kv_heads: ``Hkv``, a divisor of ``H``; None for ``H`` (fla's default
      is 4 of 64 query heads; its kernels want groups of 16 or more, the ops
      here take any).
    head_dim: width of every head; None for ``D / H`` (fla's layer: 64,
      its model config: 32). Even, for RoPE.
    qkv_bias: biases on the q, k, v projections (False).
    block_size: ``l``, tokens per compressed and selected block (64).
    block_counts: ``n``, blocks selected per query (16, the first, previous
      and current among them).
    window_size: ``w`` of the sliding-window branch (512); None for no
      window branch (fla's 0).
    rope_base: base of the RoPE frequencies (10000).
    chunk_size: queries per chunk of the blockwise form (speed only; None
      for the op's default).
  """

  def __init__(self, d_model: int, n_heads: int, *, rngs: nnx.Rngs,
               n_kv_heads: int | None = None, head_dim: int | None = None,
               qkv_bias: bool = False, block_size: int = 64,
               block_counts: int = 16, window_size: int | None = 512,
               rope_base: float = 10000.0, chunk_size: int | None = None,
               dtype=jnp.float32, param_dtype=jnp.float32):
    if head_dim is None:
      self.n_kv_heads, self.head_dim = head_layout(d_model, n_heads,
                                                   n_kv_heads)
    else:
      checks.positive_int("head_dim", head_dim)
      self.n_kv_heads, _ = head_layout(n_heads, n_heads, n_kv_heads)
      self.head_dim = head_dim
    if self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
    check_options(block_size, block_counts, window_size)
    checks.positive_int("chunk_size", chunk_size, allow_none=True)
    self.n_heads, self.rope_base = n_heads, rope_base
    self.block_size, self.block_counts = block_size, block_counts
    self.window_size, self.chunk_size = window_size, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    q_dim = n_heads * self.head_dim
    kv_dim = self.n_kv_heads * self.head_dim
    self.q_proj = modules.dense(d_model, q_dim, use_bias=qkv_bias, **kw)
    self.k_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.v_proj = modules.dense(d_model, kv_dim, use_bias=qkv_bias, **kw)
    self.g_proj = modules.dense(d_model, 3 * n_heads, **kw)
    self.o_proj = modules.dense(q_dim, d_model, ("heads", "embed"), **kw)

  def chunk_options(self) -> dict:
    """The blockwise form's ``chunk_size``: the layer's, None for the op's
    own default (sized by the selected blocks, not by ``chunk_size``'s
    backend default)."""
    return {"chunk_size": self.chunk_size}

  def init_mixer_cache(self, batch_size, max_len, dtype):
    return init_nsa_cache(batch_size, self.n_kv_heads, self.head_dim,
                          self.head_dim, max_length=max_len,
                          block_size=self.block_size,
                          window_size=self.window_size, dtype=dtype)

  def recurrent_state_floats(self, seq_len):
    """Keys and values of every token, of the complete blocks, and of the
    window's ring buffer: ``2 (T + T // l + min(w, T)) Hkv head_dim``."""
    entries = seq_len + seq_len // self.block_size
    if self.window_size is not None:
      entries += min(seq_len, self.window_size)
    return 2 * entries * self.n_kv_heads * self.head_dim

  def with_cache(self, ctx: Context, tokens: dict):
    """The op of ``ctx``'s mode with ``ctx.cache``: ``(o, new cache)``."""
    if ctx.decoding:
      o, cache = nsa_step(**{n: None if x is None else x[:, 0]
                             for n, x in tokens.items()},
                          cache=ctx.cache, block_counts=self.block_counts,
                          reset=ctx.restart)
      return o[:, None], cache
    if ctx.mode == "recurrent":
      return token_by_token(tokens, ctx.cache,
                            block_counts=self.block_counts,
                            segment_ids=ctx.segment_ids, restart=ctx.restart)
    return nsa_extend(**tokens, cache=ctx.cache,
                      block_counts=self.block_counts,
                      segment_ids=ctx.segment_ids, reset=ctx.restart,
                      chunk_size=self.chunk_size)

  def mix(self, x, ctx: Context):
    b, t, _ = x.shape
    h, hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
    q = self.q_proj(x).reshape(b, t, h, hd)                     # [B, T, H, K]
    k = self.k_proj(x).reshape(b, t, hkv, hd)                   # [B, T, Hkv, K]
    v = self.v_proj(x).reshape(b, t, hkv, hd)                   # [B, T, Hkv, V]
    gates = jax.nn.sigmoid(self.g_proj(x).reshape(b, t, h, 3))  # [B, T, H, 3]
    q = modules.rotary(q, ctx.positions, self.rope_base)
    k = modules.rotary(k, ctx.positions, self.rope_base)
    tokens = dict(q=q, k=k, v=v, **{name: gates[..., i]
                                     for i, name in enumerate(GATES)})
    if self.window_size is None:
      tokens["g_swa"] = None
    # o = g_cmp o_cmp + g_slc o_slc + g_swa o_swa
    if ctx.cache is None:
      o, cache = self.apply_forms(ctx, NSA_FORMS, tokens,
                                  block_size=self.block_size,
                                  block_counts=self.block_counts,
                                  window_size=self.window_size)
    else:
      o, cache = self.with_cache(ctx, tokens)
    y = self.o_proj(o.reshape(b, t, h * hd))                    # [B, T, D]
    return y, cache
