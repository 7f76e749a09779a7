"""The chunkwise form: the training path, ``chunk_gated_linear`` on the
stabilised keys, values and log-decays (``on_core.py``)."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks, dispatch
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.mlstm.inputs import EPS
from lin_attn_jax.ops.mlstm.on_core import run_on_core


def chunk_mlstm(q, k, v, i, f, *, scale=None, eps=EPS, initial_state=None,
                output_final_state=False, segment_ids=None, chunk_size=64,
                sub_chunk_size=8, impl="auto"):
  """The mLSTM, chunkwise; arguments and result as in
  ``naive_recurrent_mlstm``.

  The max state ``m`` comes first, from an associative max-plus scan over
  the sequence (split over the devices of a ``sequence`` mesh axis);
  ``chunk_gated_linear`` then runs on ``k' = exp(i - m) k``, values ``[v |
  1]`` and the scalar log-decays ``log f_t + m_{t-1} - m_t``: its state
  ``[C~ | n~]`` crosses chunks, documents and devices as any of its states,
  and ``m`` needs no carrying (it is known at every token).

  chunk_size, sub_chunk_size, impl: as in ``chunk_gated_linear`` (speed
  only; ``impl="pallas"`` runs the core's kernels).

  Example:
    >>> q = k = jnp.ones((1, 100, 2, 16)); v = jnp.ones((1, 100, 2, 32))
    >>> i = f = jnp.zeros((1, 100, 2))
    >>> h, s = chunk_mlstm(q, k, v, i, f, output_final_state=True)
    >>> h.shape, s.shape
    ((1, 100, 2, 32), (1, 2, 16, 34))
  """
  checks.check_chunk_sizes(chunk_size, sub_chunk_size)
  dispatch.check_impl(impl)
  return run_on_core(chunk_gated_linear, q, k, v, i, f, scale=scale, eps=eps,
                     initial_state=initial_state,
                     output_final_state=output_final_state,
                     segment_ids=segment_ids, chunk_size=chunk_size,
                     sub_chunk_size=sub_chunk_size, impl=impl)
