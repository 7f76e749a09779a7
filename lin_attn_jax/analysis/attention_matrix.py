r"""The token-mixing matrix of a causal mixer, from its own parallel form.

Every causal mixer of ``lin_attn_jax.layers.MIXERS`` mixes tokens through
one op (two for Based) whose output is linear in one of its inputs, the
*values*, for fixed other inputs (queries, keys, gates, step sizes). So
there is a matrix ``M`` with, per head (or per channel),

    o[b, i, h, c] = sum_j M[b, h, i, j] v[b, j, h, c]     (c any value channel)

and column ``j`` of ``M`` is the op's output for the unit value ``e_j`` (1 at
token ``j``, 0 elsewhere, in every channel). ``attention_matrix`` runs the
mixer in ``"parallel"`` mode, records the op calls made through
``Mixer.apply_forms`` (and the softmax layers' ``attend``), and runs each
recorded op again on the ``T`` unit values (a ``vmap``): the matrix is the
op's own arithmetic on the mixer's own inputs, nothing re-derived, and it is
exact up to float rounding. Segment ids reach the op as in the layer, so
``M[b, h, i, j] = 0`` across documents and for ``j > i``.

What the values and the matrix are, per family (``H`` is the leading axis
of the matrix):

- softmax attention (full, sliding window, sparse): ``v = x W_v``; ``M`` is
  ``softmax(q k^T / sqrt(K) + mask)`` after RoPE, one row per query head (a
  key/value head serves its group). Forgetting attention: the same with the
  decay bias, ``softmax(q k^T / sqrt(K) + D + mask)``, ``D_ij = sum_{j < l
  <= i} g_l`` (its ``attend`` takes the gates after ``ctx``).
- native sparse attention: ``v = x W_v``; ``M`` is the gated sum of its
  three branches' softmax weights (a compressed block's weight spread as
  ``1 / l`` over its ``l`` tokens), one row per query head.
- MoBA: ``v = x W_v``; ``M`` is the softmax over the keys of the blocks
  each query selected (its own, causally, and the ``top_k - 1`` of largest
  gate), after RoPE; the selection depends on ``q`` and ``k`` only.
- PaTH attention: ``v = x W_v``; ``M`` is ``softmax((z + c_i - c_j) /
  sqrt(K))`` with ``z`` the logits across the accumulated Householder
  transformations and ``c`` the cumulative forget gate (when the layer has
  one).
- linear attention, Performer, Based's Taylor branch: ``v = x W_v``; ``M =
  (phi(q) phi(k)^T) / (row sum + eps)`` with the layer's normalisation
  (none when the layer does not normalise).
- Based: ``M`` is the Taylor branch's plus the sliding-window softmax
  branch's, both applied to the same ``v``.
- RetNet, GLA, HGRN2: ``M[i, j] = q_i . (exp(G_i - G_j) * k_j)`` times the
  scale, with ``G`` the cumulative log decay (per head or per key channel).
- Mamba-2 (SSD): the values are the SSM input ``x`` per head; ``M[i, j] =
  C_i . B_j exp(sum_{j<m<=i} dt_m A) dt_j + D [i = j]``.
- DeltaNet, Gated DeltaNet, KDA: ``v = x W_v`` (per value head); ``M`` is the
  delta rule's lower-triangular matrix ``(Q K^T * decay) (I + A)^{-1} diag
  (beta)`` of the WY form, with the layers' L2-normalised ``q`` and ``k``.
  Gated DeltaNet-2: the same with its erase gate in ``A``; its values are
  the written values ``w * v`` (the write gate is per value channel, so
  ``M`` is a matrix only on them).
- RWKV-6: ``M[i, j] = r_i . (prod w * k_j)`` below the diagonal and ``r_i
  . (u * k_i)`` on it (the bonus). RWKV-7: the DPLR recurrence's matrix plus
  the layer's current-token term ``r_i . (u * k_i)`` on the diagonal; its
  values are ``v`` after the value residual.
- Mamba-1 (selective scan): per channel ``e`` of the inner width ``E``
  (``H = E``), values the SSM input ``u`` after the short convolution,
  ``M_e[i, j] = silu(z_i) (C_i . (exp(sum dt A_e) dt_j B_j) + D_e [i = j])``.
- RG-LRU: per channel of the recurrence width (``H = W``), values the
  recurrence input ``x``; ``M_e[i, j] = prod_{j<m<=i} a_m sqrt(1 - a_j^2)
  i_j`` (``i`` the input gate).
- H3: per channel ``(e, h)`` of the diagonal SSM (``H = E x heads``, ``e``
  major), values the product ``shift(k) * v`` the SSM reads; ``M`` is the
  S4D kernel's Toeplitz matrix plus ``D`` on the diagonal. The shift SSM
  acts on the keys, not the values, and is not part of ``M``.

- gated attention (Qwen3-Next): as softmax attention (the output gate acts
  after the op). MLA: ``v = c W_uv`` per head, ``M = softmax(q k^T *
  scale)`` with the expanded keys.
- LFM2's gated short convolution: per channel, values the gated input ``B
  * x``; ``M`` is the convolution's banded Toeplitz matrix of taps (no
  bias by default; with one the map is affine, not linear).

Linformer is not causal (its keys are projected over the whole sequence),
Gated DeltaProduct writes ``N`` values per token (one per Householder
step), and Falcon-H1's parallel mixer sums two ops with values of their
own, so none has one ``[T, T]`` matrix: ``attention_matrix`` raises
``ValueError`` for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.layers import (RWKV7, FalconH1Parallel, GatedDeltaNet2,
                                 GatedDeltaProduct)
from lin_attn_jax.layers.base import Mixer
from lin_attn_jax.ops.rwkv6.inputs import bonus as current_token_term

# Names of the value argument of an op's forms, in order of preference.
_VALUE_NAMES = ("v", "x", "u")


@dataclasses.dataclass(frozen=True)
class MixingCall:
  """One op call of a mixer's parallel mode.

  Attributes:
    values: ``[B', T, H, V]`` (per head) or ``[B', T, E]`` (per channel),
      the input the output is linear in; ``B'`` is ``B`` or ``B`` times a
      repeat (H3).
    output: the op's output on ``values``, ``[B', T, H, V]`` or ``[B', T,
      E]``.
    apply: ``values -> output``, the same op on other values (its other
      inputs fixed).
    tokens: the op's per-token inputs by argument name (``q``, ``k``, ...).
  """
  values: Any
  output: Any
  apply: Callable
  tokens: dict


def mixing_calls(mixer: Mixer, x, segment_ids=None) -> list[MixingCall]:
  """The op calls of ``mixer(x, segment_ids=..., mode="parallel")`` that mix
  its values: every call through ``apply_forms`` or ``attend`` whose values
  are those of the last call (Based's two branches share ``v``; H3's shift
  SSM, on the keys, is left out). The recording methods are set on the
  instance for the one call and removed after it; the class and the
  layers' code are untouched.

  Raises:
    ValueError: the mixer is not causal.
  """
  if not mixer.causal:
    raise ValueError(f"{type(mixer).__name__} is not causal: its keys mix "
                     "the whole sequence, so it has no causal token-mixing "
                     "matrix")
  if isinstance(mixer, FalconH1Parallel):
    raise ValueError("FalconH1Parallel sums two mixers with values of their "
                     "own (attention's v, Mamba-2's x): take the matrix of "
                     "mixer.self_attn or mixer.mamba on its input")
  if isinstance(mixer, GatedDeltaProduct):
    raise ValueError("GatedDeltaProduct writes N values per token (one per "
                     "Householder step): its mixing is [T, T N], not a "
                     "[T, T] token-mixing matrix")
  calls = []
  originals = {name: getattr(mixer, name)
               for name in ("apply_forms", "attend") if hasattr(mixer, name)}

  def recording_apply_forms(ctx, forms, tokens, state=None, **params):
    name = next(n for n in _VALUE_NAMES if n in tokens)
    run = originals["apply_forms"]

    def apply(values, **replaced):
      return run(ctx, forms, {**tokens, name: values, **replaced}, state,
                 **params)[0]

    out = run(ctx, forms, tokens, state, **params)
    calls.append(MixingCall(tokens[name], out[0], apply, tokens))
    return out

  def recording_attend(q, k, v, ctx, *gates):
    run = originals["attend"]
    out = run(q, k, v, ctx, *gates)
    calls.append(MixingCall(v, out,
                            lambda values: run(q, k, values, ctx, *gates),
                            dict(q=q, k=k, v=v)))
    return out

  overrides = {"apply_forms": recording_apply_forms,
               "attend": recording_attend}
  try:
    for name in originals:
      object.__setattr__(mixer, name, overrides[name])
    mixer(x, segment_ids=segment_ids, mode="parallel")
  finally:
    for name in originals:
      object.__delattr__(mixer, name)
  mixing = [c for c in calls if c.values is calls[-1].values]
  if isinstance(mixer, RWKV7):
    mixing = [_with_current_token(mixer, c) for c in mixing]
  if isinstance(mixer, GatedDeltaNet2):
    mixing = [_written_values(c) for c in mixing]
  return mixing


def _written_values(call: MixingCall) -> MixingCall:
  """Gated DeltaNet-2's op call on its written values ``w * v`` (the op run
  with ``w = 1``)."""
  w = call.tokens["w"]
  values = (w * call.values).astype(call.values.dtype)

  def apply(written):
    return call.apply(written, w=jnp.ones_like(w))

  return MixingCall(values, apply(values), apply, call.tokens)


def _with_current_token(mixer, call: MixingCall) -> MixingCall:
  """RWKV-7's op call plus its current-token term ``(r . (u * k)) v``."""
  r, k, bonus = call.tokens["r"], call.tokens["k"], mixer.bonus[...]

  def apply(values):
    return (call.apply(values).astype(jnp.float32)
            + current_token_term(r, k, values, bonus, 1.0))

  return MixingCall(call.values, apply(call.values), apply, call.tokens)


