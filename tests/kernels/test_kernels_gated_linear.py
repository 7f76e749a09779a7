"""Pallas kernels of the gated-linear core against the naive recurrence.

Every check runs twice: in interpret mode (always, on CPU) and compiled on
the accelerator's own kernel (skipped without a TPU or GPU). Every kernel is
also exported for ``tpu`` and ``cuda``, forward and backward, and the
exported module must hold that platform's Pallas custom call.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.ops.gated_linear import naive_recurrent_gated_linear
from pallas_kernels.gated_linear import (BlockSizes,
                                         chunk_gated_linear_attention,
                                         chunk_gated_linear_attention_reference)
from lin_attn_jax.testing import assert_close_errors, rel_rms

GRAD_ARGS = ("q", "k", "v", "g", "initial_state")
ACCELERATOR = {"tpu": "tpu", "gpu": "gpu"}.get(jax.default_backend())

# Small tiles so that short test sequences still span several grid steps,
# sub-chunks per checkpoint and value blocks (GPU).
SMALL_BLOCKS = (BlockSizes("tpu", sub_chunk=16, chunk=32),
                BlockSizes("gpu", chunk=16, block_k=16, block_v=16,
                           backward_block_k=16, backward_block_v=16,
                           output_block_v=16, num_warps=4, num_stages=1))
# One sub-chunk per TPU grid step: a smaller program, for the other checks.
TPU_STEP_BLOCKS = (BlockSizes("tpu", sub_chunk=16, chunk=16),
                   SMALL_BLOCKS[1])

TRITON_CALL = "__gpu$xla.gpu.triton"
CUSTOM_CALLS = {"tpu": "tpu_custom_call", "cuda": TRITON_CALL}


def make_inputs(seed=0, *, b=2, t=37, h=2, dk=16, dv=24, gate="channel",
                strong=False, segments=True, initial_state=True):
  """Random inputs; row 0 holds four documents (one starts on a sub-chunk
  boundary, an id comes back), row 1 one document."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  q = jax.random.normal(keys[0], (b, t, h, dk))
  k = jax.random.normal(keys[1], (b, t, h, dk))
  v = jax.random.normal(keys[2], (b, t, h, dv))
  shape = {"none": None, "scalar": (b, t, h), "channel": (b, t, h, dk)}[gate]
  g = None
  if shape is not None:
    # Strong: log-decays from about -0.1 to -100 per token, weak ones among
    # strong ones (a difference of prefix sums would lose the weak ones).
    g = jax.nn.log_sigmoid(jax.random.normal(keys[3], shape))
    g = g / 0.05 if strong else 2.0 * g
  inputs = {"q": q, "k": k, "v": v, "g": g}
  if initial_state:
    inputs["initial_state"] = jax.random.normal(keys[4], (b, h, dk, dv))
  if segments:
    row = np.concatenate([np.full(10, 3), np.full(6, 5), np.full(15, 1),
                          np.full(max(t - 31, 0), 3)])[:t]
    ids = np.stack([row] + [np.zeros(t, np.int32)] * (b - 1))
    inputs["segment_ids"] = jnp.asarray(ids, jnp.int32)
  return inputs


def _naive(**inputs):
  return naive_recurrent_gated_linear(**inputs, output_final_state=True)


def cpu_jit(fn):
  """``jax.jit`` with XLA's CPU backend optimisations off: interpret-mode
  kernels are tiny to run and slow to optimise (this halves compile time)."""
  if jax.default_backend() != "cpu":
    return jax.jit(fn)
  return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})


def _outputs_and_grads(fn, inputs):
  """Outputs, final state and the gradients of every ``GRAD_ARGS`` input for
  random cotangents, as ``testing.errors_against_reference`` takes them,
  but traced as one program so that ``cpu_jit`` can compile it."""
  diff = {name: inputs[name] for name in GRAD_ARGS
          if inputs.get(name) is not None}
  (o, state), vjp = jax.vjp(lambda d: fn(**{**inputs, **d}), diff)
  key_o, key_s = jax.random.split(jax.random.PRNGKey(0))
  co = jax.random.normal(key_o, o.shape, jnp.float32).astype(o.dtype)
  cs = (None if state is None
        else jax.random.normal(key_s, state.shape, jnp.float32))
  (grads,) = vjp((co, cs))
  return o, state, grads


