"""The Moore-Penrose pseudo-inverse by Nystromformer's iteration."""

from __future__ import annotations

import jax.numpy as jnp

PINV_INITS = ("per_matrix", "original")


def iterative_pinv(a, *, iterations: int = 6, init: str = "per_matrix"):
  """``A^+`` of ``a [..., M, M]`` (non-negative rows summing to 1), float32.

  The paper's iteration (its Eq. 14, after Razavi et al. 2014):

      Z_0 = A^T / (||A||_1 ||A||_inf)
      Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4

  ``||A||_inf = 1`` for a row-stochastic ``A``, ``||A||_1`` its largest
  column sum. ``init="per_matrix"`` takes that norm per matrix (the paper's
  ``Z_0``); ``"original"`` takes the largest column sum over the whole
  batch, as the reference code's default does (``init_option
  "original"``), which makes every matrix's result depend on the batch.
  """
  if init not in PINV_INITS:
    raise ValueError(f"init must be one of {PINV_INITS}, got {init!r}")
  a = jnp.asarray(a, jnp.float32)
  eye = jnp.eye(a.shape[-1], dtype=jnp.float32)
  column_sums = jnp.sum(a, axis=-2)                             # [..., M]
  if init == "original":
    norm = jnp.max(column_sums)
  else:
    norm = jnp.max(column_sums, axis=-1)[..., None, None]
  z = jnp.swapaxes(a, -1, -2) / norm                            # [..., M, M]
  for _ in range(iterations):
    az = a @ z                                                  # [..., M, M]
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z
