"""Linformer has no decoding step: ``linformer_attn_step`` raises."""

from __future__ import annotations

from lin_attn_jax.ops.linformer.naive import NOT_CAUSAL


def linformer_attn_step(*args, **kwargs):
  """Not available: Linformer cannot decode with a cache.

  Raises:
    ValueError, always: the projected keys and values of step ``t`` would
    need the tokens after ``t``.
  """
  del args, kwargs
  raise ValueError(
      "Linformer has no decoding step or KV cache: its projected keys E K "
      "and values F V are sums over all T positions, so they are not known "
      "until the whole sequence is; a token-by-token cache would need the "
      "future tokens. " + NOT_CAUSAL.split(": ", 1)[0] + " either.")
