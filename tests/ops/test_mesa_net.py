"""MesaNet's definition against fla's naive code, the implicit gradient of
the solve, and the op's own properties (the forms against each other are in
test_gated_linear.py, the split over devices in test_context_parallel.py).
"""

import functools
import importlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.mesa_net import cg
from lin_attn_jax.ops.registry import Dims, get_spec

FIXTURE = (pathlib.Path(__file__).parent.parent / "fixtures" / "ops"
           / "mesa_net.npz")
ARGS = ("q", "k", "v", "g", "beta", "lamb")
# float32 against fla's float32 torch code: the same CG, summed in
# another order.
CG_TOL = 1e-5
# Against the exact solve at queries of norm 1e3 (where CG converges to a
# relative 3e-6, see make_op_fixtures' mesa_net), float32 on both sides.
EXACT_TOL = 3e-5


def _data(case):
  data = np.load(FIXTURE)
  return {n[len(case) + 1:]: jnp.asarray(data[n]) for n in data.files
          if n.startswith(case + "_")}


def _state(x):
  return ops.pack_mesa_net_state(x["h_kk0"], x["h_kv0"])


@pytest.mark.parametrize("form", ["naive", pytest.param("chunk", marks=pytest.mark.slow)])
def test_matches_fla_naive_cg(form):
  """``naive_mesa_net_CG``: outputs and final states."""
  x = _data("cg")
  fn = {"naive": ops.naive_recurrent_mesa_net,
        "chunk": functools.partial(ops.chunk_mesa_net, chunk_size=8)}[form]
  o, state = jax.jit(functools.partial(fn, output_final_state=True))(
      *(x[n] for n in ARGS), initial_state=_state(x))
  h_kk, h_kv = ops.unpack_mesa_net_state(state)
  errors = {"o": testing.rel_rms(o, x["o"]),
            "h_kk": testing.rel_rms(h_kk, x["h_kk"]),
            "h_kv": testing.rel_rms(h_kv, x["h_kv"])}
  assert max(errors.values()) <= CG_TOL, errors


def test_step_matches_fla_decoding():
  """``naive_mesa_net_decoding_one_step`` token by token, with the
  reference decoding's start (``cg_start="diagonal"``)."""
  x = _data("cg")
  ref = _data("decoding")
  step = jax.jit(functools.partial(ops.mesa_net_step, cg_start="diagonal"))
  state, outs = _state(x), []
  for t in range(x["q"].shape[1]):
    o_t, state = step(*(x[n][:, t] for n in ARGS[:5]), x["lamb"], state)
    outs.append(o_t)
  h_kk, h_kv = ops.unpack_mesa_net_state(state)
  errors = {"o": testing.rel_rms(jnp.stack(outs, 1), ref["o"]),
            "h_kk": testing.rel_rms(h_kk, ref["h_kk"]),
            "h_kv": testing.rel_rms(h_kv, ref["h_kv"])}
  assert max(errors.values()) <= CG_TOL, errors


