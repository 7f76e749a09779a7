"""The short causal convolution and token shift split over a ``sequence``
mesh axis.

A convolution of ``W`` taps reads the ``W - 1`` inputs before each token,
so each device needs only the last ``W - 1`` inputs of the previous device
(one ``ppermute`` of ``[B, W - 1, D]``, with their segment ids), kept where
they belong to the document of the device's first token; device 0 starts
from ``initial_state``. Token shift is the one-tap case. The final state
(the last ``W - 1`` inputs) is the last device's, sent to every device by
one all-reduce.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.conv import chunk, convolutions, token_shift
from lin_attn_jax.ops.conv.inputs import validate


def _same_document_as_first(previous_ids, ids):
  """``[B, W - 1]``: the entries of the halo in the document of the device's
  first token (the run of its id at the end of the halo, unbroken)."""
  same = (previous_ids == ids[:, :1]).astype(jnp.int32)         # [B, W-1]
  return jnp.cumprod(same[:, ::-1], axis=1)[:, ::-1].astype(bool)


def context_parallel_causal_conv1d(x, weight, bias=None, *, activation=None,
                                   initial_state=None,
                                   output_final_state=False, segment_ids=None,
                                   chunk_size=64, axis_name=cp.SEQUENCE_AXIS,
                                   mesh=None):
  """``chunk_causal_conv1d`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_causal_conv1d``, plus ``axis_name``
  (T a multiple of its size ``P``, and ``T / P >= W - 1``: the halo comes
  from the previous device alone) and ``mesh`` (None for the current one).
  ``chunk_causal_conv1d`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  batch, length, channels, taps = validate(x, weight, bias, activation,
                                           initial_state, segment_ids)
  local = cp.local_length(length, cp.axis_size(axis_name, mesh), axis_name)
  if local < taps - 1:
    raise ValueError(f"a convolution of W = {taps} taps split over mesh axis "
                     f"{axis_name!r} takes the W - 1 = {taps - 1} inputs "
                     f"before each device's first token from the previous "
                     f"device alone, so T / P = {local} must be >= {taps - 1}")

  def device(split, whole):
    x, ids = split
    weight, bias, initial = whole
    window = convolutions.initial_window(initial, batch, taps, channels)
    if taps > 1:
      halo = cp.previous_tokens(x, taps - 1, axis_name).astype(jnp.float32)
      if ids is not None:
        keep = _same_document_as_first(
            cp.previous_tokens(ids, taps - 1, axis_name), ids)
        halo = jnp.where(keep[..., None], halo, 0.0)
      window = jnp.where(cp.first_device(axis_name), window, halo)
    y, final = chunk.chunk_causal_conv1d(
        x, weight, bias, activation=activation, initial_state=window,
        output_final_state=output_final_state, segment_ids=ids,
        chunk_size=chunk_size)
    return y, (None if final is None else cp.from_last_device(final,
                                                              axis_name))

  return cp.map_sequence(device, (x, segment_ids),
                         (weight, bias, initial_state), axis_name=axis_name,
                         mesh=mesh)


def context_parallel_token_shift(x, first=None, segment_ids=None, *,
                                 axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``token_shift`` with T split over the devices of ``axis_name``: each
  device's first entry is the last token of the previous device."""
  token_shift.check_shift(x, first, segment_ids)
  cp.local_length(x.shape[1], cp.axis_size(axis_name, mesh), axis_name)

  def device(split, whole):
    x, ids = split
    (first,) = whole
    start = jnp.zeros_like(x[:, :1]) if first is None else first[:, None]
    on_first = cp.first_device(axis_name)
    previous = jnp.where(on_first, start.astype(x.dtype),
                         cp.previous_tokens(x, 1, axis_name))
    starts = None
    if ids is not None:
      boundary = ((cp.previous_tokens(ids, 1, axis_name) != ids[:, :1])
                  & ~on_first)                                  # [B, 1]
      starts = jnp.concatenate([boundary, ids[:, 1:] != ids[:, :-1]], axis=1)
    return token_shift.shift_with(x, previous, starts), None

  return cp.map_sequence(device, (x, segment_ids), (first,),
                         axis_name=axis_name, mesh=mesh)[0]
