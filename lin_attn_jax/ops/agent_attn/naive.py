"""Agent Attention, its one form (see the package docstring)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lin_attn_jax.ops.common import checks
from lin_attn_jax.ops.common.pooling import (mean_pool, poison_rows,
                                             whole_row_inputs)
from lin_attn_jax.ops.softmax_attn.inputs import default_scale

_F32 = jnp.float32

_POOLED = "its agent tokens pool the queries and read every key"


def agent_attn(q, k, v, *, agent_num: int, scale=None, agent_bias=None,
               query_bias=None, segment_ids=None, causal=False):
  """Agent Attention (non-causal by construction).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    agent_num: ``N``, the agent tokens (the queries' adaptive average pool
      to ``N`` positions, ``mean_pool_matrix``).
    scale: score scale, ``K ** -0.5`` when None.
    agent_bias: ``[H, N, T]`` added to the agents' scores on the keys, or
      None. query_bias: ``[H, T, N]`` added to the queries' scores on the
      agents, or None.
    segment_ids: ``[B, T]`` or None; more than one document in a row
      raises ``ValueError`` (concrete ids) or gives NaN in that row (traced
      ids), see the package docstring.
    causal: must be False (True raises ``ValueError``); so must a current
      mesh's ``"sequence"`` axis be of size 1.
  Returns:
    ``o [B, T, H, V]`` in v's dtype; scores, softmaxes and sums in float32.

  Example:
    >>> q = k = v = jnp.ones((1, 64, 2, 8))
    >>> agent_attn(q, k, v, agent_num=16).shape
    (1, 64, 2, 8)
  """
  (b, t, h, dk), bad_rows = whole_row_inputs(
      "Agent Attention", q, k, v, segment_ids=segment_ids, causal=causal,
      pooled=_POOLED)
  checks.positive_int("agent_num", agent_num)
  n = agent_num
  for name, x, shape, layout in (("agent_bias", agent_bias, (h, n, t),
                                  "[H, N, T]"),
                                 ("query_bias", query_bias, (h, t, n),
                                  "[H, T, N]")):
    if x is not None:
      checks.check_float(name, x)
      checks.check_shape(name, x, shape, layout)
  scale = default_scale(scale, dk)
  qf = jnp.asarray(q, _F32)
  agents = mean_pool(qf, n)                                     # [B, N, H, K]
  s_agent = scale * jnp.einsum("bnhk,bthk->bhnt", agents, k,
                               preferred_element_type=_F32)     # [B, H, N, T]
  if agent_bias is not None:
    s_agent = s_agent + jnp.asarray(agent_bias, _F32)
  agent_v = jnp.einsum("bhnt,bthv->bnhv", jax.nn.softmax(s_agent, axis=-1), v,
                       preferred_element_type=_F32)             # [B, N, H, V]
  s_query = scale * jnp.einsum("bthk,bnhk->bhtn", qf, agents,
                               preferred_element_type=_F32)     # [B, H, T, N]
  if query_bias is not None:
    s_query = s_query + jnp.asarray(query_bias, _F32)
  o = jnp.einsum("bhtn,bnhv->bthv", jax.nn.softmax(s_query, axis=-1),
                 agent_v, preferred_element_type=_F32)          # [B, T, H, V]
  return poison_rows(o, bad_rows).astype(v.dtype)