def test_implicit_gradient_matches_exact_solve():
  """``naive_mesa_net_exact`` (``torch.linalg.solve``) and its autograd:
  outputs, final states and every gradient. The exact solve reads
  ``H^kk`` by columns (``H x = q``), the forms by rows (``H^T x``), so its
  gradient of ``H^kk_0`` is the transpose of theirs."""
  x = _data("exact")

  def loss(args, h_kk0, h_kv0):
    o, state = ops.naive_recurrent_mesa_net(
        *args, initial_state=ops.pack_mesa_net_state(h_kk0, h_kv0),
        output_final_state=True)
    h_kk, h_kv = ops.unpack_mesa_net_state(state)
    total = (jnp.sum(o * x["do"]) + jnp.sum(h_kk * x["dh_kk"])
             + jnp.sum(h_kv * x["dh_kv"]))
    return total, (o, h_kk, h_kv)

  (d_args, d_kk0, d_kv0), (o, h_kk, h_kv) = jax.jit(
      jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(
          tuple(x[n] for n in ARGS), x["h_kk0"], x["h_kv0"])
  got = {"o": o, "h_kk": h_kk, "h_kv": h_kv, "dh_kv0": d_kv0,
         "dh_kk0": jnp.swapaxes(d_kk0, -1, -2),
         **{"d" + n: d for n, d in zip(ARGS, d_args)}}
  errors = {n: testing.rel_rms(a, x[n]) for n, a in got.items()}
  assert max(errors.values()) <= EXACT_TOL, errors


@pytest.mark.slow
def test_implicit_gradient_is_the_converged_unrolled_one():
  """``cg.solve``'s gradient (an adjoint CG solve) against backpropagation
  through every CG iteration, on dense systems where CG converges (right
  hand sides and cotangents of norm 1e3, see ``EXACT_TOL``), in symmetric
  directions of ``H`` (the implicit rule assumes a symmetric system)."""
  rng = np.random.default_rng(0)
  keys = rng.standard_normal((3, 2, 12, 6))
  keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
  h = jnp.asarray(np.einsum("bhjk,bhjl->bhkl", keys, keys), jnp.float32)
  lamb = jnp.asarray(rng.uniform(0.3, 1.0, (2, 6)), jnp.float32)
  b = jnp.asarray(1e3 * rng.standard_normal((3, 2, 6)), jnp.float32)
  w = jnp.asarray(1e3 * rng.standard_normal((3, 2, 6)), jnp.float32)

  def loss(solver, h, lamb, b):
    return jnp.sum(w * solver(cg.dense_matvec(h, lamb), b, 30))

  grads = {name: jax.jit(jax.grad(functools.partial(loss, solver),
                                  argnums=(0, 1, 2)))(h, lamb, b)
           for name, solver in (("implicit", cg.solve),
                                ("unrolled", cg.conjugate_gradient))}
  symmetric = lambda d: d + jnp.swapaxes(d, -1, -2)
  implicit, unrolled = grads["implicit"], grads["unrolled"]
  errors = [testing.rel_rms(symmetric(implicit[0]), symmetric(unrolled[0])),
            testing.rel_rms(implicit[1], unrolled[1]),
            testing.rel_rms(implicit[2], unrolled[2])]
  assert max(errors) <= 1e-4, errors


@pytest.mark.slow
def test_chunk_solve_over_groups_of_chunks(monkeypatch):
  """Long sequences solve groups of chunks one after the other
  (``lax.map``); here groups of 4 chunks of 8 tokens, the last group
  padded, with strong gates, documents and an initial state."""
  module = importlib.import_module("lin_attn_jax.ops.mesa_net.chunk")
  monkeypatch.setattr(module, "chunks_per_group", lambda chunk: 4)
  testing.check_forms(get_spec("mesa_net"),
                      dims=Dims(length=45, dim_k=8, dim_v=12), strong=True,
                      chunk_size=8, forms=("chunk",), one_program=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    dict(length=1, strong=False, segment_ids=False, dtype=jnp.float32),
    dict(length=45, strong=True, segment_ids=True, dtype=jnp.bfloat16)])
def test_forms_match_naive_more_cases(case):
  """T = 1, and bfloat16 inputs with strong gates and documents (the
  covering float32 case is in test_gated_linear.py)."""
  testing.check_forms(get_spec("mesa_net"),
                      dims=Dims(length=case["length"], dim_k=8, dim_v=12),
                      strong=case["strong"], segment_ids=case["segment_ids"],
                      dtype=case["dtype"], chunk_size=16, one_program=True)


def test_bad_arguments_raise():
  q = k = v = jnp.ones((1, 8, 2, 4))
  g, beta, lamb = jnp.zeros((1, 8, 2)), jnp.ones((1, 8, 2)), jnp.ones((2, 4))
  with pytest.raises(ValueError, match="lamb must have shape"):
    ops.chunk_mesa_net(q, k, v, g, beta, jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="beta must have shape"):
    ops.naive_recurrent_mesa_net(q, k, v, g, jnp.ones((1, 8)), lamb)
  with pytest.raises(ValueError, match=r"initial_state must have shape "
                     r"\(1, 2, 4, 8\)"):
    ops.parallel_mesa_net(q, k, v, g, beta, lamb,
                          initial_state=jnp.zeros((1, 2, 4, 4)))
  with pytest.raises(ValueError, match="cg_steps must be a positive int"):
    ops.recurrent_mesa_net(q, k, v, g, beta, lamb, cg_steps=0)
  with pytest.raises(ValueError, match="cg_start must be one of"):
    ops.mesa_net_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], lamb,
                      cg_start="jacobi")