def _unit_values(values):
  """``[T, B', T, ...]``: for each ``j``, 1 at token ``j`` in every channel."""
  t = values.shape[1]
  eye = jnp.eye(t, dtype=values.dtype)                          # [J, T]
  eye = eye.reshape((t, 1, t) + (1,) * (values.ndim - 2))
  return jnp.broadcast_to(eye, (t,) + values.shape)


def call_matrix(call: MixingCall):
  """``[B', H, T, T]`` float32: ``call``'s output on every unit value."""
  columns = jax.vmap(call.apply)(_unit_values(call.values))  # [J, B', I, .]
  columns = jnp.asarray(columns, jnp.float32)
  if columns.ndim == 5:
    columns = columns[..., 0]                                   # [J, B', I, H]
  return jnp.transpose(columns, (1, 3, 2, 0))                   # [B', H, I, J]


def attention_matrix(mixer: Mixer, x, segment_ids=None):
  """The ``[B, H, T, T]`` token-mixing matrix ``M`` of ``mixer`` on ``x``.

  ``o[b, i, h, :] = sum_j M[b, h, i, j] v[b, j, h, :]`` is the output of the
  mixer's op (before the output projection and the gates and norms after
  it), with the values of the module docstring; ``H`` is the query heads, or
  the channels of a per-channel recurrence (Mamba-1, RG-LRU, H3).

  Args:
    mixer: a causal mixer of ``lin_attn_jax.layers``.
    x: ``[B, T, D]`` float, the mixer's input.
    segment_ids: ``[B, T]`` int or None; ``M`` is 0 across documents.

  Returns:
    ``[B, H, T, T]`` float32, 0 above the diagonal.

  Raises:
    ValueError: the mixer is not causal (Linformer).
  """
  b = x.shape[0]
  total = None
  for call in mixing_calls(mixer, x, segment_ids):
    m = call_matrix(call)                                       # [B', H, T, T]
    if m.shape[0] != b:                                         # H3: [B E, ...]
      m = m.reshape((b, -1) + m.shape[2:])                      # [B, E H, T, T]
    total = m if total is None else total + m
  return total


