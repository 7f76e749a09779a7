"""Pallas kernels of the delta-rule core (the chunk sweep) against the naive
recurrence, through ``chunk_delta_rule``, ``chunk_gated_delta_rule`` and
``chunk_kda`` with ``impl="pallas"``.

Every check runs twice: in interpret mode (always, on CPU) and compiled on
the accelerator's own kernel (skipped without a TPU or GPU). The backend's
kernel is chosen by binding the op's sweep to it. Every kernel is also
exported for ``tpu`` and ``cuda``, forward and backward, and the exported
module must hold that platform's Pallas custom call. The cases cover odd
lengths, K != V, grouped value heads, segment ids, initial state, strong
gates, beta up to 2, several value blocks per head, chunks padded to the
tiles (C = 24 on GPU, C = 8 at T = 1 on TPU), bfloat16, and T = 1
without state or segments; each case runs one kernel and one reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops
from lin_attn_jax.ops.common import dispatch
from lin_attn_jax.ops.delta_rule import chunk as delta_rule_chunk
from pallas_kernels import gated_linear
from pallas_kernels.delta_rule import gpu_chunks
from pallas_kernels.delta_rule import (BlockSizes, ChunkTerms,
                                       chunk_delta_rule_sweep,
                                       chunk_delta_rule_sweep_reference)
from lin_attn_jax.testing import assert_close_errors, rel_rms
from tests.ops.test_delta_rule import Case, make_inputs
from tests.kernels.test_kernels_gated_linear import (CUSTOM_CALLS, check_exports,
                                             cpu_jit, custom_calls,
                                             exported_text)

GRAD_ARGS = ("q", "k", "v", "beta", "g", "initial_state")
ACCELERATOR = {"tpu": "tpu", "gpu": "gpu"}.get(jax.default_backend())

# op -> (chunk form, naive form); both take (q, k, v, beta, g) by name.
OPS = {
    "delta_rule": (ops.chunk_delta_rule, ops.naive_recurrent_delta_rule),
    "gated_delta_rule": (ops.chunk_gated_delta_rule,
                         ops.naive_recurrent_gated_delta_rule),
    "kda": (ops.chunk_kda, ops.naive_recurrent_kda),
}

# Two value blocks per head on each backend: V = 130 pads to 256 lanes on
# TPU (and K = 130 to two key blocks of the carried state); V = 24 pads to
# 32 columns on GPU.
TPU_TWO_BLOCKS = BlockSizes("tpu", block_v=128, block_k=128)
GPU_BLOCKS = BlockSizes("gpu", block_v=16, num_warps=4, num_stages=1)


@dataclasses.dataclass(frozen=True)
class KernelCase:
  case: Case                    # inputs and options (tests.ops.test_delta_rule)
  backend: str                  # "tpu" or "gpu": whose kernel runs
  dtype: str = "float32"        # dtype of q, k, v, beta, g
  final_state: bool = True      # output_final_state
  blocks: BlockSizes | None = None  # None: the backend's default

  def __str__(self):
    return f"{self.backend}-{self.dtype}-{self.case}-V{self.case.dim_v}"


def _case(op, length, **options):
  options = {"segments": True, "beta_max": 2.0, "chunk_size": 16,
             "sub_chunk_size": 8, **options}
  return Case(op, length, **options)


CASES = [
    KernelCase(_case("delta_rule", 37, heads=1), "tpu"),
    KernelCase(_case("gated_delta_rule", 50, strong=True), "tpu"),
    KernelCase(_case("gated_delta_rule", 50, dim_v=24, heads=1,
                     use_qk_l2norm=True, chunk_size=24), "gpu",
               blocks=GPU_BLOCKS),
    KernelCase(_case("kda", 45, strong=True, dim_k=130, dim_v=130), "tpu",
               blocks=TPU_TWO_BLOCKS),
    KernelCase(_case("kda", 45, use_qk_l2norm=True), "gpu"),
    # Key-column blocks inside a GPU program: K = 32 in two blocks.
    KernelCase(_case("kda", 40, dim_k=32, chunk_size=32, strong=True), "gpu",
               blocks=BlockSizes("gpu", block_v=16, block_k=16, num_warps=4,
                                 num_stages=1)),
    KernelCase(_case("gated_delta_rule", 1, segments=False,
                     initial_state=False), "tpu", final_state=False),
]
BFLOAT16_CASES = [
    KernelCase(_case("delta_rule", 37, dim_v=24), "gpu", "bfloat16",
               blocks=GPU_BLOCKS),
    KernelCase(_case("kda", 45, strong=True), "tpu", "bfloat16"),
]

# The TPU sweep kernels serve chunk_delta_rule_sweep(backend="tpu") only
# (the op runs the chunk-parallel kernels on TPU): one gated case by
# default, the rest slow.
_SLOW = {str(CASES[0]), str(CASES[3]), str(BFLOAT16_CASES[1])}


def _by_default(cases):
  return [pytest.param(kc, marks=pytest.mark.slow) if str(kc) in _SLOW
          else kc for kc in cases]


def _outputs_and_grads(fn, inputs):
  """Outputs, final state and the gradients of every ``GRAD_ARGS`` input
  for fixed random cotangents, compiled as one program with ``cpu_jit``."""
  diff = {n: inputs[n] for n in GRAD_ARGS if inputs.get(n) is not None}
  rest = {n: x for n, x in inputs.items() if n not in diff}
  o_shape, s_shape = jax.eval_shape(lambda d: fn(**rest, **d), diff)
  rng = np.random.default_rng(1)
  co = jnp.asarray(rng.standard_normal(o_shape.shape, np.float32),
                   o_shape.dtype)
  cs = (None if s_shape is None else
        jnp.asarray(rng.standard_normal(s_shape.shape, np.float32)))

  def run(diff, rest, co, cs):
    (o, state), vjp = jax.vjp(lambda d: fn(**rest, **d), diff)
    return o, state, vjp((co, cs))[0]

  return cpu_jit(run)(diff, rest, co, cs)


def kernel_errors(kc: KernelCase, *, interpret: bool, monkeypatch):
  """Relative RMS errors of the op on the case's kernel against the naive
  form, given the same (rounded) inputs in float32."""
  monkeypatch.setattr(delta_rule_chunk, "chunk_delta_rule_sweep",
                      functools.partial(chunk_delta_rule_sweep,
                                        backend=kc.backend,
                                        interpret=interpret,
                                        block_sizes=kc.blocks))
  case = kc.case
  chunk, naive = OPS[case.op]
  options = dict(output_final_state=kc.final_state,
                 use_qk_l2norm=case.use_qk_l2norm)
  dtype = jnp.dtype(kc.dtype)
  inputs = {name: (x.astype(dtype) if name in ("q", "k", "v", "beta", "g")
                   else x) for name, x in make_inputs(case, 0).items()}
  o, state, grads = _outputs_and_grads(
      functools.partial(chunk, impl="pallas", chunk_size=case.chunk_size,
                        sub_chunk_size=case.sub_chunk_size, **options),
      inputs)
  reference = {name: (x.astype(jnp.float32) if x.dtype == dtype else x)
               for name, x in inputs.items()}
  ref_o, ref_state, ref_grads = _outputs_and_grads(
      functools.partial(naive, **options), reference)
  assert o.dtype == dtype
  errors = {"o": rel_rms(o, ref_o)}
  if kc.final_state:
    assert state.dtype == jnp.float32
    errors["state"] = rel_rms(state, ref_state)
  else:
    assert state is None
  for name, grad in grads.items():
    assert grad.dtype == inputs[name].dtype, name
    finite = np.all(np.isfinite(np.asarray(grad, np.float32)))
    errors["d" + name] = (rel_rms(grad, ref_grads[name]) if finite
                          else float("inf"))
  assert set(errors) >= {"o", "dq", "dk", "dv", "dbeta"}
  return errors


class _KernelChecks:
  """The checks; subclasses say whether they run in interpret mode."""
  interpret: bool

  def skip_unless_runnable(self, backend):
    if not self.interpret and backend != ACCELERATOR:
      pytest.skip(f"the {backend} kernel compiles only on a {backend}")

  @pytest.mark.parametrize("kc", _by_default(CASES), ids=str)
  def test_matches_naive(self, kc, monkeypatch):
    self.skip_unless_runnable(kc.backend)
    errors = kernel_errors(kc, interpret=self.interpret,
                           monkeypatch=monkeypatch)
    assert_close_errors(errors, 1e-5, label=str(kc))

  @pytest.mark.parametrize("kc", _by_default(BFLOAT16_CASES), ids=str)
  def test_bfloat16(self, kc, monkeypatch):
    self.skip_unless_runnable(kc.backend)
    errors = kernel_errors(kc, interpret=self.interpret,
                           monkeypatch=monkeypatch)
    assert_close_errors(errors, 1e-2, label=str(kc))


class TestKernelsInterpret(_KernelChecks):
  interpret = True


@pytest.mark.skipif(ACCELERATOR is None, reason="needs a TPU or a GPU")
class TestKernelsCompiled(_KernelChecks):
  interpret = False


# The chunk-parallel GPU kernels (bfloat16 inputs on CUDA): small tiles so
# that short sequences span several chunks, key blocks and value blocks.
GPU_CHUNK_BLOCKS = gated_linear.BlockSizes(
    "gpu", chunk=16, chunk_block=16, output_block_v=16, num_warps=4,
    num_stages=1)
GPU_CHUNK_CASES = [
    (_case("delta_rule", 37, dim_k=32, dim_v=24, value_heads=2, heads=1),
     "float32"),
    (_case("gated_delta_rule", 50, dim_k=32, strong=True,
           use_qk_l2norm=True), "float32"),
    (_case("kda", 45, dim_k=32, strong=True, use_qk_l2norm=True), "float32"),
    (_case("kda", 40, dim_k=32, dim_v=24, use_qk_l2norm=True), "bfloat16"),
    (_case("gated_delta_rule", 1, segments=False, initial_state=False),
     "float32"),
]


# The chunk-parallel TPU kernels: 32-token chunks (two inverse blocks, row
# blocks of 16 for a decay per key channel) so that short sequences span
# several chunks.
TPU_CHUNK_BLOCKS = gated_linear.BlockSizes("tpu", sub_chunk=16, chunk=32)
TPU_CHUNK_CASES = [
    (_case("gated_delta_rule", 50, dim_k=32, strong=True, value_heads=2,
           heads=1, use_qk_l2norm=True), "float32"),
    (_case("kda", 45, dim_k=32, strong=True, use_qk_l2norm=True), "float32"),
    (_case("kda", 40, dim_k=32, dim_v=24, use_qk_l2norm=True), "bfloat16"),
    (_case("delta_rule", 37, dim_k=32, dim_v=24), "float32"),
    (_case("gated_delta_rule", 33, dim_k=16, use_qk_l2norm=True),
     "bfloat16"),
]


def chunk_kernel_errors(backend, case, dtype, *, interpret, monkeypatch):
  """The op with its CUDA or TPU branch (``chunk_delta_rule_gpu`` /
  ``chunk_delta_rule_tpu``) against the naive form: the op's wiring
  (grouped heads, L2 norm, scale, padding) and the kernels."""
  name = f"chunk_delta_rule_{backend}"
  monkeypatch.setattr(delta_rule_chunk, "by_platform",
                      lambda cuda, tpu, default: dict(gpu=cuda,
                                                      tpu=tpu)[backend]())
  kernels = functools.partial(
      getattr(delta_rule_chunk, name), interpret=interpret,
      block_sizes=GPU_CHUNK_BLOCKS if backend == "gpu" else TPU_CHUNK_BLOCKS)
  monkeypatch.setattr(delta_rule_chunk, name, kernels)
  # The chunk kernels serve bfloat16 inputs; float32 cases take them too,
  # so that the kernels' float32 mode is checked at 1e-5.
  monkeypatch.setattr(delta_rule_chunk, f"{backend.upper()}_CHUNK_DTYPES",
                      (jnp.dtype(dtype),))
  return kernel_errors(KernelCase(case, backend, dtype,
                                  final_state=case.initial_state),
                       interpret=True, monkeypatch=monkeypatch)


# GPU: the delta rule without a gate and the single token are slow (the
# gated cases run the same kernels with more terms; T = 1 is one partial
# chunk). TPU: the first and third cases run by default (a scalar and a
# per-channel decay, float32 at 1e-5 and bfloat16, what the op runs on
# TPU); the rest are slow.
CHUNK_CASES = [
    pytest.param("gpu", c, d, id=f"gpu-{c}-{d}", marks=pytest.mark.slow
                 if c.op == "delta_rule" or c.length == 1 else ())
    for c, d in GPU_CHUNK_CASES] + [
    pytest.param("tpu", c, d, id=f"tpu-{c}-{d}",
                 marks=() if i in (0, 2) else pytest.mark.slow)
    for i, (c, d) in enumerate(TPU_CHUNK_CASES)]


@pytest.mark.parametrize("interpret", [True, False],
                         ids=["interpret", "compiled"])
@pytest.mark.parametrize("backend, case, dtype", CHUNK_CASES)
def test_chunk_kernels_match_naive(backend, case, dtype, interpret,
                                   monkeypatch):
  if not interpret and ACCELERATOR != backend:
    pytest.skip(f"needs a {backend.upper()}")
  errors = chunk_kernel_errors(backend, case, dtype, interpret=interpret,
                               monkeypatch=monkeypatch)
  assert_close_errors(errors, 1e-2 if dtype == "bfloat16" else 1e-5,
                      label=f"{backend} {case} {dtype}")


@pytest.mark.parametrize("case", [
    _case("gated_delta_rule", 40, dim_k=32, strong=True),
    pytest.param(_case("kda", 40, dim_k=32, dim_v=24, strong=True),
                 marks=pytest.mark.slow)], ids=str)
def test_gpu_chunk_sweeps_over_key_blocks(case, monkeypatch):
  """The delta sweeps walk the state by key blocks (``SWEEP_BLOCK_K``
  rows): two blocks of 16 at K = 32, in interpret mode."""
  monkeypatch.setattr(gpu_chunks, "SWEEP_BLOCK_K", 16)
  errors = chunk_kernel_errors("gpu", case, "float32", interpret=True,
                               monkeypatch=monkeypatch)
  assert_close_errors(errors, 1e-5, label=str(case))


def _sweep_terms(seed=0, b=1, n=3, h=2, c=16, dk=8, dv=12, width=8):
  rng = np.random.default_rng(seed)
  x = lambda *shape: jnp.asarray(  # noqa: E731
      0.3 * rng.standard_normal(shape, np.float32))
  return ChunkTerms(w=x(b, n, h, c, dk), u=x(b, n, h, c, dv),
                    q=x(b, n, h, c, dk), scores=x(b, n, h, c, c),
                    k=x(b, n, h, c, dk),
                    decay=jnp.exp(-jnp.abs(x(b, n, h, width))))


def test_sweep_by_platform_matches_its_reference():
  """Without a backend, the platform dispatch picks the Mosaic kernel in
  interpret mode on CPU: the sweep against its plain-jnp reference."""
  terms = _sweep_terms()
  s0 = jnp.ones((1, 2, 8, 12))
  o, state = cpu_jit(lambda t, s: chunk_delta_rule_sweep(
      t, initial_state=s, output_final_state=True))(terms, s0)
  ref_o, ref_state = chunk_delta_rule_sweep_reference(
      terms, initial_state=s0, output_final_state=True)
  assert_close_errors({"o": rel_rms(o, ref_o),
                       "state": rel_rms(state, ref_state)}, 1e-5,
                      label="sweep")


def _export_inputs(op, dtype=jnp.float32):
  case = Case(op, 20, heads=1, value_heads=2, segments=True)
  inputs = make_inputs(case, 0)
  return {name: (x.astype(dtype) if name in ("q", "k", "v") else x)
          for name, x in inputs.items()}


@pytest.mark.parametrize("op, dtype", [("delta_rule", jnp.float32),
                                       ("gated_delta_rule", jnp.bfloat16),
                                       ("kda", jnp.float32)])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_exports_kernels(platform, op, dtype):
  """Forward and backward lower to the platform's Pallas kernels."""
  inputs = _export_inputs(op, dtype)
  names = [name for name in GRAD_ARGS if name in inputs]
  chunk = OPS[op][0]

  def forward(*args):
    return chunk(**{**inputs, **dict(zip(names, args))}, impl="pallas",
                 output_final_state=True)

  if platform == "tpu":
    # TPU: the chunk-parallel kernels.
    kernels = (["delta_rule_tpu_wy", "delta_rule_tpu_sweep",
                "gated_linear_tpu_outputs"],
               ["delta_rule_tpu_wy", "delta_rule_tpu_sweep",
                "gated_linear_tpu_dv", "delta_rule_tpu_sweep_grads",
                "gated_linear_tpu_grads", "delta_rule_tpu_wy_grads"])
  elif dtype == jnp.bfloat16:
    # bfloat16 on CUDA: the chunk-parallel kernels.
    kernels = (["delta_rule_wy", "delta_rule_sweep", "gated_linear_outputs"],
               ["delta_rule_wy", "delta_rule_sweep", "gated_linear_dv",
                "delta_rule_sweep_grads", "gated_linear_dqk",
                "delta_rule_wy_grads"])
  else:
    kernels = (["delta_rule_forward"],
               ["delta_rule_states", "delta_rule_backward"])
  check_exports(forward, [inputs[name] for name in names], platform,
                *kernels)


