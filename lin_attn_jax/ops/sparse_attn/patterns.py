"""The factorised patterns of the Sparse Transformer, as position rules.

Child et al. 2019, "Generating Long Sequences with Sparse Transformers"
(https://arxiv.org/abs/1904.10509), with stride ``l``:

- strided: ``A1(i) = {j : i - j < l}`` (the previous ``l`` positions) and
  ``A2(i) = {j : (i - j) mod l = 0}`` (every ``l``-th position before);
- fixed: ``A1(i) = {j : floor(j / l) = floor(i / l)}`` (the query's own
  block of ``l``) and ``A2(i) = {j : j mod l >= l - c}`` (the last ``c``
  "summary" positions of every block).

Attention here is over the union ``A1 ∪ A2`` (the paper's merged head),
intersected with causality (``j <= i``) unless ``causal=False``, where
``A1`` of the strided pattern becomes ``|i - j| < l``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.softmax_attn import masks

PATTERNS = ("strided", "fixed")

# Rule ids of the blockwise passes.
LOCAL = 0      # strided A1, in sequence order
STRIDE = 1     # strided A2 outside A1, in residue-major order
BLOCK = 2      # fixed A1
SUMMARY = 3    # fixed A2 outside the query's own block (gathered summary keys)


def check_pattern(pattern, stride, summary_size) -> None:
  if pattern not in PATTERNS:
    raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
  if (isinstance(stride, bool) or not isinstance(stride, (int, np.integer))
      or stride < 1):
    raise ValueError(f"stride must be an integer >= 1, got {stride!r}")
  if pattern == "fixed" and (
      isinstance(summary_size, bool)
      or not isinstance(summary_size, (int, np.integer))
      or not 1 <= summary_size <= stride):
    raise ValueError(f"summary_size must be an integer in [1, stride] = "
                     f"[1, {stride}] for the fixed pattern, got "
                     f"{summary_size!r}")


def is_summary(j, stride: int, summary_size: int):
  return (j % stride) >= stride - summary_size


def pattern_mask(i, j, *, pattern, stride, summary_size, causal):
  """``A1 ∪ A2`` and causality on broadcastable position arrays."""
  ok = masks.causal_mask(i, j, causal)
  if pattern == "strided":
    local = masks.window_mask(i, j, stride, causal)
    return ok & (local | ((i - j) % stride == 0))
  same_block = (i // stride) == (j // stride)
  return ok & (same_block | is_summary(j, stride, summary_size))


def sparse_attn_mask(length: int, *, pattern: str, stride: int,
                     summary_size: int = 1, causal: bool = True) -> np.ndarray:
  """The dense ``[T, T]`` bool mask of a pattern (for references and plots)."""
  check_pattern(pattern, stride, summary_size)
  pos = np.arange(length)
  return pattern_mask(pos[:, None], pos[None, :], pattern=pattern,
                      stride=stride, summary_size=summary_size, causal=causal)


class SparseRule:
  """The rule ids above as one callable ``(i, j, rule_id) -> bool``.

  Each allowed pair is counted by one rule: strided LOCAL counts ``A1`` and
  STRIDE counts ``A2`` outside ``A1``; fixed BLOCK counts ``A1`` and SUMMARY
  the summary keys of other blocks.
  """

  def __init__(self, *, stride: int, summary_size: int, causal: bool):
    self.stride = stride
    self.summary_size = summary_size
    self.causal = causal

  def __call__(self, i, j, rule_id):
    ok = masks.causal_mask(i, j, self.causal)
    local = masks.window_mask(i, j, self.stride, self.causal)
    stride = ~local & ((i - j) % self.stride == 0)
    block = (i // self.stride) == (j // self.stride)
    summary = ~block & is_summary(j, self.stride, self.summary_size)
    return ok & jnp.select(
        [rule_id == LOCAL, rule_id == STRIDE, rule_id == BLOCK],
        [local, stride, block], summary)