def _cast(inputs, dtype):
  return {name: (x.astype(dtype) if name in ("q", "k", "v", "g")
                 and x is not None else x) for name, x in inputs.items()}


def kernel_errors(backend, inputs, *, interpret, dtype=jnp.float32,
                  blocks=SMALL_BLOCKS, final_state=True):
  kernel = functools.partial(
      chunk_gated_linear_attention, backend=backend, interpret=interpret,
      block_sizes=blocks, output_final_state=final_state)
  return form_errors(kernel, inputs, dtype=dtype, final_state=final_state)


def form_errors(form, inputs, *, dtype=jnp.float32, final_state=True):
  """Relative RMS errors of ``form`` against the naive form, for outputs,
  final state and gradients; q, k, v and g are cast to ``dtype`` for the
  form, and the naive form gets the same values in float32."""
  reference = _naive if final_state else (
      lambda **kw: (_naive(**kw)[0], None))
  low = _cast(inputs, dtype)
  o, state, grads = cpu_jit(functools.partial(_outputs_and_grads, form))(low)
  ref_o, ref_state, ref_grads = cpu_jit(
      functools.partial(_outputs_and_grads, reference))(
          _cast(low, jnp.float32))
  assert o.dtype == dtype
  errors = {"o": rel_rms(o, ref_o)}
  if final_state:
    assert state.dtype == jnp.float32
    errors["state"] = rel_rms(state, ref_state)
  for name, grad in grads.items():
    assert grad.dtype == low[name].dtype, name
    finite = np.all(np.isfinite(np.asarray(grad, np.float32)))
    errors["d" + name] = (rel_rms(grad, ref_grads[name]) if finite
                          else float("inf"))
  return errors


