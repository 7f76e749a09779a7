"""The selective scan in chunks, with a backward pass that recomputes.

The ``[B, T, D, N]`` states are never held for the whole sequence:

1. Forward: a token-by-token scan inside each chunk, a ``lax.scan`` over
   chunks around it; only the state entering each chunk is kept
   (``[T / C, B, D, N]``) besides the outputs.
2. Backward (hand-written, ``jax.custom_vjp``), chunk by chunk from the end:
   recompute the chunk's states and decays from its entering state
   (``[C, B, D, N]`` each), then run the reverse recurrence ``g_t = dL/dh_t
   = a_{t+1} g_{t+1} + C_t dy_t`` through it, reading off every gradient at
   its token.

This is the schedule of Mamba's fused selective-scan kernel. Inside a chunk
the scan is sequential: on CPU one pass over a cache-sized block is cheaper
than the ``O(log C)`` passes of an associative scan, and the backward pass
costs about three forward passes instead of the many full-size residuals of
differentiating a ``lax.scan`` (see ``benchmarks/RESULTS_diagonal_ssm.md``).

Gradients of the exponent: with ``a = exp(dt A)`` and ``h_t = a (k h_{t-1})
+ dt u B`` (``k`` = 0 at a document start), ``dL/d(dt A) = g_t * a * k
h_{t-1}``, from which ``dL/d dt`` and ``dL/dA`` follow; ``dL/d dt`` also gets
``u (g_t . B)`` through the input term.

Inside, a state is ``[B, G, N, R]``: the ``R`` channels of a group are the
contiguous axis of every per-token update, and the per-token reductions are
written as multiply-and-sum over one axis (an ``einsum`` there becomes a
transpose and a small batched ``dot`` per token on CPU, several times
slower); the gradient of ``A`` is accumulated per batch row and summed once
after the scan.

Letters: t token, b batch, g group, r channel within a group, n state.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.common.chunking import pad_time
from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_noncausal_scan
from lin_attn_jax.ops.diagonal_ssm.inputs import initial
from lin_attn_jax.ops.diagonal_ssm.scan import keep_flags
from lin_attn_jax.ops.mamba import context_parallel as split
from lin_attn_jax.ops.mamba.bidirectional import noncausal_selective_scan
from lin_attn_jax.ops.mamba.inputs import (CHUNK_SIZE, finish, grouped,
                                           grouped_projection, time_step,
                                           validate)

_F32 = jnp.float32


def _input(u_t, dt_t, b_t):
  """Input ``dt u B`` of one token, ``[B, G, N, R]``."""
  return (dt_t * u_t)[:, :, None, :] * b_t[..., None]


def _coefficients(u_t, dt_t, b_t, a_log):
  """Decay ``exp(dt A)`` and input ``dt u B`` of one token, ``[B, G, N, R]``."""
  return jnp.exp(dt_t[:, :, None, :] * a_log), _input(u_t, dt_t, b_t)


def _split(x, chunk):
  """Time-major ``[T, ...]`` -> ``[T / C, C, ...]``."""
  return x.reshape((x.shape[0] // chunk, chunk) + x.shape[1:])


def _merge(x):
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _expand_keep(keep_t):
  return keep_t[:, None, None, None]                        # [B, 1, 1, 1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _scan(u, dt, a_log, b, c, keep, h0, chunk):
  """Time-major float32 core.

  Args:
    u, dt: ``[T, B, G, R]``; a_log: ``[G, N, R]`` (the ``A`` of the op);
    b, c: ``[T, B, G, N]``; keep: ``[T, B]``; h0: ``[B, G, N, R]``;
    chunk: tokens per chunk, dividing T.
  Returns:
    ``(y [T, B, G, R] = C . h, h_T [B, G, N, R])``.
  """
  (y, final), _ = _scan_fwd(u, dt, a_log, b, c, keep, h0, chunk)
  return y, final


def _scan_fwd(u, dt, a_log, b, c, keep, h0, chunk):
  def one_chunk(h, xs):
    def step(h, x):
      u_t, dt_t, b_t, c_t, keep_t = x
      decay, inp = _coefficients(u_t, dt_t, b_t, a_log)
      h = decay * (_expand_keep(keep_t) * h) + inp
      return h, jnp.sum(h * c_t[..., None], axis=2)
    h_end, y = jax.lax.scan(step, h, xs)
    return h_end, (y, h)

  xs = tuple(_split(x, chunk) for x in (u, dt, b, c, keep))
  final, (y, entering) = jax.lax.scan(one_chunk, h0, xs)
  return (_merge(y), final), (u, dt, a_log, b, c, keep, entering)


def _scan_bwd(chunk, residuals, cotangents):
  u, dt, a_log, b, c, keep, entering = residuals
  dy, d_final = cotangents

  def one_chunk(carry, xs):
    u_c, dt_c, b_c, c_c, keep_c, dy_c, h_in = xs

    def recompute(h, x):
      u_t, dt_t, b_t, keep_t = x
      decay, inp = _coefficients(u_t, dt_t, b_t, a_log)
      h_prev = _expand_keep(keep_t) * h
      return decay * h_prev + inp, (h_prev, decay)

    # The decays go to the reverse scan with the states: one exp per token
    # and state entry fewer than recomputing them there.
    _, (h_prev, decays) = jax.lax.scan(recompute, h_in,
                                       (u_c, dt_c, b_c, keep_c))

    def reverse(carry, x):
      g_later, d_a_log = carry                   # a_{t+1} k_{t+1} g_{t+1}
      u_t, dt_t, b_t, c_t, keep_t, dy_t, h_prev_t, decay = x
      decayed = decay * h_prev_t
      h_t = decayed + _input(u_t, dt_t, b_t)
      g = g_later + dy_t[:, :, None, :] * c_t[..., None]       # dL/dh_t
      g_exponent = g * decayed                                 # dL/d(dt A)
      g_dot_b = jnp.sum(g * b_t[..., None], axis=2)            # [B, G, R]
      d_dt = jnp.sum(g_exponent * a_log, axis=2) + u_t * g_dot_b
      d_u = dt_t * g_dot_b
      d_b = jnp.sum(g * (dt_t * u_t)[:, :, None, :], axis=3)   # [B, G, N]
      d_c = jnp.sum(h_t * dy_t[:, :, None, :], axis=3)
      d_a_log = d_a_log + g_exponent * dt_t[:, :, None, :]     # [B, G, N, R]
      g_earlier = _expand_keep(keep_t) * decay * g
      return (g_earlier, d_a_log), (d_u, d_dt, d_b, d_c)

    carry, grads = jax.lax.scan(
        reverse, carry, (u_c, dt_c, b_c, c_c, keep_c, dy_c, h_prev, decays),
        reverse=True)
    return carry, grads

  xs = tuple(_split(x, chunk) for x in (u, dt, b, c, keep, dy)) + (entering,)
  (d_h0, d_a_log), (d_u, d_dt, d_b, d_c) = jax.lax.scan(
      one_chunk, (d_final, jnp.zeros_like(d_final)), xs, reverse=True)
  d_a_log = jnp.sum(d_a_log, axis=0)                            # [G, N, R]
  return (_merge(d_u), _merge(d_dt), d_a_log, _merge(d_b), _merge(d_c),
          jnp.zeros_like(keep), d_h0)


_scan.defvjp(_scan_fwd, _scan_bwd)


@context_parallel.splits_sequence(
    lambda: split.context_parallel_selective_scan)
def chunk_selective_scan(u, delta, A, B, C, *, D=None, z=None,
                         delta_bias=None, delta_softplus=False,
                         initial_state=None, output_final_state=False,
                         segment_ids=None, chunk_size=CHUNK_SIZE,
                         causal=True):
  """Mamba's selective scan (S6) in the ``[B, T, D]`` layout; training path.

  Args:
    u: ``[B, T, D]`` input.
    delta: ``[B, T, D]`` time step before bias and softplus.
    A: ``[D, N]`` state matrix (diagonal per channel; ``<= 0`` for a decay).
    B, C: ``[B, T, N]``, or ``[B, T, G, N]`` with ``G`` groups of ``D / G``
      channels.
    D: ``[D]`` skip connection, or None.
    z: ``[B, T, D]`` gate: the output is multiplied by ``silu(z)``, or None.
    delta_bias: ``[D]`` added to ``delta``, or None.
    delta_softplus: ``dt = softplus(delta + delta_bias)`` instead of the sum.
    initial_state: ``[B, D, N]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size: tokens between saved states (speed and memory only). The
      backward pass holds two ``[C, B, D, N]`` blocks of a chunk's states
      and decays, fastest while they fit in cache (see
      docs/performance.md), and the saved states ``[T / C, B, D, N]``
      against a chunk's are smallest near ``C = sqrt(T)``.
    causal: False for the non-causal scan (``bidirectional.py``): the
      linear scan of the coefficients both ways (memory ``T D N``); no
      state.
  Returns:
    ``(y [B, T, D] in u's dtype, final_state [B, D, N] float32 or None)``.

  Example:
    >>> u = delta = jnp.ones((2, 100, 8)); A = -jnp.ones((8, 4))
    >>> B = C = jnp.ones((2, 100, 4))
    >>> y, s = chunk_selective_scan(u, delta, A, B, C, delta_softplus=True,
    ...                             output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 8, 4))
  """
  dims = validate(u, delta, A, B, C, D, z, delta_bias, initial_state,
                  segment_ids)
  checks.check_chunk_size(chunk_size)
  check_no_state("chunk_selective_scan", causal, initial_state,
                 output_final_state)
  if not causal:
    scan = functools.partial(chunk_noncausal_scan, chunk_size=chunk_size)
    return noncausal_selective_scan(
        scan, u, delta, A, B, C, D=D, z=z,
        delta_bias=delta_bias, delta_softplus=delta_softplus,
        segment_ids=segment_ids, dims=dims)
  batch, length = u.shape[:2]
  g, s = dims.groups, dims.state
  chunk = min(chunk_size, length)
  # Padding tokens have dt = 0: decay 1 and no input, so h_T passes through.
  dt = pad_time(grouped(time_step(delta, delta_bias, delta_softplus), g),
                chunk)                                           # [B,T,G,R]
  u_g = pad_time(grouped(u, g), chunk)
  b_proj = pad_time(grouped_projection(B, 2), chunk)             # [B,T,G,N]
  c_proj = pad_time(grouped_projection(C, 2), chunk)
  keep = keep_flags(segment_ids, batch, length)
  keep = jnp.pad(keep, ((0, 0), (0, dt.shape[1] - length)), constant_values=1.0)
  # States are [B, G, N, R] inside: the R channels of a group are the
  # contiguous axis of every per-token update.
  h0 = jnp.swapaxes(initial(initial_state, (batch, dims.width, s)).reshape(
      batch, g, -1, s), 2, 3)                                    # [B,G,N,R]
  a_log = jnp.swapaxes(jnp.asarray(A, _F32).reshape(g, -1, s), 1, 2)  # [G,N,R]
  time_major = [jnp.moveaxis(x, 1, 0) for x in (u_g, dt, b_proj, c_proj, keep)]
  y, final = _scan(*time_major[:2], a_log, *time_major[2:], h0, chunk)
  y = jnp.moveaxis(y, 0, 1)[:, :length].reshape(batch, length, dims.width)
  y = finish(y, u, D, z)
  final = (jnp.swapaxes(final, 2, 3).reshape(batch, dims.width, s)
           if output_final_state else None)
  return y.astype(u.dtype), final
