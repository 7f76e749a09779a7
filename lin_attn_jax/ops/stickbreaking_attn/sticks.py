r"""The stick of one query, broken over keys in position order, in log space.

For a query ``i`` and its visible keys ``j`` (before it, or up to it with
``attend_current``; in its document), with ``z_ij = scale q_i . k_j``:

    A_ij = sigmoid(z_ij) prod_{l visible, l > j} (1 - sigmoid(z_il))
    log A_ij = log_sigmoid(z_ij) - sum_{l visible, l > j} softplus(z_il)

since ``log(1 - sigmoid(z)) = -softplus(z)``. The nearest key breaks the
stick first; what no key takes is ``rem_i = exp(-sum_{l visible}
softplus(z_il))``. Every term is a sum of non-negative ``softplus`` values,
so the logs are ``<= 0`` and ``exp`` of them never overflows, however
saturated the logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def break_sticks(z, visible, taken=None):
  """Log weights of the keys on the last axis of ``z``, in position order.

  Args:
    z: ``[..., S]`` float32 logits; the keys along the last axis are in
      increasing position (invisible ones anywhere among them).
    visible: bool, broadcastable to ``z``.
    taken: ``[...]`` float32, ``sum softplus(z)`` over the visible keys
      after the last one of the axis (the nearer keys already walked), or
      None for none.
  Returns:
    ``(log_a [..., S], taken [...])``: ``log A`` (``-inf`` where not
    visible) and ``taken`` plus the ``softplus`` sum of this axis's
    visible keys.
  """
  spent = jnp.where(visible, jax.nn.softplus(z), 0.0)          # [..., S]
  # Suffix sums: inclusive from the end, then shifted by one key, so that
  # a key's own softplus is never added and subtracted again.
  inclusive = jax.lax.cumsum(spent, axis=spent.ndim - 1, reverse=True)
  after = jnp.concatenate([inclusive[..., 1:],
                           jnp.zeros_like(inclusive[..., :1])], axis=-1)
  if taken is not None:
    after = after + taken[..., None]
  log_a = jnp.where(visible, jax.nn.log_sigmoid(z) - after, -jnp.inf)
  total = inclusive[..., 0] if taken is None else taken + inclusive[..., 0]
  return log_a, total
