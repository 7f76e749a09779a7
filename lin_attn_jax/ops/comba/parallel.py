"""The whole sequence as one chunk of the WY form (README.md).

With the erase key ``e = beta * p``, read before the decay, and the
written value ``beta * v``:

    A[i, j] = beta_i exp(G_{i-1} - G_j) p_i . k_j     j < i, same document
    P[i, j] = exp(G_i - G_j) q_i . k_j                j <= i, same document
    (I + A) [W | U] = diag(beta) [exp(G_{i-1}) P | V] (W only for S_0)
    o = (exp(G) Q) S_0 + P (U - W S_0)

the delta-rule core's parallel form (``delta_rule.parallel.wy_sequence``
with ``read_before_decay=True``) with the row key of ``A`` and of the
right-hand side ``beta * p`` instead of ``beta * k``. Memory and the
triangular solve are quadratic in T: this form is for checking and for
short sequences.
"""

from __future__ import annotations

from lin_attn_jax.ops.comba.inputs import core_inputs, default_scale, validate
from lin_attn_jax.ops.delta_rule.parallel import wy_sequence


def parallel_comba(q, k, v, p, g, beta, *, scale=None, initial_state=None,
                   output_final_state=False, segment_ids=None,
                   use_qk_l2norm=False):
  """Quadratic form. Shapes as in ``chunk_comba``."""
  _, _, _, hv, dk, _, g = validate(q, k, v, p, g, beta, initial_state,
                                   segment_ids)
  scale = default_scale(scale, dk)
  q, k, erase, written, g = core_inputs(q, k, v, p, g, beta, hv,
                                        use_qk_l2norm)
  o, final_state = wy_sequence(
      scale * q, k, erase, written, g, segment_ids=segment_ids,
      initial_state=initial_state, output_final_state=output_final_state,
      read_before_decay=True)
  return o.astype(v.dtype), final_state