class _KernelChecks:
  """The checks; subclasses say whether they run in interpret mode."""
  interpret: bool

  def backend(self, backend):
    if not self.interpret and backend != ACCELERATOR:
      pytest.skip(f"the {backend} kernel compiles only on a {backend}")
    return backend

  # Without a gate the kernels run the scalar gate's code with the gate's
  # terms left out: slow.
  @pytest.mark.parametrize("backend, gate", [
      pytest.param(b, g, marks=pytest.mark.slow if g == "none" else ())
      for g in ("none", "scalar", "channel") for b in ("tpu", "gpu")])
  def test_matches_naive(self, backend, gate):
    """Odd length, K != V, segment ids, initial and final state."""
    errors = kernel_errors(self.backend(backend), make_inputs(gate=gate),
                           interpret=self.interpret)
    assert_close_errors(errors, 1e-5, label=f"{backend} {gate}")

  @pytest.mark.parametrize("backend, gate",
                           [("tpu", "scalar"), ("tpu", "channel"),
                            ("gpu", "channel")])
  def test_bfloat16(self, backend, gate):
    errors = kernel_errors(self.backend(backend), make_inputs(gate=gate),
                           interpret=self.interpret, dtype=jnp.bfloat16,
                           blocks=TPU_STEP_BLOCKS)
    assert_close_errors(errors, 1e-2, label=f"{backend} {gate} bfloat16")

  @pytest.mark.parametrize("backend, gate, t",
                           [("tpu", "none", 1), ("gpu", "channel", 50)])
  def test_without_documents_or_states(self, backend, gate, t):
    inputs = make_inputs(gate=gate, t=t, segments=False, initial_state=False)
    errors = kernel_errors(self.backend(backend), inputs,
                           interpret=self.interpret, final_state=False,
                           blocks=TPU_STEP_BLOCKS)
    assert_close_errors(errors, 1e-5, label=f"{backend} {gate} T={t}")

  @pytest.mark.parametrize("backend, gate",
                           [("tpu", "channel"), ("gpu", "channel"),
                            pytest.param("gpu", "scalar",
                                         marks=pytest.mark.slow)])
  def test_strong_gates_long_sequence(self, backend, gate):
    """Strong gates with weak ones among them: every factor must stay
    finite and every log-decay sum exact."""
    inputs = make_inputs(gate=gate, t=300, b=1, strong=True)
    errors = kernel_errors(self.backend(backend), inputs,
                           interpret=self.interpret, blocks=TPU_STEP_BLOCKS)
    assert_close_errors(errors, 1e-5, label=f"{backend} {gate} strong")

  @pytest.mark.parametrize("chunk, dtype, tolerance",
                           [(64, jnp.float32, 1e-5),
                            pytest.param(32, jnp.bfloat16, 1e-2,
                                         marks=pytest.mark.slow)])
  def test_gpu_channel_row_blocks(self, chunk, dtype, tolerance,
                                  monkeypatch):
    """A decay per key channel with chunks of several 16-token row blocks
    (the other GPU checks run chunks of 16, one block): several chunks (T =
    150, the last one partial), strong gates, two key steps, segment ids
    and an initial state. The chunk is set past ``gpu_settings``' caps
    (tiles only: float32 compiles at 32 tokens)."""
    monkeypatch.setattr(BlockSizes, "gpu_settings",
                        lambda self, **kw: (chunk, 16, 4, 1))
    inputs = make_inputs(gate="channel", t=150, b=1, dk=32, strong=True)
    errors = kernel_errors(self.backend("gpu"), inputs,
                           interpret=self.interpret, dtype=dtype)
    assert_close_errors(errors, tolerance,
                        label=f"gpu row blocks, chunks of {chunk}")

  @pytest.mark.parametrize("gate", [pytest.param("none",
                                                  marks=pytest.mark.slow),
                                     "scalar", "channel"])
  def test_tpu_chunks_of_128(self, gate):
    """The TPU chunk-parallel kernels at their default 128-token chunk:
    several chunks (T = 300, the last one partial), strong gates, segment
    ids and an initial state."""
    inputs = make_inputs(gate=gate, t=300, b=1, strong=True)
    errors = kernel_errors(self.backend("tpu"), inputs,
                           interpret=self.interpret,
                           blocks=(BlockSizes("tpu", chunk=128),))
    assert_close_errors(errors, 1e-5, label=f"tpu chunks of 128 {gate}")

  @pytest.mark.slow
  @pytest.mark.parametrize("gate", ["scalar", "channel"])
  def test_tpu_sweep_over_sub_chunks(self, gate):
    """``chunk_parallel=False`` keeps the TPU sweep over sub-chunks (not the
    default path: the slow suite)."""
    blocks = (BlockSizes("tpu", sub_chunk=16, chunk=32,
                         chunk_parallel=False),)
    errors = kernel_errors(self.backend("tpu"), make_inputs(gate=gate),
                           interpret=self.interpret, blocks=blocks)
    assert_close_errors(errors, 1e-5, label=f"tpu sweep {gate}")

  def test_tpu_single_buffered_states(self, monkeypatch):
    """The gradients kernel's states take one buffer each past a window
    size (the widest heads): the same results."""
    from pallas_kernels.gated_linear import tpu_chunks
    monkeypatch.setattr(tpu_chunks, "SINGLE_BUFFER_STATES_BYTES", 0)
    errors = kernel_errors(self.backend("tpu"), make_inputs(gate="channel"),
                           interpret=self.interpret, blocks=TPU_STEP_BLOCKS)
    assert_close_errors(errors, 1e-5, label="tpu single-buffered states")

  @pytest.mark.parametrize("backend, gate", [
      pytest.param("tpu", "scalar", marks=pytest.mark.slow),
      ("tpu", "channel"), ("gpu", "channel")])
  def test_several_key_and_value_blocks(self, backend, gate):
    """Programs own blocks of key and value columns; their parts of the
    sums over key and value channels are added in XLA (TPU), or walked in
    a loop (GPU: the chunk kernels' key blocks and the outputs' and dv's
    value blocks). TPU: K = V = 130 pad to 256 lanes, blocks of 128; GPU:
    K = 32, V = 24 (pads to 32), blocks of 16."""
    dims = {"tpu": (130, 130), "gpu": (32, 24)}[backend]
    inputs = make_inputs(gate=gate, dk=dims[0], dv=dims[1], b=1, t=40)
    width = 128 if backend == "tpu" else 16
    if backend == "gpu":
      settings = {"chunk": 16, "num_warps": 4, "num_stages": 1,
                  "output_block_v": 16, "chunk_block": 16}
    else:
      settings = {"sub_chunk": 16, "chunk": 32}
    blocks = (BlockSizes(backend, block_k=width, block_v=width,
                         backward_block_k=width, backward_block_v=width,
                         **settings),)
    errors = kernel_errors(self.backend(backend), inputs,
                           interpret=self.interpret, blocks=blocks)
    assert_close_errors(errors, 1e-5, label=f"{backend} blocks")