@pytest.mark.parametrize("op", sorted(OPS))
def test_invalid_impl_raises(op):
  with pytest.raises(ValueError, match="impl must be one of"):
    OPS[op][0](**_export_inputs(op), impl="triton")


@pytest.mark.parametrize("op", sorted(OPS))
def test_auto_runs_xla_on_cpu(op, monkeypatch):
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "cpu")
  inputs = _export_inputs(op)
  jaxpr = jax.make_jaxpr(lambda x: OPS[op][0](**x, impl="auto"))(inputs)
  assert "pallas_call" not in str(jaxpr)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_auto_on_an_accelerator_picks_by_platform(backend, monkeypatch):
  """With a TPU or GPU default backend, impl="auto" lowers to the kernel on
  cuda, to the XLA form on tpu (``AUTO_ON_TPU``: not measured on a TPU) and
  cpu, gradients included."""
  monkeypatch.setattr(dispatch, "_default_backend", lambda: backend)
  inputs = _export_inputs("gated_delta_rule")
  names = [name for name in GRAD_ARGS if name in inputs]

  def loss(*args):
    o, state = ops.chunk_gated_delta_rule(
        **{**inputs, **dict(zip(names, args))}, impl="auto",
        output_final_state=True)
    return jnp.sum(o) + jnp.sum(state)

  grad = jax.grad(loss, argnums=tuple(range(len(names))))
  args = [inputs[name] for name in names]
  for platform, calls in (("tpu", set()), ("cuda", {CUSTOM_CALLS["cuda"]}),
                          ("cpu", set())):
    assert custom_calls(exported_text(grad, platform, *args)) == calls


