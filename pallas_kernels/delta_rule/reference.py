"""The sweep kernels' algorithm in plain ``jnp``, float32: a ``lax.scan``
over chunks (see ``chunk_step.py`` for the equations).

It documents what the kernels compute and checks them in the tests; its
gradient is JAX's autodiff of the scan.

Letters: n chunk, b batch, h head, i and j rows of a chunk, k key channel,
v value channel, g gate width (1 or K).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.delta_rule.ops import ChunkTerms

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST


def chunk_delta_rule_sweep_reference(terms: ChunkTerms, *, initial_state=None,
                                     output_final_state=False):
  """Arguments and returns as ``chunk_delta_rule_sweep`` (float32)."""
  terms = ChunkTerms(*(jnp.moveaxis(jnp.asarray(x, _F32), 1, 0)
                       for x in terms))                          # [N, B, ...]
  b, h, dk, dv = (terms.w.shape[1], terms.w.shape[2], terms.w.shape[-1],
                  terms.u.shape[-1])

  def step(state, chunk: ChunkTerms):                           # [B,H,K,V]
    u = chunk.u - jnp.einsum("bhjk,bhkv->bhjv", chunk.w, state,
                             precision=_HIGHEST)                # [B,H,C,V]
    o = (jnp.einsum("bhik,bhkv->bhiv", chunk.q, state, precision=_HIGHEST)
         + jnp.einsum("bhij,bhjv->bhiv", chunk.scores, u,
                      precision=_HIGHEST))                      # [B,H,C,V]
    state = (chunk.decay[..., None] * state
             + jnp.einsum("bhjk,bhjv->bhkv", chunk.k, u, precision=_HIGHEST))
    return state, o

  state = (jnp.zeros((b, h, dk, dv), _F32) if initial_state is None
           else jnp.asarray(initial_state, _F32))
  state, o = jax.lax.scan(step, state, terms)
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
