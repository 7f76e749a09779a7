"""The causal convolution over the whole sequence, with its own gradient."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.common.reductions import column_sum
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.conv.convolutions import final_window, initial_window
from lin_attn_jax.ops.conv.inputs import ACTIVATIONS, validate

_F32 = jnp.float32


def _masked_taps(padded, doc_padded, length):
  """``[taps]`` of ``[B, L, D]``: entry ``t`` of tap ``w`` is ``padded[t +
  w]``, zero where it is not in the document of output ``t``."""
  taps = padded.shape[1] - length + 1
  if doc_padded is None:
    return [padded[:, w:w + length] for w in range(taps)]
  doc_out = doc_padded[:, taps - 1:]                            # [B, L]
  return [jnp.where((doc_padded[:, w:w + length] == doc_out)[..., None],
                    padded[:, w:w + length], 0.0) for w in range(taps)]


def _pre_activation(padded, doc_padded, weight, bias):
  taps = weight.shape[1]
  length = padded.shape[1] - taps + 1
  y = sum(tap * weight[:, w]
          for w, tap in enumerate(_masked_taps(padded, doc_padded, length)))
  return y if bias is None else y + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _conv_act(padded, doc_padded, weight, bias, activation):
  """``act(sum_w weight[:, w] * masked tap w + bias)``, ``[B, L, D]``.

  The gradient is written out: the cotangent before the activation is made
  once (autodiff lets XLA recompute it, and the taps it comes from, inside
  every reduction for the weight), and the weight and bias gradients are
  ``column_sum``s, which XLA:CPU fuses with their products.
  """
  return ACTIVATIONS[activation](_pre_activation(padded, doc_padded, weight,
                                                 bias))


def _conv_act_fwd(padded, doc_padded, weight, bias, activation):
  return (_conv_act(padded, doc_padded, weight, bias, activation),
          (padded, doc_padded, weight, bias))


def _conv_act_bwd(activation, res, g):
  padded, doc_padded, weight, bias = res
  taps = weight.shape[1]
  length = padded.shape[1] - taps + 1
  if activation is None:
    g_pre = g
  else:                                 # every other activation is SiLU
    pre = _pre_activation(padded, doc_padded, weight, bias)
    # silu'(x) = s (1 + x (1 - s)), s = 1 / (1 + exp(-x)), with the
    # division last: XLA then stores this cotangent rather than recompute
    # it (and the taps) inside each of its consumers.
    exp_neg = jnp.exp(-pre)
    sig = 1.0 / (1.0 + exp_neg)
    g_pre = g * (1.0 + pre * (1.0 - sig)) / (1.0 + exp_neg)     # [B, L, D]
  masked = _masked_taps(padded, doc_padded, length)
  d_weight = jnp.stack([column_sum(tap * g_pre) for tap in masked], axis=1)
  d_bias = None if bias is None else column_sum(g_pre).astype(bias.dtype)
  # Output t reads padded[t + w] through tap w (when in its document).
  if doc_padded is not None:
    doc_out = doc_padded[:, taps - 1:]
  d_padded = jnp.zeros(padded.shape, _F32)
  for w in range(taps):
    term = g_pre * weight[:, w]
    if doc_padded is not None:
      term = jnp.where((doc_padded[:, w:w + length] == doc_out)[..., None],
                       term, 0.0)
    d_padded = d_padded + jnp.pad(term, ((0, 0), (w, taps - 1 - w), (0, 0)))
  d_doc = (None if doc_padded is None
           else np.zeros(doc_padded.shape, jax.dtypes.float0))
  return d_padded, d_doc, d_weight.astype(weight.dtype), d_bias


_conv_act.defvjp(_conv_act_fwd, _conv_act_bwd)


def parallel_causal_conv1d(x, weight, bias=None, *, activation=None,
                           initial_state=None, output_final_state=False,
                           segment_ids=None):
  """All positions at once: one shifted, document-masked copy per tap.

  Shapes as in ``chunk_causal_conv1d``.
  """
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  window = initial_window(initial_state, batch, taps, channels)
  padded = jnp.concatenate([window, jnp.asarray(x, _F32)], axis=1)
  doc_padded = (None if segment_ids is None else jnp.pad(
      document_index(segment_ids, batch, length), ((0, 0), (taps - 1, 0))))
  y = _conv_act(padded, doc_padded, jnp.asarray(weight, _F32),
                None if bias is None else jnp.asarray(bias, _F32), activation)
  final = None
  if output_final_state:
    final = final_window(padded, (jnp.zeros(padded.shape[:2], jnp.int32)
                         if doc_padded is None else doc_padded), taps)
  return y.astype(x.dtype), final
