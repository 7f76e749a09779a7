"""Non-causal ReLU linear attention on the chunked linear-attention form."""

from __future__ import annotations

from lin_attn_jax.ops.linear_attn.chunk import chunk_linear_attn
from lin_attn_jax.ops.linear_attn.inputs import with_normalizer
from lin_attn_jax.ops.relu_linear_attn.inputs import (RELU_EPS, check_inputs,
                                                      divide, features)


def chunk_relu_linear_attn(q, k, v, *, eps: float = RELU_EPS,
                           segment_ids=None, causal=False,
                           chunk_size: int = 64, impl: str = "auto"):
  """Arguments and result as in ``relu_linear_attn_reference``.

  ``chunk_linear_attn(relu(q), relu(k), [v, 1], scale=1, causal=False)``
  (LION's forward and backward chunk passes, the diagonal counted once),
  then the division; ``chunk_size`` and ``impl`` as there (speed only).
  Under a mesh with a ``"sequence"`` axis the sequence is split over it.

  Example:
    >>> q = k = v = jnp.ones((1, 64, 2, 8))
    >>> chunk_relu_linear_attn(q, k, v).shape
    (1, 64, 2, 8)
  """
  check_inputs(q, k, v, segment_ids, causal)
  o, _ = chunk_linear_attn(features(q), features(k), with_normalizer(v),
                           scale=1.0, segment_ids=segment_ids,
                           chunk_size=chunk_size, impl=impl,
                           causal=False)                        # [B,T,H,V+1]
  return divide(o, v.dtype, eps)
