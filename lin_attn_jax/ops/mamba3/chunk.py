"""The chunkwise form: the training path, ``chunk_gated_linear`` on the
rotated queries and the trapezoid-weighted rotated keys (``on_core.py``)."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks, dispatch
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.mamba3.on_core import run_mimo_on_core, run_on_core


def chunk_mamba3(q, k, v, g, dt, trap, angles, *, initial_state=None,
                 output_final_state=False, segment_ids=None, chunk_size=64,
                 sub_chunk_size=8, impl="auto"):
  """Mamba-3, chunkwise; arguments and result as in
  ``naive_recurrent_mamba3``.

  ``chunk_gated_linear`` runs on ``q~ = R(phi) q``, ``k' = (lambda_t dt_t
  + (1 - lambda_{t+1}) dt_{t+1}) R(phi) k``, ``v`` and the scalar
  log-decays ``g`` (each key carries both of its trapezoid writes), and
  the second write of each token, not yet made at that token, leaves its
  output: ``o_t -= (1 - lambda_{t+1}) dt_{t+1} (q~_t . k~_t) v_t``. The
  cumulative angles come from an associative scan (split over the devices
  of a ``sequence`` mesh axis, as the core's state is).

  chunk_size, sub_chunk_size, impl: as in ``chunk_gated_linear`` (speed
  only; ``impl="pallas"`` runs the core's kernels).

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); dt = jnp.full((1, 100, 2), 0.1)
    >>> trap = jnp.zeros((1, 100, 2)); angles = jnp.ones((1, 100, 2, 4))
    >>> o, s = chunk_mamba3(q, k, v, g, dt, trap, angles,
    ...                     output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 17, 34))
  """
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  return run_on_core(chunk_gated_linear, q, k, v, g, dt, trap, angles,
                     initial_state=initial_state,
                     output_final_state=output_final_state,
                     segment_ids=segment_ids, chunk_size=chunk_size,
                     sub_chunk_size=sub_chunk_size, impl=impl)


def chunk_mamba3_mimo(q, k, v, g, dt, trap, angles, *, initial_state=None,
                      output_final_state=False, segment_ids=None,
                      chunk_size=64, sub_chunk_size=8, impl="auto"):
  """Mamba-3 MIMO, chunkwise; arguments and result as in
  ``naive_recurrent_mamba3_mimo``.

  ``chunk_gated_linear`` runs on ``R T`` sub-steps (token t's rank r at
  ``t R + r``, the decay on each token's first sub-step), with the keys of
  ``chunk_mamba3``; each token's ``R x R`` scores then add the writes of
  its later ranks and leave its pending second writes (``on_core.py``).
  ``chunk_size`` counts sub-steps.

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 4, 16))
    >>> v = jnp.ones((1, 100, 2, 4, 32))
    >>> g = jnp.full((1, 100, 2), -0.1); dt = jnp.full((1, 100, 2), 0.1)
    >>> trap = jnp.zeros((1, 100, 2)); angles = jnp.ones((1, 100, 2, 4))
    >>> o, s = chunk_mamba3_mimo(q, k, v, g, dt, trap, angles,
    ...                          output_final_state=True)
    >>> o.shape, s.shape
    ((1, 100, 2, 4, 32), (1, 2, 20, 36))
  """
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  return run_mimo_on_core(chunk_gated_linear, q, k, v, g, dt, trap, angles,
                          initial_state=initial_state,
                          output_final_state=output_final_state,
                          segment_ids=segment_ids, chunk_size=chunk_size,
                          sub_chunk_size=sub_chunk_size, impl=impl)