class TestKernelsInterpret(_KernelChecks):
  interpret = True


@pytest.mark.skipif(ACCELERATOR is None, reason="needs a TPU or a GPU")
class TestKernelsCompiled(_KernelChecks):
  interpret = False


def test_reference_matches_naive():
  errors = form_errors(
      functools.partial(chunk_gated_linear_attention_reference,
                        output_final_state=True),
      make_inputs(gate="channel", t=20, b=1))
  assert_close_errors(errors, 1e-5, label="reference")


def exported_text(fn, platform, *args):
  exported = jax.export.export(
      jax.jit(fn), platforms=[platform],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)])
  return exported(*args).mlir_module()


def custom_calls(text):
  return set(re.findall(r"custom_call @([\w$.]+)", text))


def assert_kernels(text, platform, kernels):
  """``text`` (exported MLIR) calls only ``platform``'s Pallas custom call,
  and names each of ``kernels``."""
  assert custom_calls(text) == {CUSTOM_CALLS[platform]}
  for kernel in kernels:
    assert f'"{kernel}' in text, f"{kernel} missing for {platform}"


@pytest.mark.parametrize("gate, dtype", [("none", jnp.float32),
                                         ("scalar", jnp.float32),
                                         ("channel", jnp.float32),
                                         ("channel", jnp.bfloat16)])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_exports_kernels(platform, gate, dtype):
  """Forward and backward lower to the platform's Pallas kernels."""
  inputs = make_inputs(gate=gate, t=20, b=1)
  inputs = {name: (x.astype(dtype) if name in ("q", "k", "v") else x)
            for name, x in inputs.items()}
  names = [name for name in GRAD_ARGS if inputs[name] is not None]

  def forward(*args):
    return chunk_gated_linear_attention(
        **{**inputs, **dict(zip(names, args))}, output_final_state=True)

  if platform == "tpu":
    kernels = (["gated_linear_tpu_states", "gated_linear_tpu_outputs"],
               ["gated_linear_tpu_states", "gated_linear_tpu_state_grads",
                "gated_linear_tpu_grads"])
  else:
    kernels = (["gated_linear_states", "gated_linear_outputs"],
               ["gated_linear_states", "gated_linear_state_grads",
                "gated_linear_dv", "gated_linear_dqk"])
  check_exports(forward, [inputs[name] for name in names], platform,
                *kernels)


def check_exports(forward, args, platform, forward_kernels,
                  backward_kernels):
  """``forward(*args) -> (o, state)`` and the gradient of a loss over both,
  exported for ``platform``, hold only its Pallas custom call, with the
  named kernels."""

  def loss(*args):
    o, state = forward(*args)
    return jnp.sum(o.astype(jnp.float32)) + jnp.sum(state)

  forward_text = exported_text(forward, platform, *args)
  backward_text = exported_text(
      jax.grad(loss, argnums=tuple(range(len(args)))), platform, *args)
  for text, kernels in ((forward_text, forward_kernels),
                        (backward_text, backward_kernels)):
    assert_kernels(text, platform, kernels)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "cpu"}, "backend"),
    ({"interpret": True}, "explicit backend"),
    ({"block_sizes": 16}, "BlockSizes"),
])
def test_rejects_bad_arguments(kwargs, message):
  inputs = make_inputs(gate="scalar", t=8, b=1)
  with pytest.raises(ValueError, match=message):
    chunk_gated_linear_attention(**inputs, **kwargs)


def test_rejects_bad_shapes():
  inputs = make_inputs(gate="scalar", t=8, b=1)
  with pytest.raises(ValueError, match="g must be"):
    chunk_gated_linear_attention(**{**inputs, "g": inputs["g"][:, :4]})
  with pytest.raises(ValueError, match="v must be"):
    chunk_gated_linear_attention(**{**inputs, "v": inputs["v"][:, :4]})


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "tpu", "sub_chunk": 8, "chunk": 16}, "multiple of 16"),
    ({"backend": "tpu", "sub_chunk": 16, "chunk": 24}, "must divide"),
    ({"backend": "tpu", "sub_chunk": 16, "chunk": 32, "block_v": 64},
     "multiple of 128"),
    ({"backend": "tpu", "sub_chunk": 16, "chunk": 32, "num_warps": 4},
     "GPU settings"),
    ({"backend": "tpu", "chunk_block": 32}, "GPU setting"),
    ({"backend": "tpu", "step_block": 64}, "multiple of 128"),
    ({"backend": "gpu", "chunk_parallel": True}, "TPU setting"),
    ({"backend": "gpu", "chunk": 24}, "power of two"),
    ({"backend": "gpu", "sub_chunk": 16}, "TPU setting"),
    ({"backend": "gpu", "chunk": 16, "block_v": 8}, "power of two"),
    ({"backend": "gpu", "chunk": 16, "output_block_v": 48}, "power of two"),
    ({"backend": "gpu", "chunk": 16, "num_warps": 3}, "num_warps"),
    ({"backend": "mps", "sub_chunk": 16, "chunk": 16}, "backend"),
])
def test_block_sizes_validate(kwargs, message):
  with pytest.raises(ValueError, match=message):
    BlockSizes(**kwargs)


