"""``Mixer.state_size``: closed forms of a few mixers, and for every causal
mixer the count with convolution buffers equals the floats of its cache."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS

D, H, T = 32, 2, 80
# Windows shorter than T, so that every cache is full at T.
OPTIONS = {"sliding_window_attn": {"window_size": 16},
           "based": {"window_size": 16}}


def build(name, d_model=D, n_heads=H, **options):
  options = {**OPTIONS.get(name, {}), **options}
  return nnx.eval_shape(
      lambda: MIXERS[name](d_model, n_heads, rngs=nnx.Rngs(0), **options))


def cache_floats(mixer, seq_len):
  """Floats of the cache of one sequence (KV caches' int bookkeeping left
  out)."""
  cache = jax.eval_shape(lambda: mixer.init_mixer_cache(1, seq_len,
                                                        jnp.float32))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(cache)
             if jnp.issubdtype(leaf.dtype, jnp.floating))


@pytest.mark.parametrize("name", sorted(n for n, cls in MIXERS.items()
                                        if cls.causal))
def test_state_with_conv_is_the_cache(name):
  mixer = build(name)
  assert mixer.state_size(T, include_conv=True) == cache_floats(mixer, T)
  assert 0 < mixer.state_size(T) <= mixer.state_size(T, include_conv=True)


# The mixers with the ``use_short_conv`` option (fla's names and defaults).
SHORT_CONV = ("based", "deltanet", "forgetting_attn", "gated_deltanet", "gla",
              "hgrn2", "kda", "linear_attn", "retnet", "gdn2",
              "gated_deltaproduct", "comba")


@pytest.mark.parametrize("name", SHORT_CONV)
def test_short_conv_windows_are_counted(name):
  """With ``use_short_conv`` the cache holds the three windows, ``(W - 1)
  (C_q + C_k + C_v)`` floats, counted by ``include_conv`` alone; without it
  (and without other buffers) both counts are the state."""
  on = build(name, use_short_conv=True, conv_size=3, conv_bias=True)
  off = build(name, use_short_conv=False)
  assert on.state_size(T, include_conv=True) == cache_floats(on, T)
  assert off.state_size(T, include_conv=True) == cache_floats(off, T)
  assert on.state_size(T) == off.state_size(T)
  channels = sum(c.channels for c in (on.short_conv.q_conv,
                                      on.short_conv.k_conv,
                                      on.short_conv.v_conv))
  assert on.state_size(T, include_conv=True) - on.state_size(T) == \
      2 * channels
  assert off.state_size(T, include_conv=True) == off.state_size(T)
  assert off.short_conv is None
  assert on.short_conv.q_conv.bias is not None


def test_closed_forms():
  # Gated DeltaNet: H x K x V, K = 0.75 D / H, V = 1.5 D / H.
  assert build("gated_deltanet").state_size(T) == H * (3 * D // 8) * (3 * D // 4)
  assert build("deltanet").state_size(T) == H * (D // H) ** 2
  # Full attention: keys and values of every token, 2 x T x D.
  attention = build("softmax_attn")
  assert attention.state_size(T) == 2 * T * D
  assert attention.state_size(7) == 2 * 7 * D
  assert build("softmax_attn", n_heads=4, n_kv_heads=1).state_size(T) == \
      2 * T * D // 4
  # MoBA: the KV cache and the key sums of T // C blocks and of the
  # current one.
  assert build("moba", block_size=16).state_size(T) == (2 * T + 5 + 1) * D
  # A window keeps min(w, T) tokens.
  window = build("sliding_window_attn")
  assert window.state_size(T) == 2 * 16 * D
  assert window.state_size(10) == 2 * 10 * D
  # GLA: H x (D / 2H) x (D / H); Mamba: E x N = 2 D x 16.
  assert build("gla").state_size(T) == H * (D // (2 * H)) * (D // H)
  assert build("mamba").state_size(T) == 2 * D * 16
  assert build("mamba2", d_state=8).state_size(T) == 8 * 2 * D
  # Linear attention carries a normalizer column: H x K x (V + 1).
  assert build("linear_attn").state_size(T) == H * (D // H) * (D // H + 1)
  # H3: S4D on every entry of each head's d_h x d_h outer product; heads
  # of one channel by default (D x d_state), D / H channels with
  # head_dim=None.
  assert build("h3", d_state=4).state_size(T) == D * 4
  assert build("h3", d_state=4, head_dim=None).state_size(T) == \
      D * (D // H) * 4
  assert build("h3", d_state=4, head_dim=2).state_size(T) == D * 2 * 4
  # RWKV-6: H x K x V, K = V = D / H.
  assert build("rwkv6").state_size(T) == H * (D // H) ** 2
  # Based: Taylor features 1 + F + F^2 with the normalizer, plus the window.
  based = build("based", feature_dim=4)
  assert based.state_size(T) == H * 21 * (D // H + 1) + 2 * 16 * D


def test_conv_buffers_only_with_include_conv():
  deltanet = build("deltanet", conv_size=4)
  assert deltanet.state_size(T, include_conv=True) - deltanet.state_size(T) \
      == 3 * 3 * D
  rwkv = build("rwkv6")
  assert rwkv.state_size(T, include_conv=True) - rwkv.state_size(T) == D


def test_bad_arguments():
  with pytest.raises(ValueError, match="not causal"):
    build("linformer").state_size(T)
  for bad in (0, 2.5, True):
    with pytest.raises(ValueError, match="seq_len"):
      build("gla").state_size(bad)
