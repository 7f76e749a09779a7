"""HGRN's gated recurrence, on the linear scan.

Qin et al. 2023, https://arxiv.org/abs/2311.04823:

    h_t = exp(g_t) * h_{t-1} + x_t        elementwise over [B, D]

``g`` is the log forget gate (``<= 0``). The layer builds it as
``log(lb + (1 - lb) sigmoid(f))`` with a per-layer lower bound ``lb`` and
passes ``x = (1 - exp(g)) * i`` (its input already scaled by one minus the
forget gate), so the op is the bare recurrence. HGRN2's outer-product state
is the GLA core, not this op.
"""

from lin_attn_jax.ops.hgrn.naive import naive_recurrent_hgrn
from lin_attn_jax.ops.hgrn.parallel import parallel_hgrn
from lin_attn_jax.ops.hgrn.chunk import chunk_hgrn
from lin_attn_jax.ops.hgrn.recurrent import recurrent_hgrn
from lin_attn_jax.ops.hgrn.step import hgrn_step

__all__ = [
    "chunk_hgrn",
    "hgrn_step",
    "naive_recurrent_hgrn",
    "parallel_hgrn",
    "recurrent_hgrn",
]
