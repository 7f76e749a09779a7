"""Mamba-3 MIMO against the reference's token-by-token code
(state-spaces/mamba's ``mamba3_MIMO_step_ref``), and the op's own
properties (the forms against each other are in test_gated_linear.py, the
split over devices in test_context_parallel.py)."""

import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.mamba3 import (interleave_halves,
                                     mimo_from_reference_state,
                                     mimo_to_reference_state)
from lin_attn_jax.ops.mamba3.inputs import rotate

FIXTURE = (pathlib.Path(__file__).parent.parent / "fixtures" / "ops"
           / "mamba3_mimo.npz")
# float32 against the reference's float64 on the same float32 inputs.
FIXTURE_TOL = 2e-5
DIFF = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles",
        "MIMO_V", "MIMO_O", "D", "Z", "MIMO_Z")
STATE = ("angle0", "ssm0", "k0", "v0")


def _ranks_last(x, bias):
  """``[B, T, R, H, N]`` plus ``[H, R, N]`` -> ``[B, T, H, R, N]``."""
  return jnp.swapaxes(x, 2, 3) + bias


@functools.lru_cache(maxsize=None)
def _with_grads(form):
  """``form`` inside the reference's composition (biases, ``v_r = V
  MIMO_V_r``, ``D``, the gate ``silu(Z MIMO_Z_r)``, the sum over ranks
  with ``MIMO_O``): its output, final state and the gradients of
  ``sum(out * dout)``."""
  def loss(x, state, dout):
    q = _ranks_last(x["Q"], x["Q_bias"])
    k = _ranks_last(x["K"], x["K_bias"])
    v = jnp.einsum("bthp,hrp->bthrp", x["V"], x["MIMO_V"])
    g, dt, trap = (jnp.swapaxes(x[n], 1, 2) for n in ("ADT", "DT", "Trap"))
    y, final = form(q, k, v, g, dt, trap, x["Angles"],
                    initial_state=mimo_from_reference_state(*state),
                    output_final_state=True)
    y = (y + x["D"][:, None, None] * v) * jax.nn.silu(
        jnp.einsum("bthp,hrp->bthrp", x["Z"], x["MIMO_Z"]))
    out = jnp.einsum("bthrp,hrp->bthp", y, x["MIMO_O"])
    return jnp.sum(out * dout), (out, final)

  return jax.jit(jax.grad(loss, has_aux=True))


@pytest.mark.parametrize("case, form", [
    pytest.param("gentle", "naive", marks=pytest.mark.slow),
    ("strong", "naive"), ("gentle", "chunk")])
def test_matches_reference_step(case, form):
  """``experiments.make_op_fixtures``' ``mamba3_mimo``: outputs, final
  states (in the reference's frame) and the gradients of every input."""
  data = np.load(FIXTURE)
  x = {n: jnp.asarray(data[f"{case}_{n}"]) for n in DIFF}
  state = tuple(jnp.asarray(data[f"{case}_{n}"]) for n in STATE)
  fn = {"naive": ops.naive_recurrent_mamba3_mimo,
        "chunk": functools.partial(ops.chunk_mamba3_mimo,
                                   chunk_size=8)}[form]
  grads, (out, final) = _with_grads(fn)(x, state,
                                         jnp.asarray(data[f"{case}_dout"]))
  ssm, k_last, v_last = mimo_to_reference_state(
      final, data[f"{case}_angle"], 3)
  got = {"out": out, "ssm": ssm, "k": k_last, "v": v_last,
         **{"d" + n: grads[n] for n in DIFF}}
  errors = {n: testing.rel_rms(got[n], data[f"{case}_{n}"]) for n in got}
  assert max(errors.values()) <= FIXTURE_TOL, errors


@pytest.mark.slow
def test_rank_one_is_siso():
  inputs = {n: jax.random.normal(jax.random.PRNGKey(i), s) for i, (n, s)
            in enumerate((("q", (1, 9, 2, 8)), ("k", (1, 9, 2, 8)),
                          ("v", (1, 9, 2, 4)), ("trap", (1, 9, 2)),
                          ("angles", (1, 9, 2, 2))))}
  dt = jax.nn.softplus(jax.random.normal(jax.random.PRNGKey(9), (1, 9, 2)))
  siso, s1 = ops.naive_recurrent_mamba3(**inputs, g=-dt, dt=dt,
                                        output_final_state=True)
  mimo, s2 = ops.chunk_mamba3_mimo(
      **{n: x[:, :, :, None] if n in "qkv" else x
         for n, x in inputs.items()}, g=-dt, dt=dt, output_final_state=True,
      chunk_size=4)
  np.testing.assert_allclose(mimo[:, :, :, 0], siso, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s2, s1, rtol=1e-5, atol=1e-5)


def test_interleaved_halves_turn_as_the_kernels_pairs():
  """The reference's MIMO kernels turn ``(i, i + N / 2)`` by ``phi_i``,
  ``i < A``; after ``interleave_halves`` the op's pairwise turn is that."""
  rng = np.random.default_rng(0)
  x, phi = rng.standard_normal((3, 16)), rng.uniform(0, 6, (3, 4))
  want = x.copy()
  want[:, :4] = x[:, :4] * np.cos(phi) - x[:, 8:12] * np.sin(phi)
  want[:, 8:12] = x[:, :4] * np.sin(phi) + x[:, 8:12] * np.cos(phi)
  got = rotate(interleave_halves(jnp.asarray(x, jnp.float32)),
               jnp.asarray(phi, jnp.float32))
  np.testing.assert_allclose(got, interleave_halves(jnp.asarray(
      want, jnp.float32)), atol=1e-5)


def test_state_round_trips():
  rng = np.random.default_rng(0)
  angle = jnp.asarray(rng.uniform(0, 2 * math.pi, (2, 3, 2)), jnp.float32)
  ssm, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((2, 3, 5, 8), (2, 3, 4, 8), (2, 3, 4, 5)))
  state = mimo_from_reference_state(angle, ssm, k, v)
  assert state.shape == (2, 3, 12, 9)
  for got, want in zip(mimo_to_reference_state(state, angle, 4),
                       (ssm, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_errors_name_the_argument():
  q = k = jnp.ones((1, 8, 2, 3, 8))
  v = jnp.ones((1, 8, 2, 3, 4))
  g = dt = trap = jnp.zeros((1, 8, 2))
  angles = jnp.zeros((1, 8, 2, 2))
  with pytest.raises(ValueError, match="k must have the shape of q"):
    ops.chunk_mamba3_mimo(q, k[:, :, :, :2], v, g, dt, trap, angles)
  with pytest.raises(ValueError, match="v "):
    ops.chunk_mamba3_mimo(q, k, v[:, :, :, :2], g, dt, trap, angles)
  with pytest.raises(ValueError, match="initial_state"):
    ops.chunk_mamba3_mimo(q, k, v, g, dt, trap, angles,
                          initial_state=jnp.zeros((1, 2, 9, 5)))
  with pytest.raises(ValueError, match="angles"):
    ops.mamba3_mimo_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], dt[:, 0],
                         trap[:, 0], jnp.zeros((1, 2, 5)))
