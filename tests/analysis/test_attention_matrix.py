"""``attention_matrix``: for every causal mixer, the matrix applied to the
values is the op's output before the output projection; it is causal and
zero across documents."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lin_attn_jax.analysis import (attention_matrix, mixing_output,
                                   row_sparsity)
from lin_attn_jax.layers import MIXERS

D, H, T = 16, 2, 10
OPTIONS = {
    "sliding_window_attn": {"window_size": 4},
    "based": {"window_size": 4, "feature_dim": 4},
    "sparse_attn": {"stride": 3},
    "gated_deltanet": {"zero_init_gate": False},
    "rwkv7": {"zero_init_output": False},
    "performer": {"nb_features": 8},
    "h3": {"d_state": 4, "shift_size": 3},
    "mamba": {"d_state": 4, "expand": 1},
    "mamba2": {"d_state": 4},
    "rg_lru": {"lru_width": 8},
    "hgrn2": {"expand_ratio": 4},
    "nsa": {"block_size": 2, "block_counts": 2, "window_size": 3},
    "moba": {"block_size": 2, "top_k": 2},
}
# Linformer and the encoder-only mixers are not causal; Gated DeltaProduct
# writes N values per token; Falcon-H1's parallel mixer sums two ops with
# values of their own.
CAUSAL = sorted(name for name, cls in MIXERS.items()
                if cls.causal and name not in ("gated_deltaproduct",
                                               "falcon_h1_parallel"))
# Two documents in row 0 (the second starts at token 6), one in row 1.
SEGMENTS = jnp.array([[0] * 6 + [1] * (T - 6), [0] * T])


def build(name):
  return MIXERS[name](D, H, rngs=nnx.Rngs(0), **OPTIONS.get(name, {}))


def inputs():
  return jax.random.normal(jax.random.key(1), (2, T, D))


@nnx.jit
def matrix_and_output(mixer, x, segment_ids):
  """``attention_matrix`` and ``mixing_output`` in one compiled program
  (run op by op, each mixer's many small operations compile one by one)."""
  return (attention_matrix(mixer, x, segment_ids),
          mixing_output(mixer, x, segment_ids))


# The largest programs, of mixers whose matrix another mixer's code builds
# the same way (Comba's by the delta rule's, log-linear Mamba-2's and
# Mamba-3's by Mamba-2's, Based's by linear attention's and the sliding
# window's), are slow.
SLOW = ("comba", "log_linear_mamba2", "mamba3", "based")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow if n in SLOW else ())
    for n in CAUSAL])
def test_matrix_times_values_is_the_mixing_output(name):
  mixer = build(name)
  x = inputs()
  m, (values, output) = matrix_and_output(mixer, x, SEGMENTS)
  assert m.shape[:1] + m.shape[2:] == (2, T, T)
  assert m.shape[1] == values.shape[1] == output.shape[1]
  mixed = jnp.einsum("bhij,bhjc->bhic", m, values)
  scale = float(jnp.max(jnp.abs(output)))
  assert scale > 0
  np.testing.assert_allclose(mixed, output, atol=1e-5 * scale, rtol=0)
  # Causal, and nothing crosses the document boundary of row 0.
  assert float(jnp.max(jnp.abs(jnp.triu(m, 1)))) == 0
  assert float(jnp.max(jnp.abs(m[0, :, 6:, :6]))) == 0
  assert float(jnp.max(jnp.abs(m[1, :, 6:, :6]))) > 0


def test_softmax_rows_are_the_attention_weights():
  mixer = build("softmax_attn")
  x = inputs()
  m = attention_matrix(mixer, x)
  np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-6)
  values, output = mixing_output(mixer, x)
  # The mixing output is what the output projection reads.
  o = jnp.swapaxes(output, 1, 2).reshape(2, T, D)
  np.testing.assert_allclose(mixer.o_proj(o), mixer(x, mode="parallel"),
                             atol=1e-5)


def test_under_jit_with_traced_parameters():
  mixer = build("gla")
  graphdef, state = nnx.split(mixer)
  x = inputs()

  @jax.jit
  def matrix(state, x):
    return attention_matrix(nnx.merge(graphdef, state), x)

  np.testing.assert_allclose(matrix(state, x), attention_matrix(mixer, x),
                             atol=1e-6)


def test_linformer_has_no_causal_matrix():
  with pytest.raises(ValueError, match="not causal"):
    attention_matrix(build("linformer"), inputs())


def test_gated_deltaproduct_has_no_token_matrix():
  with pytest.raises(ValueError, match="N values per token"):
    attention_matrix(build("gated_deltaproduct"), inputs())


def test_falcon_h1_parallel_has_no_single_matrix():
  with pytest.raises(ValueError, match="two mixers"):
    attention_matrix(build("falcon_h1_parallel"), inputs())


def test_row_sparsity_of_uniform_and_one_hot_rows():
  uniform = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
  one_hot = np.eye(4)
  np.testing.assert_allclose(row_sparsity(uniform)[1:], 1.0)
  np.testing.assert_allclose(row_sparsity(one_hot)[1:],
                             1 / np.sqrt(np.arange(2, 5)))
  assert np.isnan(row_sparsity(one_hot)[0])


def test_row_sparsity_without_the_diagonal():
  # A skip on the diagonal over a uniform past: only the past is measured.
  m = np.tril(np.ones((5, 5)), -1) + 10 * np.eye(5)
  np.testing.assert_allclose(row_sparsity(m, diagonal=False)[2:], 1.0)
  assert np.all(row_sparsity(m)[2:] < 0.7)