def test_block_size_defaults_are_valid():
  # TPU: the chunk-parallel kernels, 128-token chunks or the op's chunk
  # size rounded up to whole 128-token tiles, at most 256; a decay per key
  # channel's scores by row blocks of 16 tokens.
  for per_channel, sub_chunk in ((False, 64), (True, 16)):
    blocks = BlockSizes.default("tpu", per_channel=per_channel)
    assert (blocks.chunk, blocks.sub_chunk) == (128, sub_chunk)
    assert blocks.tpu_chunk_parallel()
    for size, chunk in ((40, 128), (200, 256), (1024, 256)):
      assert BlockSizes.default("tpu", per_channel=per_channel,
                                chunk_size=size).chunk == chunk
  assert not BlockSizes("tpu", chunk_parallel=False).tpu_chunk_parallel()
  # float32 inputs take chunks of at most 128 tokens on TPU (VMEM).
  from pallas_kernels.gated_linear import tpu_chunks
  for bf16, chunk in ((True, 256), (False, 128)):
    assert tpu_chunks.make_layout(1, 1024, 1, 128, 128,
                                  BlockSizes("tpu", chunk=256),
                                  bf16=bf16).chunk == chunk
  for per_channel in (False, True):
    # GPU: 64-token chunks, or the op's chunk size rounded up to a power of
    # two when that is smaller.
    assert BlockSizes.default("gpu", per_channel=per_channel).chunk == 64
    for size, chunk in ((20, 32), (40, 64), (256, 64)):
      assert BlockSizes.default("gpu", per_channel=per_channel,
                                chunk_size=size).chunk == chunk


@pytest.mark.parametrize("per_channel, bf16, widths, expected", [
    (False, True, (128, 128), (64, 64, 4, 2)),
    (False, True, (256, 512), (64, 32, 8, 2)),
    (False, False, (128, 128), (32, 16, 8, 2)),
    (True, True, (128, 128), (64, 16, 8, 1)),
    (True, False, (128, 128), (32, 16, 8, 2)),
])
def test_gpu_settings_by_gate_and_dtype(per_channel, bf16, widths, expected):
  """The GPU chunk is capped, and the warps and column blocks chosen, by
  gate kind, dtype and width (the settings that compile without spills);
  fields given are kept."""
  blocks = BlockSizes.default("gpu", per_channel=per_channel)
  settings = blocks.gpu_settings(bf16=bf16, k_pad=widths[0], v_pad=widths[1])
  assert settings == expected
  given = BlockSizes("gpu", chunk=16, chunk_block=32, num_warps=2,
                     num_stages=3, per_channel=per_channel)
  assert given.gpu_settings(bf16=bf16, k_pad=128, v_pad=128) == (16, 32, 2, 3)


def test_default_blocks_fit_widths_that_are_not_powers_of_two():
  """Based's 273 key channels pad to 384 lanes on TPU: the default 256-wide
  blocks halve to 128; a block given that does not divide still raises."""
  from pallas_kernels.gated_linear import layout
  lay = layout.make_layout(1, 512, 2, 273, 257,
                           BlockSizes.default("tpu", per_channel=False))
  for tiles in (lay.forward, lay.backward):
    assert (tiles.block_k, tiles.k_blocks) == (128, 3)
    assert (tiles.block_v, tiles.v_blocks) == (128, 3)
  with pytest.raises(ValueError, match="block_k .256. must divide"):
    layout.make_layout(1, 512, 2, 273, 257,
                       BlockSizes("tpu", sub_chunk=64, chunk=256,
                                  block_k=256))
