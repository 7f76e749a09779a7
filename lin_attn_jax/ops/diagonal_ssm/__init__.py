"""The diagonal-SSM core: ``h_t = a_t * h_{t-1} + b_t``, elementwise.

``linear_scan`` is the recurrence itself over ``[B, T, D]``; Mamba's
selective scan, RG-LRU, HGRN and the S4D SSM of H3 are parameterisations of
it (their ``a`` and ``b`` come from gates, a discretised ``A`` or both).

Letters used in shape comments across the diagonal-SSM ops:
  b batch, t time, n chunk (or state size N where it says so), c position in
  a chunk, d channel (model width D), s state size N of selective scans,
  h head, p head size P, g group, r heads per group, w convolution tap.
"""

from lin_attn_jax.ops.diagonal_ssm.chunk import chunk_linear_scan
from lin_attn_jax.ops.diagonal_ssm.naive import naive_recurrent_linear_scan
from lin_attn_jax.ops.diagonal_ssm.parallel import parallel_linear_scan
from lin_attn_jax.ops.diagonal_ssm.recurrent import recurrent_linear_scan
from lin_attn_jax.ops.diagonal_ssm.step import linear_scan_step

__all__ = [
    "chunk_linear_scan",
    "linear_scan_step",
    "naive_recurrent_linear_scan",
    "parallel_linear_scan",
    "recurrent_linear_scan",
]
