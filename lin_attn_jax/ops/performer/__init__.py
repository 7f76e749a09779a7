"""Performer's FAVOR+ attention (Choromanski et al. 2021,
https://arxiv.org/abs/2009.14794) as one op: the positive random features
of q and k and normalized causal linear attention over them.

``chunk_favor_attn`` takes raw q and k; its XLA form
(``ops/performer/heads_first.py``) makes the ``M``-wide features heads first, in
the layout of its matmuls. The Pallas kernels and the context-parallel split
run ``chunk_linear_attn`` on the same features.
"""

from lin_attn_jax.ops.performer.chunk import chunk_favor_attn, favor_features

__all__ = ["chunk_favor_attn", "favor_features"]
