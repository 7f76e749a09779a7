"""The mLSTM's definition against transformers' native xLSTM code, and the
op's own properties (the forms against each other are in
test_gated_linear.py, the split over devices in test_context_parallel.py).
"""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing

FIXTURE = (pathlib.Path(__file__).parent.parent / "fixtures" / "ops"
           / "mlstm.npz")
# float32 against the reference's float64 on the same float32 inputs.
FIXTURE_TOL = 2e-5
INPUTS = ("q", "k", "v", "i", "f", "c0", "n0", "m0")


@functools.lru_cache(maxsize=None)
def _with_grads(form):
  """``form`` from the state ``(c0, n0, m0)``: its ``h`` and final ``(C, n,
  m)``, and the gradients of ``sum(h dh) + sum(C dC) + sum(n dn) + sum(m
  dm)`` with respect to every input."""
  def loss(x, cotangents):
    state = ops.pack_mlstm_state(x["c0"], x["n0"], x["m0"])
    h, final = form(x["q"], x["k"], x["v"], x["i"], x["f"],
                    initial_state=state, output_final_state=True)
    out = dict(zip(("h", "c", "n", "m"),
                   (h, *ops.unpack_mlstm_state(final))))
    total = sum(jnp.sum(out[n] * cotangents["d" + n]) for n in out)
    return total, out

  return jax.jit(jax.grad(loss, has_aux=True))


@pytest.mark.parametrize("case, form", [
    ("gentle", "naive"), ("strong", "naive"), ("chunkwise", "naive"),
    ("chunkwise", "chunk")])
def test_matches_transformers_native_mlstm(case, form):
  """``experiments.make_op_fixtures``' ``mlstm``: transformers' token-by-token
  (``gentle``, ``strong``) and chunkwise (``chunkwise``) mLSTM; outputs,
  final ``(C, n, m)`` and the gradients of every input."""
  data = np.load(FIXTURE)
  x = {n: jnp.asarray(data[f"{case}_{n}"]) for n in INPUTS}
  cotangents = {n: jnp.asarray(data[f"{case}_{n}"])
                for n in ("dh", "dc", "dn", "dm")}
  fn = {"naive": ops.naive_recurrent_mlstm,
        "chunk": functools.partial(ops.chunk_mlstm, chunk_size=8)}[form]
  grads, out = _with_grads(fn)(x, cotangents)
  got = {**out, **{"d" + n: grads[n] for n in INPUTS}}
  errors = {n: testing.rel_rms(got[n], data[f"{case}_{n}"]) for n in got}
  assert max(errors.values()) <= FIXTURE_TOL, errors


def test_max_state_is_the_reference_recurrence():
  """The chunk form's final ``m`` is ``m_t = max(log f_t + m_{t-1}, i_t)``
  run token by token in NumPy, with a reset at the document start."""
  rng = np.random.default_rng(0)
  b, t, h, d = 1, 12, 1, 4
  q, k, v = (jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
             for _ in range(3))
  i = rng.standard_normal((b, t, h)).astype(np.float32) * 5
  f = rng.standard_normal((b, t, h)).astype(np.float32)
  ids = jnp.asarray([[0] * 5 + [1] * 7])
  _, state = jax.jit(functools.partial(
      ops.chunk_mlstm, chunk_size=4, output_final_state=True))(
          q, k, v, i, f, segment_ids=ids)
  m = 0.0
  for step in range(5, t):
    log_f = -np.logaddexp(0.0, -f[0, step, 0])
    m = max(log_f + m, i[0, step, 0])
  np.testing.assert_allclose(ops.unpack_mlstm_state(state)[2][0, 0], m,
                             rtol=1e-6)


def test_state_packing_round_trips():
  c = jnp.arange(2 * 3 * 4 * 5, dtype=jnp.float32).reshape(2, 3, 4, 5)
  n = -jnp.ones((2, 3, 4))
  m = jnp.arange(6, dtype=jnp.float32).reshape(2, 3, 1)
  state = ops.pack_mlstm_state(c, n, m)
  assert state.shape == (2, 3, 4, 7)
  for got, want in zip(ops.unpack_mlstm_state(state), (c, n, m[..., 0])):
    np.testing.assert_array_equal(got, want)


def test_bad_gates_raise():
  q = k = v = jnp.ones((1, 8, 2, 4))
  with pytest.raises(ValueError, match="i must have shape"):
    ops.chunk_mlstm(q, k, v, jnp.zeros((1, 8, 3)), jnp.zeros((1, 8, 2)))
  with pytest.raises(ValueError, match="initial_state must have shape"):
    ops.chunk_mlstm(q, k, v, jnp.zeros((1, 8, 2)), jnp.zeros((1, 8, 2)),
                    initial_state=jnp.zeros((1, 2, 4, 4)))
  with pytest.raises(ValueError, match="f must have shape"):
    ops.mlstm_step(q[:, 0], k[:, 0], v[:, 0], jnp.zeros((1, 2)),
                   jnp.zeros((1, 8, 2)))
