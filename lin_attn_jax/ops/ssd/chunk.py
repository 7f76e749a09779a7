"""SSD's chunkwise form: the gated-linear core's, or the block
decomposition (``block_decomposition.py``)."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks, context_parallel, dispatch
from lin_attn_jax.ops.common.bidirectional import check_no_state
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.ssd.bidirectional import noncausal_ssd
from lin_attn_jax.ops.ssd.block_decomposition import chunk_ssd_xla
from lin_attn_jax.ops.ssd.inputs import (add_skip, time_step, to_gated_linear,
                                         validate)


def chunk_ssd(x, dt, A, B, C, *, D=None, dt_bias=None, dt_softplus=False,
              initial_state=None, output_final_state=False, segment_ids=None,
              chunk_size=64, sub_chunk_size=8, impl="auto", causal=True):
  """Mamba-2's state-space dual, chunkwise: ``chunk_gated_linear`` with

      q = C, k = B, v = x * dt, g = dt * A (a scalar per head), scale = 1,

  groups of ``B``/``C`` broadcast to their heads, plus ``D * x``.

  Args:
    x: ``[B, T, H, P]``.
    dt: ``[B, T, H]`` time step (before ``dt_bias`` and softplus).
    A: ``[H]``, ``<= 0``.
    B, C: ``[B, T, G, N]``; H must be a multiple of G (head h reads group
      ``h // (H / G)``).
    D: ``[H]`` skip connection, or None.
    dt_bias: ``[H]`` added to ``dt``, or None.
    dt_softplus: ``dt = softplus(dt + dt_bias)``; without it ``dt + dt_bias``
      must be ``>= 0``.
    initial_state: ``[B, H, N, P]`` float32, or None for zeros.
    output_final_state: also return the state after the last token.
    segment_ids: ``[B, T]`` int, the state resets where the id changes.
    chunk_size, sub_chunk_size, impl: as in ``chunk_gated_linear`` (speed
      only; ``impl="auto"`` runs the Pallas kernel on GPU). The XLA
      form is ``block_decomposition.py``'s, which keeps ``B`` and ``C`` per
      group; the kernels and the context-parallel split are the GLA core's.
    causal: False for the non-causal form (``bidirectional.py``): the
      core's with ``causal=False``, then ``D x``; no state.
  Returns:
    ``(y [B, T, H, P] in x's dtype, final_state [B, H, N, P] float32 or
    None)``.

  Example:
    >>> x = jnp.ones((1, 100, 4, 16)); dt = jnp.full((1, 100, 4), 0.1)
    >>> A = -jnp.ones((4,)); B = C = jnp.ones((1, 100, 2, 8))
    >>> y, s = chunk_ssd(x, dt, A, B, C, output_final_state=True)
    >>> y.shape, s.shape
    ((1, 100, 4, 16), (1, 4, 8, 16))
  """
  validate(x, dt, A, B, C, D, dt_bias, dt_softplus, initial_state, segment_ids)
  check_no_state("chunk_ssd", causal, initial_state,
                 output_final_state)
  if not causal:
    return noncausal_ssd(chunk_gated_linear, x, dt, A, B, C, D=D,
                         dt_bias=dt_bias, dt_softplus=dt_softplus,
                         segment_ids=segment_ids,
                         chunk_size=chunk_size,
                         sub_chunk_size=sub_chunk_size, impl=impl)
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)

  def gated_linear(impl):
    q, k, v, g = to_gated_linear(x, dt, A, B, C, dt_bias, dt_softplus)
    return chunk_gated_linear(q, k, v, g, scale=1.0,
                              initial_state=initial_state,
                              output_final_state=output_final_state,
                              segment_ids=segment_ids, chunk_size=chunk_size,
                              sub_chunk_size=sub_chunk_size, impl=impl)

  def xla():
    return chunk_ssd_xla(x, time_step(dt, dt_bias, dt_softplus), A, B, C,
                         initial_state=initial_state,
                         output_final_state=output_final_state,
                         segment_ids=segment_ids, chunk_size=chunk_size,
                         sub_chunk_size=sub_chunk_size)

  if context_parallel.sequence_parallel_size() > 1:
    o, final = gated_linear(impl)
  else:
    o, final = dispatch.run(impl, xla, lambda: gated_linear("pallas"),
                                 family="gated_linear")
  return add_skip(o, x, D).astype(x.dtype), final