def test_auto_on_cuda_runs_the_measured_sweep_kernels(monkeypatch):
  """impl="auto" keeps the sweep kernels on CUDA in bfloat16 (measured
  faster than XLA); the chunk-parallel ones run with impl="pallas"."""
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "gpu")
  inputs = _export_inputs("gated_delta_rule", jnp.bfloat16)

  def forward(impl):
    return lambda x: ops.chunk_gated_delta_rule(**x, impl=impl)[0]

  auto = exported_text(forward("auto"), "cuda", inputs)
  pallas = exported_text(forward("pallas"), "cuda", inputs)
  assert '"delta_rule_forward' in auto and '"delta_rule_wy' not in auto
  assert '"delta_rule_wy' in pallas and '"delta_rule_forward' not in pallas


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "cpu"}, "backend"),
    ({"interpret": True}, "explicit backend"),
    ({"block_sizes": 16}, "BlockSizes"),
])
def test_sweep_rejects_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    chunk_delta_rule_sweep(_sweep_terms(), **kwargs)


@pytest.mark.parametrize("change, message", [
    ({"scores": jnp.zeros((1, 3, 2, 16, 8))}, "scores must be"),
    ({"u": jnp.zeros((1, 3, 2, 8, 12))}, "u must be"),
    ({"decay": jnp.zeros((1, 3, 2, 4))}, "decay must be"),
])
def test_sweep_rejects_bad_shapes(change, message):
  terms = _sweep_terms()._replace(**change)
  with pytest.raises(ValueError, match=message):
    chunk_delta_rule_sweep(terms)
  with pytest.raises(ValueError, match="initial_state"):
    chunk_delta_rule_sweep(_sweep_terms(), initial_state=jnp.zeros((1, 2)))


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "tpu", "block_v": 64}, "multiple of 128"),
    ({"backend": "tpu", "num_warps": 4}, "GPU settings"),
    ({"backend": "gpu", "block_v": 24}, "power of two"),
    ({"backend": "gpu", "block_v": 8}, "power of two"),
    ({"backend": "gpu", "block_k": 24}, "power of two"),
    ({"backend": "gpu", "num_warps": 3}, "num_warps"),
    ({"backend": "gpu", "num_stages": 0}, "num_stages"),
    ({"backend": "mps"}, "backend"),
])
def test_block_sizes_validate(kwargs, message):
  with pytest.raises(ValueError, match=message):
    BlockSizes(**kwargs)


def test_block_size_defaults_are_valid():
  for backend in ("tpu", "gpu"):
    assert BlockSizes.default(backend).backend == backend


def test_gpu_chunk_by_generation():
  """KDA at K = 128 in bfloat16: 64-token chunks on Hopper (``wgmma``), 32
  on earlier GPUs and when the generation is unknown (a trace on CPU)."""
  from pallas_kernels.common import dispatch as kernel_dispatch
  from pallas_kernels.delta_rule import chunked_ops
  assert kernel_dispatch.cuda_capability() is None
  q = jnp.zeros((1, 256, 1, 128), jnp.bfloat16)
  g = jnp.zeros((1, 256, 1, 128), jnp.float32)
  cfg = chunked_ops._Config(
      scale=1.0, output_final_state=False, interpret=True,
      blocks=gated_linear.BlockSizes.default("gpu", per_channel=True))

  def chunk():
    return chunked_ops._setup(cfg, q, q, q, g, None)[0].chunk

  assert chunk() == 32
  with kernel_dispatch.assume_cuda_capability((9, 0)):
    assert chunk() == 64
  with kernel_dispatch.assume_cuda_capability((8, 0)):
    assert chunk() == 32
  assert kernel_dispatch.cuda_capability() is None
