"""Decoding native sparse attention: one token in, one output out.

A step is ``nsa_extend`` on one token: the key and value go into the store
at their position; if the token completes a block, the block's mean is
pooled from the store's last ``l`` entries into the next slot; the query
attends to the ``N = max_length // l`` slots (compressed branch, masked to
the complete blocks of its document), ranks them, gathers the ``n``
chosen blocks' ``n l`` keys and values from the store (selected branch),
and attends to the ring buffer of the window. A step costs ``O(N H (K +
V) + n l H (K + V) + w H (K + V))``: linear in the context only through
the compressed blocks, ``1 / l`` of it.
"""

from __future__ import annotations

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.nsa.cache import NSACache, nsa_extend


def nsa_step(q, k, v, g_cmp, g_slc, g_swa, cache: NSACache, *,
             block_counts=16, scale=None, reset=None):
  """Appends one token to the cache and attends as ``parallel_nsa`` does.

  Args:
    q: ``[B, H, K]``; k: ``[B, Hkv, K]``; v: ``[B, Hkv, V]``.
    g_cmp, g_slc, g_swa: ``[B, H]``; ``g_swa`` None without a window.
    cache: from ``init_nsa_cache`` or a previous step.
    block_counts, scale: as in ``parallel_nsa``.
    reset: ``[B]`` bool, True where this token starts a new document.
  Returns:
    ``(o [B, H, V] in v's dtype, the updated cache)``.

  Example:
    >>> cache = init_nsa_cache(1, 2, 8, 8, max_length=16, block_size=4,
    ...                        window_size=4)
    >>> g = jnp.full((1, 4), 0.5)
    >>> o, cache = nsa_step(jnp.ones((1, 4, 8)), jnp.ones((1, 2, 8)),
    ...                     jnp.ones((1, 2, 8)), g, g, g, cache)
    >>> o.shape
    (1, 4, 8)
  """
  names = ("q", "k", "v", "g_cmp", "g_slc", "g_swa")
  layouts = ("[B, H, K]", "[B, Hkv, K]", "[B, Hkv, V]", "[B, H]", "[B, H]",
             "[B, H]")
  tokens = (q, k, v, g_cmp, g_slc, g_swa)
  for name, x, layout in zip(names, tokens, layouts):
    if x is not None:
      checks.check_rank(name, x, layout.count(",") + 1, layout)
  o, cache = nsa_extend(*(None if x is None else x[:, None] for x in tokens),
                        cache, block_counts=block_counts, scale=scale,
                        reset=reset, chunk_size=1)
  return o[:, 0], cache
