"""The whole sequence as one chunk of the WY form (README.md).

With the erase key ``e = b * k`` and the written value ``u = w * v``:

    A[i, j] = e_i . (exp(G_i - G_j) * k_j)          j < i, same document
    P[i, j] = q_i . (exp(G_i - G_j) * k_j)          j <= i, same document
    (I + A) [W | U] = [exp(G) * E | w * V]          (W only for S_0)
    o = (exp(G) * Q) S_0 + P (U - W S_0)

the delta-rule core's parallel form (``delta_rule.parallel.wy_sequence``)
with the row key of ``A`` and of the right-hand side ``e`` instead of
``beta * k``.
Memory and the triangular solve are quadratic in T: this form is for
checking and for short sequences.
"""

from __future__ import annotations

from lin_attn_jax.ops.delta_rule.parallel import wy_sequence
from lin_attn_jax.ops.gdn2.inputs import core_inputs, default_scale, validate


def parallel_gdn2(q, k, v, g, b, w, *, scale=None, initial_state=None,
                  output_final_state=False, segment_ids=None,
                  use_qk_l2norm=False):
  """Quadratic form. Shapes as in ``chunk_gdn2``."""
  _, _, _, hv, dk, _ = validate(q, k, v, g, b, w, initial_state,
                                segment_ids)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, g, b, w, hv, use_qk_l2norm)
  o, final_state = wy_sequence(
      scale * q, k, erase, written, g, segment_ids=segment_ids,
      initial_state=initial_state, output_final_state=output_final_state)
  return o.astype(v.dtype), final_state
