"""MesaNet's chunk form split over a ``sequence`` mesh axis.

The solve is not linear in the state, so a device cannot add the entering
state's contribution to outputs computed from a zero state (as the
gated-linear core does). Instead, per device:

1. a state-only pass: the core's ``chunk_gated_linear`` from a zero state on
   the keys ``beta k`` and values ``[k | v]`` gives the device's own final
   ``[H^kk | H^kv]`` (``R_p``); its decay ``M_p = exp(sum of its log-gates)``
   per head (0 where a document starts inside the device);
2. one all-gather of those pairs and the prefix combine ``S_{p+1} = M_p S_p
   + R_p`` (``common/context_parallel.py``) give the state entering the
   device and the final state;
3. the chunk form runs on the device's tokens from that entering state.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.common import context_parallel as cp
from lin_attn_jax.ops.common.segments import document_index
from lin_attn_jax.ops.gated_linear import chunk_gated_linear
from lin_attn_jax.ops.mesa_net import chunk
from lin_attn_jax.ops.mesa_net.inputs import CG_STEPS, query_key, validate

_F32 = jnp.float32


def _decay_state(decay, state):
  """``decay [B, H]`` scales ``state [B, H, K, K + V]``."""
  return decay[..., None, None] * state


def context_parallel_mesa_net(q, k, v, g, beta, lamb, *, initial_state=None,
                              output_final_state=False, segment_ids=None,
                              cg_steps=CG_STEPS, use_qk_l2norm=False,
                              chunk_size=64, sub_chunk_size=8, impl="auto",
                              axis_name=cp.SEQUENCE_AXIS, mesh=None):
  """``chunk_mesa_net`` with T split over the devices of ``axis_name``.

  Arguments and result as in ``chunk_mesa_net``, plus:
    axis_name: the mesh axis the sequence is split over (``P`` devices, T a
      multiple of ``P``).
    mesh: the mesh, or None for the current one (``jax.set_mesh``).

  ``chunk_mesa_net`` calls this itself when the current mesh has a
  ``"sequence"`` axis of size > 1.
  """
  _, t, _, _, _ = validate(q, k, v, g, beta, lamb, initial_state,
                           segment_ids, cg_steps)
  cp.local_length(t, cp.axis_size(axis_name, mesh), axis_name)
  options = dict(chunk_size=chunk_size, sub_chunk_size=sub_chunk_size,
                 impl=impl)

  def device(split, whole):
    q, k, v, g, beta, ids = split
    initial, lamb = whole
    q, k = query_key(q, k, use_qk_l2norm)
    g, beta = jnp.asarray(g, _F32), jnp.asarray(beta, _F32)
    values = jnp.concatenate([k, jnp.asarray(v, _F32)], axis=-1)
    _, own = chunk_gated_linear(
        jnp.zeros_like(q), beta[..., None] * k, values, g, scale=1.0,
        output_final_state=True, segment_ids=ids, **options)
    b, length = q.shape[:2]
    inside = document_index(ids, b, length)[:, -1] > 0          # [B]
    decay = jnp.where(inside[:, None], 0.0, jnp.exp(jnp.sum(g, axis=1)))
    entering, final = cp.carry_states(
        own, decay, _decay_state, initial,
        cp.document_starts(ids, axis_name), axis_name=axis_name)
    o, _ = chunk.chunk_mesa_net(q, k, v, g, beta, lamb,
                                initial_state=entering, segment_ids=ids,
                                cg_steps=cg_steps, **options)
    return o, (final if output_final_state else None)

  return cp.map_sequence(device, (q, k, v, g, beta, segment_ids),
                         (initial_state, lamb), axis_name=axis_name,
                         mesh=mesh)
