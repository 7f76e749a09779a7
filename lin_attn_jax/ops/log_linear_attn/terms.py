"""Log-linear attention as a sum of gated-linear problems on the core.

``block_terms`` (``inputs.py``) turns the op into ``n <= L`` gated-linear
problems that differ only in their queries (scaled by ``w_l``) and their
segment ids (aligned blocks of ``2^l`` positions inside each document);
they run as one call of a core form, stacked on the batch axis, and their
outputs add up. The final block states ``F_l`` give back the Fenwick
levels, ``S_l = F_l - F_{l-1}``.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.ops.log_linear_attn.inputs import (block_terms,
                                                    default_scale, fenwick,
                                                    term_count, validate)

_F32 = jnp.float32


def on_core(core_form, q, k, v, g, level_scales, *, scale, initial_state,
            output_final_state, segment_ids, offset, **core_options):
  """``core_form`` (``chunk_gated_linear`` or ``parallel_gated_linear``)
  run on the block terms; arguments as in
  ``naive_recurrent_log_linear_attn``."""
  b, t, h, dk, dv, levels = validate(q, k, v, g, level_scales, initial_state,
                                     segment_ids, offset)
  scale = default_scale(scale, dk)
  n = term_count(levels, offset, t, initial_state is not None)
  q_terms, ids, init = block_terms(q, level_scales, segment_ids, offset,
                                   initial_state, terms=n)

  def stacked(x):                                               # [n B, ...]
    x = jnp.asarray(x)
    return jnp.broadcast_to(x[None], (n,) + x.shape).reshape(
        (n * b,) + x.shape[1:])

  o, final = core_form(
      q_terms.astype(jnp.result_type(q)).reshape(n * b, t, h, dk),
      stacked(k), stacked(v), stacked(jnp.asarray(g, _F32)), scale=scale,
      initial_state=None if init is None else init.reshape(n * b, h, dk, dv),
      output_final_state=output_final_state,
      segment_ids=ids.reshape(n * b, t), **core_options)
  o = jnp.sum(o.reshape(n, b, t, h, dv).astype(_F32), axis=0)   # [B, T, H, V]
  if not output_final_state:
    return o.astype(v.dtype), None
  blocks = jnp.moveaxis(final.reshape(n, b, h, dk, dv), 0, 2)   # [B,H,n,K,V]
  blocks = jnp.concatenate(
      [blocks, jnp.repeat(blocks[:, :, -1:], levels - n, axis=2)], axis=2)
  return o.astype(v.dtype), fenwick(blocks)
