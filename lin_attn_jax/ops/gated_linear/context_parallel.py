"""The gated-linear-attention core split over a ``sequence`` mesh axis.

Device ``p``'s summary (``common/context_parallel.py``): its final state
from a zero state, ``R_p [B, H, K, V]`` (one product of its decayed keys and
its values, ``O(L K V)`` like the chunk form's state pass), and its decay
``M_p = exp(sum of its log-gates) [B, H, G]`` (0 where a document starts
inside the device). One
all-gather of the ``P`` pairs, a prefix combine ``S_{p+1} = M_p * S_p +
R_p``, then the chunk form (or its Pallas kernel) from the entering state.
Every variant on the core (linear attention, simple GLA, retention, GLA,
Based, SSD, RWKV-6 with its strictly causal read and bonus, HGRN2) reaches
it through ``chunk_gated_linear``.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.decay import reverse_exclusive_cumsum
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.gated_linear import chunk
from lin_attn_jax.ops.gated_linear.inputs import default_scale, validate


def _decay_rows(decay, state):
  """``decay [B, H, G]`` scales the rows of ``state [B, H, K, V]``."""
  return decay[..., None] * state


def _summary(k, v, g, segment_ids):
  """``(R_p [B, H, K, V], M_p [B, H, G])`` of this device's tokens.

  ``R_p = sum_j exp(sum_{m > j} g_m) k_j v_j^T`` over the device's last
  document: one ``[K, L] x [L, V]`` product per head. The decay after each
  token is a sum of gates (a reverse cumulative sum), never a difference of
  two prefix sums, and every ``exp`` is of a sum ``<= 0``.
  """
  b, length, h = k.shape[:3]
  if g is None:
    g = jnp.zeros((b, length, h, 1), jnp.float32)
  g = jnp.asarray(g, jnp.float32)
  g = g[..., None] if g.ndim == 3 else g                        # [B, L, H, G]
  to_end = reverse_exclusive_cumsum(g, axis=1)                  # [B, L, H, G]
  doc = document_index(segment_ids, b, length)                  # [B, L]
  in_last = (doc == doc[:, -1:])[..., None, None]               # [B, L, 1, 1]
  k_end = jnp.where(in_last, jnp.asarray(k, jnp.float32) * jnp.exp(to_end),
                    0.0)                                        # [B, L, H, K]
  own = jnp.einsum("blhk,blhv->bhkv", k_end, v,
                   preferred_element_type=jnp.float32)          # [B, H, K, V]
  inside = doc[:, -1] > 0                                       # [B]
  decay = jnp.exp(jnp.sum(g, axis=1))                           # [B, H, G]
  return own, jnp.where(inside[:, None, None], 0.0, decay)


def context_parallel_gated_linear(q, k, v, g=None, *, scale=None,
                                  initial_state=None, output_final_state=False,
                                  segment_ids=None, chunk_size=64,
                                  sub_chunk_size=8, impl="auto",
                                  strictly_causal=False,
                                  axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_gated_linear`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_gated_linear``, plus:
    axis_name: the mesh axis the sequence is split over (``P`` devices, T a
      multiple of ``P``).
    mesh: the mesh, or None for the current one (``jax.set_mesh``).

  ``chunk_gated_linear`` (and every variant on it) calls this itself when
  the current mesh has a ``"sequence"`` axis of size > 1.
  """
  _, t, _, dk, _, _ = validate(q, k, v, g, initial_state, segment_ids)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  options = dict(scale=default_scale(scale, dk), chunk_size=chunk_size,
                 sub_chunk_size=sub_chunk_size)

  def device(split, whole):
    q, k, v, g, ids = split
    (initial,) = whole
    own, decay = _summary(k, v, g, ids)
    entering, final = cp.carry_states(
        own, decay, _decay_rows, initial, cp.document_starts(ids, axis_name),
        axis_name=axis_name)
    o, _ = chunk.chunk_gated_linear(q, k, v, g, initial_state=entering,
                                    segment_ids=ids, impl=impl,
                                    strictly_causal=strictly_causal,
                                    **options)
    return o, (final if output_final_state else None)

  return cp.map_sequence(device, (q, k, v, g, segment_ids), (initial_state,),
                         axis_name=axis_name, mesh=mesh)
