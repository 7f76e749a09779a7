"""Mixers built with ``causal=False``: every token reads its whole document
in both directions, chunk and parallel modes agree, documents stay apart,
and a cache or the recurrent mode is refused (``Mixer.set_causal``)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.layers import MIXERS

NAMES = ("linear_attn", "performer", "retnet", "gla", "hgrn2", "mamba2",
         "mamba", "rg_lru", "softmax_attn", "sliding_window_attn")
OPTIONS = {"sliding_window_attn": {"window_size": 4}}
B, T, D, H = 2, 12, 16, 2


@functools.lru_cache(maxsize=None)
def _mixer(name):
  return MIXERS[name](D, H, rngs=nnx.Rngs(0), causal=False,
                      **OPTIONS.get(name, {}))


@functools.lru_cache(maxsize=None)
def _run(name):
  graph, state = nnx.split(_mixer(name))

  @functools.partial(jax.jit, static_argnames="mode")
  def run(state, x, segment_ids, mode):
    return nnx.merge(graph, state)(x, segment_ids=segment_ids, mode=mode)

  return functools.partial(run, state)


@pytest.mark.parametrize("name", NAMES)
def test_reads_both_ways_within_documents(name):
  assert MIXERS[name].causal and not _mixer(name).causal
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, D))
  ids = jnp.asarray([[1] * 8 + [2] * 4, [1] * 12])
  run = _run(name)
  y = run(x, ids, "chunk")
  np.testing.assert_allclose(y, run(x, ids, "parallel"), rtol=2e-4,
                             atol=2e-5)
  # A change at token 6 reaches token 5 (before it, same document) and no
  # token of the second document of row 0.
  changed = run(x.at[:, 6].add(1.0), ids, "chunk")
  moved = jnp.abs(changed - y).max(-1)                          # [B, T]
  assert float(moved[0, 5]) > 1e-4 and float(moved[1, 3]) > 1e-4
  np.testing.assert_allclose(moved[0, 8:], 0.0, atol=1e-6)


def test_a_cache_and_the_recurrent_mode_are_refused():
  mixer = _mixer("gla")
  x = jnp.zeros((1, 4, D))
  with pytest.raises(ValueError, match="not causal"):
    mixer.init_cache(1, 8)
  with pytest.raises(ValueError, match="not causal"):
    mixer(x, mode="recurrent")
  with pytest.raises(ValueError, match="causal must be a bool"):
    MIXERS["gla"](D, H, rngs=nnx.Rngs(0), causal="no")
