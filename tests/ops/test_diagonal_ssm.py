"""Every form of every diagonal-SSM op against its naive form, and the
properties the forms promise (long strong decays, packed documents, decoding
after a prefix, bounded memory of the chunked selective scan)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops, testing
from lin_attn_jax.ops.registry import Dims, core_specs

SPEC_BY_NAME = {spec.name: spec for spec in core_specs("diagonal_ssm")}

# A covering set: each length appears, and so do runs with and without an
# initial state and segment ids, strong decays, bfloat16, a length that is a
# multiple of the chunk size and lengths that are not. Each case runs every
# form against one naive run.
# (length, strong decays, initial state, segment ids, chunk size, dtype)
CASES = [
    (1, False, True, False, 64, jnp.float32),
    (63, True, True, True, 16, jnp.bfloat16),
    (64, False, False, False, 16, jnp.float32),
    (200, True, True, True, 64, jnp.float32),
]

# Small dims; heads > 1 so that grouped B/C are exercised.
DIMS = dict(batch=2, heads=2, dim_k=4, dim_v=6)
DIMS_BY_OP = {"ssd": dict(batch=2, heads=4, dim_k=4, dim_v=6)}


# The shapes are tiny, so compiling dominates: the inputs and every form's
# forward and backward are compiled as one program, and the CPU backend skips
# its expensive LLVM optimisation passes (about 3x faster to compile here;
# the XLA program and its float32 operations are the same).
_FAST_COMPILE = {"xla_backend_optimization_level": 0,
                 "xla_llvm_disable_expensive_passes": True}


def _fast_jit(fn, **kwargs):
  return jax.jit(fn, compiler_options=_FAST_COMPILE, **kwargs)


def _case_id(case):
  t, strong, init, seg, chunk, dtype = case
  return (f"T{t}-{'strong' if strong else 'gentle'}-"
          f"{'init' if init else 'noinit'}-{'seg' if seg else 'noseg'}-"
          f"C{chunk}-{jnp.dtype(dtype).name}")


def _dims(spec, length):
  return Dims(length=length, **DIMS_BY_OP.get(spec.name, DIMS))


def _inputs(spec, length, strong, init, seg, seed):
  inputs = _fast_jit(spec.make_inputs, static_argnums=(1, 2))(
      jax.random.PRNGKey(seed), _dims(spec, length), strong)
  if not init:
    inputs["initial_state"] = None
  if not seg:
    inputs["segment_ids"] = None
  return inputs


# In the fast suite SSD and the selective scan run the hard cases in
# float32 and bfloat16, the other ops (the same scan and chunk machinery
# under their own parameterisations) the float32 one; the rest of the
# covering set is in the slow suite.
FULL_SET = ("ssd", "selective_scan")


def _op_cases():
  for op in sorted(SPEC_BY_NAME):
    for case in CASES:
      fast = case is CASES[3] or (op in FULL_SET and case is CASES[1])
      marks = () if fast else pytest.mark.slow
      yield pytest.param(op, case, marks=marks,
                         id=f"{op}-{_case_id(case)}")


@pytest.mark.parametrize("op, case", list(_op_cases()))
def test_forms_match_naive(op, case):
  """Every form against the naive one; the inputs, the naive form and every
  form's forward and backward compiled as one program."""
  length, strong, init, seg, chunk, dtype = case
  spec = SPEC_BY_NAME[op]
  testing.check_forms(spec, dims=_dims(spec, length), strong=strong,
                      initial_state=init, segment_ids=seg, chunk_size=chunk,
                      dtype=dtype, seed=length, one_program=True,
                      compiler_options=_FAST_COMPILE)


# The training form of each op at T = 8192 with per-token log-decays down to
# -30: outputs, final states and every gradient stay finite.
LONG_FORMS = [("linear_scan", "chunk"), ("selective_scan", "chunk"),
              ("ssd", "chunk"), ("rg_lru", "chunk"), ("hgrn", "chunk"),
              ("s4d", "chunk")]


