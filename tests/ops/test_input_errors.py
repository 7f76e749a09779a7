"""Bad input raises ValueError naming the argument and the shapes seen."""

import re

import jax
import jax.numpy as jnp
import pytest

from lin_attn_jax import ops
from lin_attn_jax.ops.registry import StepForm
from lin_attn_jax.testing import op_calls

B, T, H, K, V = 2, 10, 3, 4, 5
q = jnp.ones((B, T, H, K))
v = jnp.ones((B, T, H, V))
g_scalar = -jnp.ones((B, T, H))
g_channel = -jnp.ones((B, T, H, K))


@pytest.mark.parametrize("form", [ops.chunk_gla, ops.parallel_gla,
                                  ops.recurrent_gla, ops.naive_recurrent_gla])
@pytest.mark.parametrize("args, match", [
    ((q[0], q[0], v[0], g_channel[0]), r"q must have rank 4"),
    ((q, q[:, :5], v, g_channel), r"k must have the shape of q"),
    ((q, jnp.ones((B, T, H, K + 1)), v, g_channel), r"k must have the shape"),
    ((q, q, v[:, :, :2], g_channel), r"v must agree with q"),
    ((q, q, v[:1], g_channel), r"v must agree with q"),
    ((q, q, v, g_scalar), r"g must have shape \(2, 10, 3, 4\)"),
    ((q, q, v, -g_channel), r"g holds log-decays, which must be <= 0"),
    ((q.astype(jnp.int32), q, v, g_channel), r"q must have a floating dtype"),
])
def test_gla_bad_inputs(form, args, match):
  with pytest.raises(ValueError, match=match):
    form(*args)


def test_bad_state_and_segments():
  with pytest.raises(ValueError, match=r"initial_state must have shape "
                     r"\(2, 3, 4, 5\)"):
    ops.chunk_gla(q, q, v, g_channel, initial_state=jnp.zeros((B, H, V, K)))
  with pytest.raises(ValueError, match="segment_ids must have shape"):
    ops.chunk_gla(q, q, v, g_channel, segment_ids=jnp.zeros((B, T + 1),
                                                            jnp.int32))
  with pytest.raises(ValueError, match="segment_ids must have an integer"):
    ops.chunk_gla(q, q, v, g_channel, segment_ids=jnp.zeros((B, T)))


def test_simple_gla_gate_arguments():
  with pytest.raises(ValueError, match="give g or g_gamma, not both"):
    ops.chunk_simple_gla(q, q, v, g=g_scalar, g_gamma=-jnp.ones((H,)))
  with pytest.raises(ValueError, match=r"g must have shape \(2, 10, 3\)"):
    ops.chunk_simple_gla(q, q, v, g=g_channel)
  with pytest.raises(ValueError, match=r"g_gamma must have shape \(3,\)"):
    ops.chunk_simple_gla(q, q, v, g_gamma=-jnp.ones((H + 1,)))


def test_step_errors():
  with pytest.raises(ValueError, match=r"state must have shape"):
    ops.gla_step(q[:, 0], q[:, 0], v[:, 0], g_channel[:, 0],
                 jnp.zeros((B, H, K, K)))
  with pytest.raises(ValueError, match=r"reset must have shape"):
    ops.simple_gla_step(q[:, 0], q[:, 0], v[:, 0], g_scalar[:, 0],
                        reset=jnp.zeros((B + 1,), bool))


def test_chunk_size_errors():
  with pytest.raises(ValueError, match="chunk_size must be a positive"):
    ops.chunk_simple_gla(q, q, v, g_scalar, chunk_size=0)
  with pytest.raises(ValueError, match="sub_chunk_size .* must divide"):
    ops.chunk_gated_linear(q, q, v, g_scalar, chunk_size=24,
                           sub_chunk_size=16)


def test_concrete_gate_captured_by_jit():
  """A concrete gate closed over inside jit is checked, not traced."""
  import jax
  o = jax.jit(lambda x: ops.chunk_simple_gla(x, x, x, g_scalar)[0])(q)
  assert o.shape == (B, T, H, K)
  positive = -g_scalar
  with pytest.raises(ValueError, match="must be <= 0"):
    jax.jit(lambda x: ops.chunk_simple_gla(x, x, x, positive)[0])(q)


# Every form of every op spec and every op's step, except the specs' own
# scans of a step (test scaffolding; the step is checked directly).
RANK_CALLS = [c for c in op_calls() if not isinstance(c.fn, StepForm)]


@pytest.mark.parametrize("call", RANK_CALLS, ids=[c.name for c in RANK_CALLS])
def test_wrong_rank_names_the_argument(call):
  """Each array argument in turn gets one axis too many, then one too few:
  the ValueError names that argument (before ' must ...'), whatever the
  other arguments are. Traced abstractly: nothing runs."""
  for name, x in call.arrays.items():
    if not isinstance(x, jax.ShapeDtypeStruct):
      continue                       # a pytree state (a KV cache)
    for shape in ((1,) + x.shape, x.shape[1:]):
      arrays = dict(call.arrays, **{name: jax.ShapeDtypeStruct(shape,
                                                               x.dtype)})
      with pytest.raises(ValueError) as error:
        jax.eval_shape(call.run, arrays)
      subject = str(error.value).split(" must ")[0]
      assert re.search(rf"\b{re.escape(name)}\b", subject), (
          f"{call.name}: {name} of shape {shape} gave: {error.value}")
