"""H3's two SSMs: the shift SSM (``lin_attn_jax.ops.shift_ssm``) and the
diagonal S4D SSM (``lin_attn_jax.ops.s4d``), each an op folder of its own.

The H3 layer itself (``q * diag_ssm(shift_ssm(k) * v)``, multi-head) is
built from these in the layers package.
"""

from lin_attn_jax.ops.s4d import (chunk_s4d, naive_recurrent_s4d, parallel_s4d,
                                  recurrent_s4d, s4d_step)
from lin_attn_jax.ops.shift_ssm import (chunk_shift_ssm,
                                        naive_recurrent_shift_ssm,
                                        parallel_shift_ssm,
                                        recurrent_shift_ssm, shift_ssm_step)

__all__ = [
    "chunk_s4d",
    "chunk_shift_ssm",
    "naive_recurrent_s4d",
    "naive_recurrent_shift_ssm",
    "parallel_s4d",
    "parallel_shift_ssm",
    "recurrent_s4d",
    "recurrent_shift_ssm",
    "s4d_step",
    "shift_ssm_step",
]