@pytest.mark.parametrize("op,form_name", [
    pytest.param(o, f, id=f"{o}-{f}",
                 marks=() if o in FULL_SET else pytest.mark.slow)
    for o, f in LONG_FORMS])
def test_long_strong_decays_stay_finite(op, form_name):
  spec = SPEC_BY_NAME[op]
  dims = Dims(batch=1, length=8192, heads=2 if op == "ssd" else 1, dim_k=4,
              dim_v=4)
  inputs = spec.make_inputs(jax.random.PRNGKey(0), dims, True)
  form = spec.forms[form_name]
  diff = {n: inputs[n] for n in spec.grad_args}
  fixed = {n: x for n, x in inputs.items() if n not in diff}

  def loss(diff):
    o, s = form(**fixed, **diff, output_final_state=True)
    return jnp.sum(o) + jnp.sum(s), (o, s)

  grads, (o, s) = _fast_jit(jax.grad(loss, has_aux=True))(diff)
  for name, x in [("o", o), ("state", s), *grads.items()]:
    assert np.all(np.isfinite(np.asarray(x))), f"{op}/{form_name}: {name}"
  assert float(jnp.max(jnp.abs(o))) > 0.0


def test_strong_inputs_reach_minus_30():
  """The strong inputs above really are that strong."""
  sel = _inputs(SPEC_BY_NAME["selective_scan"], 4096, True, True, True, 0)
  dt = jax.nn.softplus(sel["delta"] + sel["delta_bias"])
  assert float(jnp.min(dt[..., None] * sel["A"])) < -25.0
  ssd = _inputs(SPEC_BY_NAME["ssd"], 4096, True, True, True, 0)
  dt = jax.nn.softplus(ssd["dt"] + ssd["dt_bias"])
  assert float(jnp.min(dt * ssd["A"])) < -25.0


def test_ssd_equals_simple_gla_under_the_mapping():
  """SSD is simple GLA with q=C, k=B, v=x*dt, g=dt*A, scale=1 (+ D x)."""
  spec = SPEC_BY_NAME["ssd"]
  inputs = _inputs(spec, 100, True, True, True, seed=7)

  def both(inputs):
    x, B, C, A = inputs["x"], inputs["B"], inputs["C"], inputs["A"]
    heads_per_group = x.shape[2] // B.shape[2]
    dt = jax.nn.softplus(inputs["dt"] + inputs["dt_bias"])
    o, s = ops.chunk_simple_gla(
        jnp.repeat(C, heads_per_group, axis=2),
        jnp.repeat(B, heads_per_group, axis=2), x * dt[..., None], dt * A,
        scale=1.0, initial_state=inputs["initial_state"],
        segment_ids=inputs["segment_ids"], output_final_state=True)
    o = o + inputs["D"][:, None] * x
    return (o, s), ops.naive_recurrent_ssd(**inputs, dt_softplus=True,
                                           output_final_state=True)

  (o, s), (y, state) = _fast_jit(both)(inputs)
  np.testing.assert_allclose(o, y, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s, state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["selective_scan", "linear_scan"])
