"""The RG-LRU without the causal mask (``causal=False`` on its sequence
forms): the non-causal linear scan (LION, ``diagonal_ssm/bidirectional.py``)
of its coefficients ``a_t`` and ``sqrt(1 - a_t^2) (i_t * x_t)``, so every
``h_i`` sums its whole document, the input of ``j`` decayed by the ``a_m``
strictly after the earlier of ``i, j`` up to the later.
"""

from __future__ import annotations

from typing import Callable

from lin_attn_jax.ops.diagonal_ssm.bidirectional import (lion_definition,
                                                         lion_scan)
from lin_attn_jax.ops.rg_lru.coefficients import rg_lru_coefficients


def noncausal_rg_lru(scan: Callable | None, x, a_gate, x_gate, a_param, *, c,
                     segment_ids, unscaled):
  """``(h [B, T, D] in x's dtype, None)``: ``scan(a, b, segment_ids)`` (a
  causal scan of float32 coefficients from zero) run both ways, or the
  dense definition for ``scan=None``."""
  a, b = rg_lru_coefficients(x, a_gate, x_gate, a_param, c, unscaled)
  h = (lion_definition(a, b, segment_ids) if scan is None
       else lion_scan(scan, a, b, segment_ids))
  return h.astype(x.dtype), None
