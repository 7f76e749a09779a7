"""HGRN's gated recurrence, on the linear scan.

Qin et al. 2023, https://arxiv.org/abs/2311.04823:

    h_t = exp(g_t) * h_{t-1} + x_t        elementwise over [B, D]

``g`` is the log forget gate (``<= 0``). The layer builds it as
``log(lb + (1 - lb) sigmoid(f))`` with a per-layer lower bound ``lb`` and
passes ``x = (1 - exp(g)) * i`` (its input already scaled by one minus the
forget gate), so the op is the bare recurrence. HGRN2's outer-product state
is the GLA core, not this op.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_scan_f32
from lin_attn_jax.ops.diagonal_ssm.inputs import (check_sequence, check_step,
                                                  initial)
from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_scan_f32
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags

_F32 = jnp.float32


def _validate(x, g, initial_state, segment_ids):
  batch, length, width = check_sequence(("x", "g"), (x, g))
  checks.check_nonpositive("g", g)
  checks.check_state("initial_state", initial_state, (batch, width), "[B, D]")
  checks.check_segment_ids(segment_ids, batch, length)
  return batch, length, width


def naive_recurrent_hgrn(x, g, *, initial_state=None, output_final_state=False,
                         segment_ids=None):
  """Reference recurrence. Shapes as in ``chunk_hgrn``."""
  batch, length, width = _validate(x, g, initial_state, segment_ids)
  reset = reset_flags(segment_ids, batch, length)

  def step(h, inputs):
    x_t, g_t, reset_t = inputs
    h = jnp.where(reset_t[:, None], 0.0, h)
    h = jnp.exp(g_t) * h + x_t
    return h, h

  xs = [jnp.moveaxis(jnp.asarray(v, _F32), 1, 0) for v in (x, g)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset.T))
  h = jnp.moveaxis(h, 0, 1).astype(x.dtype)
  return h, (state if output_final_state else None)


def parallel_hgrn(x, g, *, initial_state=None, output_final_state=False,
                  segment_ids=None):
  """``parallel_linear_scan`` with ``a = exp(g)``."""
  batch, length, _ = _validate(x, g, initial_state, segment_ids)
  h0 = None if initial_state is None else jnp.asarray(initial_state, _F32)
  h, final = parallel_scan_f32(jnp.exp(jnp.asarray(g, _F32)),
                               jnp.asarray(x, _F32),
                               keep_flags(segment_ids, batch, length), h0)
  return h.astype(x.dtype), (final if output_final_state else None)


def chunk_hgrn(x, g, *, initial_state=None, output_final_state=False,
               segment_ids=None, chunk_size=64):
  """HGRN's recurrence ``h_t = exp(g_t) h_{t-1} + x_t``, chunkwise.

  Args:
    x: ``[B, T, D]`` input (already scaled by ``1 - exp(g)``).
    g: ``[B, T, D]`` log forget gate, ``<= 0``.
    initial_state: ``[B, D]`` float32, or None for zeros.
    output_final_state: also return the last state.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens per chunk (speed only).
  Returns:
    ``(h [B, T, D] in x's dtype, final_state [B, D] float32 or None)``.

  Example:
    >>> x = jnp.ones((2, 100, 8)); g = jnp.full((2, 100, 8), -0.1)
    >>> h, s = chunk_hgrn(x, g, output_final_state=True)
    >>> h.shape, s.shape
    ((2, 100, 8), (2, 8))
  """
  batch, length, _ = _validate(x, g, initial_state, segment_ids)
  checks.check_chunk_size(chunk_size)
  h, final = chunk_scan_f32(jnp.exp(jnp.asarray(g, _F32)),
                            jnp.asarray(x, _F32),
                            keep_flags(segment_ids, batch, length),
                            initial_state, chunk_size)
  return h.astype(x.dtype), (final if output_final_state else None)


def hgrn_step(x, g, state=None, *, reset=None):
  """One decoding step: ``[B, D]`` inputs, ``[B, D]`` float32 state.

  Returns ``(h_t [B, D] in x's dtype, h_t float32)``.
  """
  batch, width = check_step(("x", "g"), (x, g))
  checks.check_nonpositive("g", g)
  checks.check_state("state", state, (batch, width), "[B, D]")
  checks.check_reset(reset, batch)
  h = initial(state, (batch, width))
  if reset is not None:
    h = jnp.where(jnp.asarray(reset)[:, None], 0.0, h)
  h = jnp.exp(jnp.asarray(g, _F32)) * h + jnp.asarray(x, _F32)
  return h.astype(x.dtype), h


def recurrent_hgrn(x, g, *, initial_state=None, output_final_state=False,
                   segment_ids=None):
  """``hgrn_step`` scanned over time. Shapes as in ``chunk_hgrn``."""
  batch, length, width = _validate(x, g, initial_state, segment_ids)

  def step(h, inputs):
    x_t, g_t, reset_t = inputs
    out, h = hgrn_step(x_t, g_t, h, reset=reset_t)
    return h, out

  xs = [jnp.moveaxis(v, 1, 0) for v in (x, g)]
  state, h = jax.lax.scan(step, initial(initial_state, (batch, width)),
                          (*xs, reset_flags(segment_ids, batch, length).T))
  return jnp.moveaxis(h, 0, 1), (state if output_final_state else None)
