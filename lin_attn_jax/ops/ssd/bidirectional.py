"""SSD without the causal mask (``causal=False`` on its sequence forms).

LION's bidirectional SSD (Afzal et al. 2025, its Lion-S is this mask): on
the gated-linear core's mapping (``inputs.py``),

    y = (M * C B^T) (x dt) + D x,   M_ij = exp(sum of dt_m A over m strictly
                                     after the earlier of i, j up to the later)

symmetric, one on the diagonal, zero across documents; the skip ``D x``
once. Every form is the gated-linear core's form of the same name with
``causal=False`` (the causal form forward and on the reversed sequence,
the diagonal counted once).
"""

from __future__ import annotations

from typing import Callable

from lin_attn_jax.ops.ssd.inputs import add_skip, to_gated_linear


def noncausal_ssd(core_form: Callable, x, dt, A, B, C, *, D, dt_bias,
                  dt_softplus, segment_ids, **options):
  """``(y [B, T, H, P] in x's dtype, None)`` from the gated-linear core's
  ``core_form`` with ``causal=False`` (inputs validated by the caller;
  ``options`` go to the core form)."""
  q, k, v, g = to_gated_linear(x, dt, A, B, C, dt_bias, dt_softplus)
  o, _ = core_form(q, k, v, g, scale=1.0, segment_ids=segment_ids,
                   causal=False, **options)
  return add_skip(o, x, D).astype(x.dtype), None
