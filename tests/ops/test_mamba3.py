"""Mamba-3's definition against the reference's token-by-token code
(state-spaces/mamba's ``mamba3_siso_step_ref``), and the op's own
properties (the forms against each other are in test_gated_linear.py, the
split over devices in test_context_parallel.py)."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.mamba3 import from_reference_state, to_reference_state

FIXTURE = (pathlib.Path(__file__).parent.parent / "fixtures" / "ops"
           / "mamba3.npz")
# float32 against the reference's float64 on the same float32 inputs.
FIXTURE_TOL = 2e-5
DIFF = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles")
STATE = ("angle0", "ssm0", "k0", "v0")


@functools.lru_cache(maxsize=None)
def _with_grads(form):
  """``form`` on the reference's inputs (biases added, ``[B, H, T]`` gates
  transposed, the state converted): its output, final state and the
  gradients of ``sum(out * dout)``."""
  def loss(x, state, dout):
    q, k = x["Q"] + x["Q_bias"], x["K"] + x["K_bias"]
    g, dt, trap = (jnp.swapaxes(x[n], 1, 2) for n in ("ADT", "DT", "Trap"))
    out, final = form(q, k, x["V"], g, dt, trap, x["Angles"],
                      initial_state=from_reference_state(*state),
                      output_final_state=True)
    return jnp.sum(out * dout), (out, final)

  return jax.jit(jax.grad(loss, has_aux=True))


@pytest.mark.parametrize("case, form", [
    pytest.param("gentle", "naive", marks=pytest.mark.slow),
    ("strong", "naive"), ("gentle", "chunk")])
def test_matches_reference_step(case, form):
  """``experiments.make_op_fixtures``' ``mamba3``: outputs, final states
  (in the reference's frame) and the gradients of every input."""
  data = np.load(FIXTURE)
  x = {n: jnp.asarray(data[f"{case}_{n}"]) for n in DIFF}
  state = tuple(jnp.asarray(data[f"{case}_{n}"]) for n in STATE)
  fn = {"naive": ops.naive_recurrent_mamba3,
        "chunk": functools.partial(ops.chunk_mamba3, chunk_size=8)}[form]
  grads, (out, final) = _with_grads(fn)(x, state,
                                         jnp.asarray(data[f"{case}_dout"]))
  ssm, k_last, v_last = to_reference_state(final, data[f"{case}_angle"])
  got = {"out": out, "ssm": ssm, "k": k_last, "v": v_last,
         **{"d" + n: grads[n] for n in DIFF}}
  errors = {n: testing.rel_rms(got[n], data[f"{case}_{n}"]) for n in got}
  assert max(errors.values()) <= FIXTURE_TOL, errors


def test_state_round_trips():
  rng = np.random.default_rng(0)
  angle = jnp.asarray(rng.uniform(0, 6.28, (2, 3, 2)), jnp.float32)
  ssm, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((2, 3, 5, 8), (2, 3, 8), (2, 3, 5)))
  state = from_reference_state(angle, ssm, k, v)
  assert state.shape == (2, 3, 9, 6)
  for got, want in zip(to_reference_state(state, angle), (ssm, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_errors_name_the_argument():
  q = k = jnp.ones((1, 8, 2, 8))
  v = jnp.ones((1, 8, 2, 4))
  g = dt = trap = jnp.zeros((1, 8, 2))
  with pytest.raises(ValueError, match="angles"):
    ops.chunk_mamba3(q, k, v, g, dt, trap, jnp.zeros((1, 8, 2, 5)))
  with pytest.raises(ValueError, match="g holds log-decays"):
    ops.chunk_mamba3(q, k, v, jnp.ones((1, 8, 2)), dt, trap,
                     jnp.zeros((1, 8, 2, 2)))
  with pytest.raises(ValueError, match="initial_state"):
    ops.chunk_mamba3(q, k, v, g, dt, trap, jnp.zeros((1, 8, 2, 2)),
                     initial_state=jnp.zeros((1, 2, 8, 4)))
  with pytest.raises(ValueError, match="trap"):
    ops.mamba3_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], dt[:, 0],
                    jnp.zeros((1, 3)), jnp.zeros((1, 2, 2)))