def mixing_output(mixer: Mixer, x, segment_ids=None):
  """``(values, output)``: the summed op output of ``mixing_calls`` and the
  values it mixes, each laid out ``[B, H, T, C]`` as ``attention_matrix``
  (``C`` the value channels; 1 for a per-channel recurrence), so that
  ``output == M @ values`` for the ``M`` of ``attention_matrix``.

  Key/value heads shared by a group of query heads are repeated to the
  query heads."""
  b = x.shape[0]
  calls = mixing_calls(mixer, x, segment_ids)
  output = sum(jnp.asarray(c.output, jnp.float32) for c in calls)

  def heads_first(a, heads):
    a = jnp.asarray(a, jnp.float32)
    if a.ndim == 3:                                             # [B', T, E]
      a = a[..., None]                                          # [B', T, E, 1]
    a = jnp.swapaxes(a, 1, 2)                                   # [B', H, T, C]
    if a.shape[1] != heads:
      a = jnp.repeat(a, heads // a.shape[1], axis=1)
    return a.reshape((b, -1) + a.shape[2:])

  out = heads_first(output, output.shape[-2] if output.ndim == 4
                    else output.shape[-1])
  vals = heads_first(calls[-1].values, calls[-1].output.shape[-2]
                     if calls[-1].output.ndim == 4
                     else calls[-1].output.shape[-1])
  return vals, out


def row_sparsity(matrix, *, min_keys: int = 2, diagonal: bool = True):
  """``S`` of every row of ``matrix [..., T, T]`` over its causal entries,
  ``S(a) = mean_j |a_j| / sqrt(mean_j a_j^2)`` for ``j <= i`` (``j < i``
  with ``diagonal=False``, which leaves out a skip term such as SSD's ``D``),
  as in ``experiments.attention_focus`` (1 for a uniform row, ``1 / sqrt(n)``
  for a one-hot row of ``n`` entries).

  Returns ``[..., T]`` float64, NaN for rows with fewer than ``min_keys``
  entries or all zero.
  """
  a = np.abs(np.asarray(matrix, np.float64))
  t = a.shape[-1]
  offset = 0 if diagonal else -1
  n = np.arange(1, t + 1, dtype=np.float64) + offset            # keys per row
  a = np.where(np.tril(np.ones((t, t), bool), offset), a, 0.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    s = (a.sum(-1) / n) / np.sqrt((a * a).sum(-1) / n)
  return np.where(n >= min_keys, s, np.nan)
