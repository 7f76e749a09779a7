"""Log-linear attention: every form against the naive Fenwick recurrence,
and the naive recurrence against flash-linear-attention's ``naive.py``.

The registry's spec is checked through ``lin_attn_jax.testing.check_forms``:
outputs, final states and the gradients of every input with random
cotangents, at an odd length over several chunks, with packed documents, an
initial state, offsets (positions not aligned with the chunks) and fewer
levels than the positions need (the top level merging the buckets above
it), strong gates, K != V, in float32 and bfloat16.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops import registry
from lin_attn_jax.ops.log_linear_attn.inputs import level_of, merge_level

SPEC = registry.get_spec("log_linear_attn")
FIXTURE = (pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "ops"
           / "log_linear_attn.npz")
# 37 tokens in chunks of 8 (5 chunks, the last partial); 7 levels.
DIMS = registry.Dims(length=37, dim_k=8, dim_v=12)


def test_forms_match_naive_float32():
  testing.check_forms(SPEC, dims=DIMS, strong=True, chunk_size=8,
                      one_program=True)


@pytest.mark.slow
def test_forms_match_naive_bfloat16():
  testing.check_forms(SPEC, dims=DIMS, strong=True, chunk_size=8,
                      dtype=jnp.bfloat16, forms=("chunk", "recurrent"),
                      one_program=True)


def test_levels_are_the_fenwick_buckets():
  """Level of a pair: 0 on the diagonal, then the highest differing bit
  (fla's ``construct_level_mask``), capped at ``L - 1``; the merge before
  position p is the carry of p - 1 -> p."""
  p = jnp.arange(16)
  levels = level_of(p[:, None], p[None, :], 16)
  assert int(levels[5, 5]) == 0 and int(levels[5, 4]) == 1
  assert int(levels[6, 4]) == 2 and int(levels[8, 7]) == 4
  assert int(level_of(8, 7, 3)) == 2
  np.testing.assert_array_equal(merge_level(jnp.array([0, 1, 2, 4, 6, 8]),
                                            4), [3, 1, 2, 3, 2, 3])


@pytest.mark.parametrize("case", [pytest.param("gentle", marks=pytest.mark.slow), "strong"])
def test_naive_matches_fla_reference(case):
  """``naive_recurrent_log_linear_attn`` against fla's quadratic naive form
  on the committed fixture (``python -m experiments.make_op_fixtures
  --only=log_linear_attn``): outputs and the gradients of every input."""
  data = np.load(FIXTURE)
  x = {name[len(case) + 1:]: data[name] for name in data.files
       if name.startswith(case + "_")}
  names = ("q", "k", "v", "g", "level_scales")

  def loss(*args):
    o, _ = ops.naive_recurrent_log_linear_attn(*args)
    return jnp.sum(o * x["do"]), o

  grads, o = jax.grad(loss, argnums=tuple(range(5)), has_aux=True)(
      *(jnp.asarray(x[n]) for n in names))
  assert testing.rel_rms(o, x["o"]) <= 1e-5
  for name, grad in zip(names, grads):
    assert testing.rel_rms(grad, x["d" + name]) <= 1e-5, name


@pytest.mark.slow
def test_continuing_from_a_state_equals_one_call():
  """A sequence cut in two: the second half from the first's final state,
  at ``offset`` = the first half's length, in the chunk form."""
  inputs = testing.make_inputs(SPEC, registry.Dims(length=29, dim_k=4,
                                                   dim_v=6))
  inputs.update(offset=0, initial_state=None, segment_ids=None)
  whole, final = ops.chunk_log_linear_attn(**inputs, output_final_state=True,
                                           chunk_size=4)
  cut = 13
  first = {n: x[:, :cut] if n in ("q", "k", "v", "g", "level_scales") else x
           for n, x in inputs.items()}
  second = {n: x[:, cut:] if n in ("q", "k", "v", "g", "level_scales") else x
            for n, x in inputs.items()}
  o1, s1 = ops.chunk_log_linear_attn(**first, output_final_state=True,
                                     chunk_size=4)
  second.update(initial_state=s1, offset=cut)
  o2, s2 = ops.chunk_log_linear_attn(**second, output_final_state=True,
                                     chunk_size=4)
  assert testing.rel_rms(jnp.concatenate([o1, o2], axis=1), whole) <= 1e-5
  assert testing.rel_rms(s2, final) <= 1e-5


B, T, H, K, V, L = 2, 5, 3, 4, 6, 4
Q = jnp.ones((B, T, H, K))
VALUES = jnp.ones((B, T, H, V))
G = -jnp.ones((B, T, H))
LAM = jnp.ones((B, T, H, L))


@pytest.mark.parametrize("change, match", [
    (dict(g=G[:, :4]), r"g must have shape \(2, 5, 3\)"),
    (dict(g=-G), r"g holds log-decays, which must be <= 0"),
    (dict(level_scales=LAM[:, :4]), r"level_scales must have shape"),
    (dict(level_scales=LAM[..., 0]), r"level_scales must have rank 4"),
    (dict(initial_state=jnp.ones((B, H, K, V))),
     r"initial_state must have shape \(2, 3, 4, 4, 6\)"),
    (dict(offset=-1), r"offset must be >= 0"),
    (dict(offset=jnp.zeros((B + 1,), jnp.int32)), r"offset must have shape"),
    (dict(offset=1.5), r"offset must be an int"),
])
@pytest.mark.parametrize("form", [ops.chunk_log_linear_attn,
                                  ops.naive_recurrent_log_linear_attn])
def test_bad_input_names_the_argument(form, change, match):
  arguments = dict(q=Q, k=Q, v=VALUES, g=G, level_scales=LAM)
  arguments.update(change)
  with pytest.raises(ValueError, match=match):
    form(**arguments)


def test_bad_step_input_names_the_argument():
  with pytest.raises(ValueError, match=r"state must have shape"):
    ops.log_linear_attn_step(Q[:, 0], Q[:, 0], VALUES[:, 0], G[:, 0],
                             LAM[:, 0], jnp.zeros((B, H, K, V)))
  with pytest.raises(ValueError, match=r"reset must have shape"):
    ops.log_linear_attn_step(Q[:, 0], Q[:, 0], VALUES[:, 0], G[:, 0],
                             LAM[:, 0], reset=jnp.zeros((B + 1,), bool))