def test_chunk_size_does_not_change_results(op):
  spec = SPEC_BY_NAME[op]
  inputs = _inputs(spec, 150, True, True, True, seed=3)
  chunk = functools.partial(spec.forms["chunk"], output_final_state=True)
  outs = [_fast_jit(functools.partial(chunk, chunk_size=c))(**inputs)
          for c in (16, 48, 256)]
  for o, s in outs[1:]:
    np.testing.assert_allclose(o, outs[0][0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(s, outs[0][1], rtol=2e-5, atol=2e-5)


def test_segment_reset_equals_separate_documents():
  """Two packed documents == the two run one after the other from zero."""
  spec = SPEC_BY_NAME["selective_scan"]
  inputs = _inputs(spec, 90, False, False, False, seed=4)
  seg = jnp.concatenate([jnp.zeros((2, 40), jnp.int32),
                         jnp.ones((2, 50), jnp.int32)], axis=1)
  per_token = ("u", "delta", "B", "C", "z")
  run = _fast_jit(functools.partial(
      ops.chunk_selective_scan, delta_softplus=True, chunk_size=16,
      output_final_state=True))
  packed, final = run(**{**inputs, "segment_ids": seg})
  parts = []
  for part in (slice(0, 40), slice(40, 90)):
    args = {n: (x[:, part] if n in per_token else x)
            for n, x in inputs.items() if x is not None}
    parts.append(run(**args))
  np.testing.assert_allclose(packed, jnp.concatenate([parts[0][0],
                                                      parts[1][0]], 1),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(final, parts[1][1], rtol=1e-5, atol=1e-5)


def test_steps_continue_a_prefix():
  """Chunk form on a prefix, then decoding steps, equal the chunk form."""
  sel = _inputs(SPEC_BY_NAME["selective_scan"], 40, False, False, False, 5)
  conv = _inputs(SPEC_BY_NAME["causal_conv1d"], 40, False, False, False, 6)

  def selective_scan(sel):
    fixed = dict(D=sel["D"], delta_bias=sel["delta_bias"], delta_softplus=True)
    u, delta, A, B, C, z = (sel[n] for n in ("u", "delta", "A", "B", "C", "z"))
    full, _ = ops.chunk_selective_scan(u, delta, A, B, C, z=z, **fixed)
    _, state = ops.chunk_selective_scan(u[:, :30], delta[:, :30], A,
                                        B[:, :30], C[:, :30], z=z[:, :30],
                                        **fixed, output_final_state=True)
    steps = []
    for t in range(30, 40):
      y_t, state = ops.selective_scan_step(u[:, t], delta[:, t], A, B[:, t],
                                           C[:, t], state, z=z[:, t], **fixed)
      steps.append(y_t)
    return full[:, 30:], jnp.stack(steps, axis=1)

  def causal_conv1d(conv):
    x, w, b = conv["x"], conv["weight"], conv["bias"]
    full, _ = ops.chunk_causal_conv1d(x, w, b, activation="silu")
    _, state = ops.chunk_causal_conv1d(x[:, :30], w, b, activation="silu",
                                       output_final_state=True)
    steps = []
    for t in range(30, 40):
      y_t, state = ops.causal_conv1d_step(x[:, t], w, b, state,
                                          activation="silu")
      steps.append(y_t)
    return full[:, 30:], jnp.stack(steps, axis=1)

  for check, inputs in ((selective_scan, sel), (causal_conv1d, conv)):
    full, steps = _fast_jit(check)(inputs)
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)


def test_chunk_selective_scan_never_holds_all_states():
  """Forward + backward temp memory stays well under one [B, T, D, N]
  (N = 64, so that the [B, T, D] inputs and gradients weigh little), and
  grows with T by well under the states' growth: besides O(T) inputs,
  gradients and chunk-entering states it holds one chunk's states and
  decays (128 tokens, 2 MB here), whatever the length."""
  b, d, n = 1, 32, 64

  def temp_bytes(form, t):
    args = (jnp.ones((b, t, d)), jnp.ones((b, t, d)), -jnp.ones((d, n)),
            jnp.ones((b, t, n)), jnp.ones((b, t, n)))

    def loss(*args):
      return jnp.sum(form(*args, delta_softplus=True)[0])

    grad = jax.jit(jax.grad(loss, argnums=range(5)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

  def all_states(t):
    return b * t * d * n * 4

  short, long = (temp_bytes(ops.chunk_selective_scan, t) for t in (2048, 8192))
  assert long < all_states(8192) / 4
  assert long - short < (all_states(8192) - all_states(2048)) / 4
  assert temp_bytes(ops.recurrent_selective_scan, 2048) > all_states(2048)


def _numpy(inputs):
  return {n: None if x is None else np.asarray(x) for n, x in inputs.items()}


def test_bad_inputs_name_the_argument():
  sel = _numpy(_inputs(SPEC_BY_NAME["selective_scan"], 8, False, True, True, 0))
  with pytest.raises(ValueError, match="A must have shape"):
    ops.chunk_selective_scan(**{**sel, "A": sel["A"][:, None]})
  with pytest.raises(ValueError, match="A must have shape"):
    ops.chunk_selective_scan(**{**sel, "A": sel["A"][:-1]})
  with pytest.raises(ValueError, match="groups, which must divide"):
    ops.chunk_selective_scan(**{**sel, "B": sel["B"][:, :, :1].repeat(4, 2),
                                "C": sel["C"][:, :, :1].repeat(4, 2)})
  with pytest.raises(ValueError, match="initial_state"):
    ops.recurrent_selective_scan(**{**sel,
                                    "initial_state": sel["initial_state"][0]})

  ssd = _numpy(_inputs(SPEC_BY_NAME["ssd"], 8, False, True, True, 0))
  with pytest.raises(ValueError, match="multiple of the G = 3 groups"):
    ops.chunk_ssd(**{**ssd, "B": ssd["B"][:, :, :1].repeat(3, 2),
                     "C": ssd["C"][:, :, :1].repeat(3, 2)}, dt_softplus=True)
  with pytest.raises(ValueError, match="A must have shape"):
    ops.parallel_ssd(**{**ssd, "A": ssd["A"][:2]}, dt_softplus=True)
  with pytest.raises(ValueError, match="A holds log-decays"):
    ops.chunk_ssd(**{**ssd, "A": -ssd["A"]}, dt_softplus=True)
  with pytest.raises(ValueError, match="dt"):
    ops.chunk_ssd(**{**ssd, "dt": -np.abs(ssd["dt"]), "dt_bias": None})

  x = np.ones((1, 8, 4), np.float32)
  with pytest.raises(ValueError, match="weight has 65 taps"):
    ops.chunk_causal_conv1d(x, np.ones((4, 65), np.float32))
  with pytest.raises(ValueError, match="weight must have shape"):
    ops.parallel_causal_conv1d(x, np.ones((3, 4), np.float32))
  with pytest.raises(ValueError, match="activation"):
    ops.chunk_causal_conv1d(x, np.ones((4, 4), np.float32), activation="gelu")
  with pytest.raises(ValueError, match="C has 65 taps"):
    ops.chunk_shift_ssm(x, np.ones((4, 65), np.float32))

  s4d = _numpy(_inputs(SPEC_BY_NAME["s4d"], 8, False, False, False, 0))
  with pytest.raises(ValueError, match="A_real must be < 0"):
    ops.parallel_s4d(**{**s4d, "A_real": -s4d["A_real"]})
  with pytest.raises(ValueError, match="g holds log-decays"):
    ops.chunk_hgrn(x, np.ones_like(x))
  with pytest.raises(ValueError, match="b must have the shape of a"):
    ops.chunk_linear_scan(x, x[:, :4])
  with pytest.raises(ValueError, match="a_param"):
    ops.chunk_rg_lru(x, x, x, np.ones((5,), np.float32))


@pytest.mark.parametrize("length", [5, 37])
def test_shift_ssm_taps_longer_than_a_chunk(length):
  """The Toeplitz chunk form takes chunks of at least N - 1 tokens, so taps
  never reach back more than one chunk, also for chunk_size < N - 1 and
  sequences shorter than the taps."""
  rng = np.random.default_rng(length)
  b, d, n = 2, 3, 20
  u = rng.normal(size=(b, length, d)).astype(np.float32)
  C = rng.normal(size=(d, n)).astype(np.float32)
  D = rng.normal(size=(d,)).astype(np.float32)
  init = rng.normal(size=(b, n - 1, d)).astype(np.float32)
  seg = np.cumsum(rng.random((b, length)) < 0.15, axis=1).astype(np.int32)
  kw = dict(D=D, initial_state=init, output_final_state=True, segment_ids=seg)
  y, s = ops.chunk_shift_ssm(u, C, chunk_size=8, **kw)
  y_ref, s_ref = ops.naive_recurrent_shift_ssm(u, C, **kw)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)
