"""Griffin's Real-Gated Linear Recurrent Unit (RG-LRU), on the linear scan.

De et al. 2024, https://arxiv.org/abs/2402.19427, section 2.4:

    r_t = sigmoid(a_gate_t)                   recurrence gate
    i_t = sigmoid(x_gate_t)                   input gate
    log a_t = -c * r_t * softplus(a_param)    (a = sigmoid(-a_param) ** (c r_t))
    h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * (i_t * x_t)

``a_gate`` and ``x_gate`` are the gate pre-activations (``W_a x + b_a`` and
``W_x x + b_x``, computed by the layer); ``a_param`` is the per-channel
parameter ``Lambda`` up to sign, as in the reference implementation, and
``c = 8``. ``1 - a^2`` is computed as ``-expm1(2 log a)`` (exact when ``a``
is close to 1), and the square root has its derivative capped at
``MAX_SQRT_GRADIENT`` (it is infinite at 0). The paper's equation (4)
applies the normalisation at every token, and so do these forms by default;
at a document start only ``h_{t-1}`` is dropped. The reference
implementations (Google's ``recurrentgemma`` and HuggingFace's
RecurrentGemma) do not scale the first token of a document: every form
takes ``unscaled`` (``[B, T]`` bool, ``[B]`` for a step), True where
``sqrt(1 - a_t^2)`` is left out.

Letters: b batch, t time, d channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_scan_f32
from lin_attn_jax.ops.diagonal_ssm.inputs import (check_sequence, check_step,
                                                  check_vector, initial)
from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags

_F32 = jnp.float32
MAX_SQRT_GRADIENT = 1000.0


@jax.custom_jvp
def sqrt_bounded_derivative(x):
  """``sqrt(x)`` whose derivative is capped at ``MAX_SQRT_GRADIENT``."""
  return jnp.sqrt(x)


@sqrt_bounded_derivative.defjvp
def _sqrt_bounded_derivative_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  y = jnp.sqrt(x)
  return y, dx * (0.5 / jnp.maximum(y, 0.5 / MAX_SQRT_GRADIENT))


def _validate(x, a_gate, x_gate, a_param, state, boundaries, *, step,
              unscaled=None):
  """``boundaries`` is ``reset [B]`` for a step, ``segment_ids`` otherwise."""
  names = ("x", "a_gate", "x_gate")
  if step:
    batch, width = check_step(names, (x, a_gate, x_gate))
    checks.check_state("state", state, (batch, width), "[B, D]")
    checks.check_reset(boundaries, batch)
    lead = (batch,)
  else:
    batch, _, width = check_sequence(names, (x, a_gate, x_gate))
    checks.check_state("initial_state", state, (batch, width), "[B, D]")
    checks.check_segment_ids(boundaries, batch, x.shape[1])
    lead = (batch, x.shape[1])
  if unscaled is not None and tuple(jnp.shape(unscaled)) != lead:
    raise ValueError(f"unscaled must have shape {list(lead)} "
                     f"({'[B]' if step else '[B, T]'}), got "
                     f"{list(jnp.shape(unscaled))}")
  if a_param is None:
    raise ValueError("a_param must be given, shape [D]")
  check_vector("a_param", a_param, width)
  return batch, width


def rg_lru_coefficients(x, a_gate, x_gate, a_param, c=8.0, unscaled=None):
  """The linear scan's float32 ``(a, b)``, for any shape ``[..., D]``;
  ``unscaled: [...]`` bool marks tokens whose input is not normalised."""
  log_a = (-c * jax.nn.sigmoid(jnp.asarray(a_gate, _F32))
           * jax.nn.softplus(jnp.asarray(a_param, _F32)))
  multiplier = sqrt_bounded_derivative(-jnp.expm1(2.0 * log_a))
  if unscaled is not None:
    multiplier = jnp.where(jnp.asarray(unscaled)[..., None], 1.0, multiplier)
  gated_x = jax.nn.sigmoid(jnp.asarray(x_gate, _F32)) * jnp.asarray(x, _F32)
  return jnp.exp(log_a), multiplier * gated_x


def naive_recurrent_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0,
                           initial_state=None, output_final_state=False,
                           segment_ids=None, unscaled=None):
  """Reference recurrence, the gates computed token by token."""
  batch, width = _validate(x, a_gate, x_gate, a_param, initial_state,
                           segment_ids, step=False, unscaled=unscaled)
  softplus_param = jax.nn.softplus(jnp.asarray(a_param, _F32))
  reset = reset_flags(segment_ids, batch, x.shape[1])
  unscaled = (jnp.zeros_like(reset) if unscaled is None
              else jnp.asarray(unscaled, bool))

  def step(h, inputs):
    x_t, a_gate_t, x_gate_t, reset_t, unscaled_t = inputs
    h = jnp.where(reset_t[:, None], 0.0, h)
    log_a = -c * jax.nn.sigmoid(a_gate_t) * softplus_param
    a = jnp.exp(log_a)
    multiplier = sqrt_bounded_derivative(-jnp.expm1(2.0 * log_a))  # sqrt(1-a^2)
    multiplier = jnp.where(unscaled_t[:, None], 1.0, multiplier)
    h = a * h + multiplier * (jax.nn.sigmoid(x_gate_t) * x_t)
    return h, h

  xs = [jnp.moveaxis(jnp.asarray(v, _F32), 1, 0) for v in (x, a_gate, x_gate)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T, unscaled.T))
  h = jnp.moveaxis(h, 0, 1).astype(x.dtype)
  return h, (state if output_final_state else None)


def parallel_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                    output_final_state=False, segment_ids=None, unscaled=None):
  """``parallel_linear_scan`` of the RG-LRU coefficients."""
  batch, _ = _validate(x, a_gate, x_gate, a_param, initial_state, segment_ids,
                       step=False, unscaled=unscaled)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  h, final = parallel_scan_f32(a, b, keep_flags(segment_ids, batch,
                                                x.shape[1]), h0)
  return h.astype(x.dtype), (final if output_final_state else None)


def chunk_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                 output_final_state=False, segment_ids=None, chunk_size=64,
                 unscaled=None):
  """Griffin's RG-LRU; ``chunk_linear_scan`` of its coefficients.

  Args:
    x: ``[B, T, D]`` input.
    a_gate: ``[B, T, D]`` recurrence-gate pre-activation.
    x_gate: ``[B, T, D]`` input-gate pre-activation.
    a_param: ``[D]``; the per-token decay is ``exp(-c r_t softplus(a_param))``.
    c: the constant ``c`` of the paper (8).
    initial_state: ``[B, D]`` float32, or None for zeros.
    output_final_state: also return the last state.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
    unscaled: ``[B, T]`` bool or None: True where the input is not scaled
      by ``sqrt(1 - a_t^2)`` (the reference implementations' first token of
      a document).
  Returns:
    ``(h [B, T, D] in x's dtype, final_state [B, D] float32 or None)``.

  Example:
    >>> x = a_gate = x_gate = jnp.ones((2, 100, 8)); a_param = jnp.ones((8,))
    >>> h, s = chunk_rg_lru(x, a_gate, x_gate, a_param, output_final_state=True)
    >>> h.shape, s.shape
    ((2, 100, 8), (2, 8))
  """
  batch, _ = _validate(x, a_gate, x_gate, a_param, initial_state, segment_ids,
                       step=False, unscaled=unscaled)
  checks.check_chunk_size(chunk_size)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h, final = chunk_scan_f32(a, b, keep_flags(segment_ids, batch, x.shape[1]),
                            initial_state, chunk_size)
  return h.astype(x.dtype), (final if output_final_state else None)


def rg_lru_step(x, a_gate, x_gate, a_param, state=None, *, c=8.0, reset=None,
                unscaled=None):
  """One decoding step: ``[B, D]`` inputs, ``[B, D]`` float32 state.

  Returns ``(h_t [B, D] in x's dtype, h_t float32)``.
  """
  batch, width = _validate(x, a_gate, x_gate, a_param, state, reset, step=True,
                           unscaled=unscaled)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h = a * h + b
  return h.astype(x.dtype), h


def recurrent_rg_lru(x, a_gate, x_gate, a_param, *, c=8.0, initial_state=None,
                     output_final_state=False, segment_ids=None,
                     unscaled=None):
  """``rg_lru_step`` scanned over time. Shapes as in ``chunk_rg_lru``."""
  batch, width = _validate(x, a_gate, x_gate, a_param, initial_state,
                           segment_ids, step=False, unscaled=unscaled)
  reset = reset_flags(segment_ids, batch, x.shape[1])
  unscaled = (jnp.zeros_like(reset) if unscaled is None
              else jnp.asarray(unscaled, bool))
  # Parameters read at every step are cast once, outside the scan, so their
  # gradients are summed over time in float32 whatever their dtype.
  a_param = jnp.asarray(a_param, _F32)

  def step(h, inputs):
    x_t, a_gate_t, x_gate_t, reset_t, unscaled_t = inputs
    out, h = rg_lru_step(x_t, a_gate_t, x_gate_t, a_param, h, c=c,
                         reset=reset_t, unscaled=unscaled_t)
    return h, out

  xs = [jnp.moveaxis(v, 1, 0) for v in (x, a_gate, x_gate)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T, unscaled.T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
