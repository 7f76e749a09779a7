"""Pallas kernels of forgetting attention against the ``[T, T]`` reference.

Every check runs twice: in interpret mode (always, on CPU; both the Mosaic
and the Triton bodies) and compiled on the accelerator's own kernel
(skipped without a TPU or GPU). Outputs and the gradients of q, k, v and c
for random cotangents, in float32 (relative RMS ``1e-5``: both sides
compute in float32, the kernels' sums in another order and, for the Triton
body, as 3xTF32 products) and bfloat16 (``1e-2``: bfloat16 matmul operands,
the reference in float32 on the same rounded inputs). The cases cover odd
lengths (padded to whole blocks), several blocks of different sizes per
kernel, grouped heads (2 and 3 query heads per key head), segment ids with
an id that comes back, a window, strong forget gates, two batch rows and
T = 1. The forward and backward kernels are also exported for ``tpu`` and
``cuda``, and the blocks each program visits are checked against the mask.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax.testing import assert_close_errors, rel_rms
from pallas_kernels.forgetting_attn import (BlockSizes, forgetting_attention,
                                            forgetting_attention_reference)
from pallas_kernels.forgetting_attn import layout
from pallas_kernels.forgetting_attn.reference import allowed_pairs
from tests.kernels.test_kernels_gated_linear import (assert_kernels,
                                                     cpu_jit, exported_text)

ACCELERATOR = {"tpu": "tpu", "gpu": "gpu"}.get(jax.default_backend())
GRAD_ARGS = ("q", "k", "v", "c")

# The smallest tiles, so that short sequences span several blocks; the
# forward, dq and dk/dv programs own and visit blocks of different sizes.
TPU_BLOCKS = BlockSizes("tpu", block_q=128, block_k=128, backward_block_q=128,
                        backward_block_k=128, dq_block_q=128)
TPU_MIXED = BlockSizes("tpu", block_q=128, block_k=256, backward_block_q=256,
                       backward_block_k=128, dq_block_q=256)
GPU_BLOCKS = BlockSizes("gpu", block_q=16, block_k=16, backward_block_q=16,
                        backward_block_k=32, dq_block_q=16, num_warps=4,
                        num_stages=1)


@dataclasses.dataclass(frozen=True)
class Case:
  backend: str                    # whose kernel body runs
  length: int                     # T
  batch: int = 1                  # B
  heads: int = 2                  # H
  kv_heads: int = 1               # Hkv
  dim_k: int = 16                 # K
  dim_v: int = 24                 # V
  dtype: str = "float32"          # of q, k, v
  segments: bool = False          # segment ids (row 0: four documents)
  window: int | None = None       # window_size
  strong: bool = False            # log forget gates down to -20 per token
  blocks: BlockSizes | None = None  # None: TPU_BLOCKS or GPU_BLOCKS

  def __str__(self):
    return (f"{self.backend}-{self.dtype}-T{self.length}-B{self.batch}"
            f"-H{self.heads}/{self.kv_heads}"
            + ("-seg" if self.segments else "")
            + (f"-w{self.window}" if self.window else "")
            + ("-strong" if self.strong else ""))

  @property
  def block_sizes(self):
    if self.blocks is not None:
      return self.blocks
    return TPU_BLOCKS if self.backend == "tpu" else GPU_BLOCKS


def make_inputs(case: Case, seed: int = 0):
  """Random q, k, v, c and segment ids (or None). Row 0 holds four
  documents, the last with the first one's id; other rows one document."""
  b, t, h, hkv = case.batch, case.length, case.heads, case.kv_heads
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  dtype = jnp.dtype(case.dtype)
  q = jax.random.normal(keys[0], (b, t, h, case.dim_k)).astype(dtype)
  k = jax.random.normal(keys[1], (b, t, hkv, case.dim_k)).astype(dtype)
  v = jax.random.normal(keys[2], (b, t, hkv, case.dim_v)).astype(dtype)
  if case.strong:
    # log f from about -20 to -1e-3: weak gates among strong ones.
    log_f = -jnp.exp(jax.random.uniform(keys[3], (b, t, h), minval=-7.0,
                                        maxval=3.0))
  else:
    log_f = jax.nn.log_sigmoid(3.0 + jax.random.normal(keys[3], (b, t, h)))
  c = jnp.cumsum(log_f, axis=1)
  ids = None
  if case.segments:
    cuts = sorted({t // 3, t // 2, t // 2 + min(5, t // 4)} - {0, t})
    row = np.zeros(t, np.int32)
    for n, cut in enumerate(cuts):
      row[cut:] = [1, 2, 0][n] if n < 3 else n
    ids = jnp.asarray(np.stack([row] + [np.full(t, 7, np.int32)] * (b - 1)))
  return {"q": q, "k": k, "v": v, "c": c}, ids


def _outputs_and_grads(fn, inputs):
  """``(o, {name: gradient})`` for fixed random cotangents, compiled as one
  program with ``cpu_jit``."""
  o_shape = jax.eval_shape(fn, inputs)
  cotangent = jax.random.normal(jax.random.PRNGKey(1), o_shape.shape)

  def run(inputs, cotangent):
    o, vjp = jax.vjp(fn, inputs)
    return o, vjp(cotangent.astype(o.dtype))[0]

  return cpu_jit(run)(inputs, cotangent)


def kernel_errors(case: Case, *, interpret: bool):
  """Relative RMS errors of the kernels against the reference, given the
  same (rounded) inputs in float32."""
  inputs, ids = make_inputs(case)

  def kernel(x):
    return forgetting_attention(
        x["q"], x["k"], x["v"], x["c"], segment_ids=ids,
        window_size=case.window, block_sizes=case.block_sizes,
        backend=case.backend, interpret=interpret)

  def reference(x):
    return forgetting_attention_reference(
        x["q"], x["k"], x["v"], x["c"], segment_ids=ids,
        window_size=case.window)

  o, grads = _outputs_and_grads(kernel, inputs)
  ref_o, ref_grads = _outputs_and_grads(
      reference, {n: x.astype(jnp.float32) for n, x in inputs.items()})
  assert o.dtype == inputs["v"].dtype
  errors = {"o": rel_rms(o, ref_o)}
  for name in GRAD_ARGS:
    assert grads[name].dtype == inputs[name].dtype, name
    grad = np.asarray(grads[name], np.float32)
    errors["d" + name] = (rel_rms(grad, ref_grads[name])
                          if np.all(np.isfinite(grad)) else float("inf"))
  return errors


CASES = [
    pytest.param(Case("tpu", 37), marks=pytest.mark.slow),
    Case("tpu", 300, batch=2, heads=4, kv_heads=2, segments=True,
         window=150, blocks=TPU_MIXED),
    Case("gpu", 70, batch=2, heads=4, kv_heads=2, segments=True, window=9),
    Case("gpu", 45, heads=3, dim_k=8, dim_v=40, strong=True),
    pytest.param(Case("gpu", 100, segments=True, strong=True, window=40),
                 marks=pytest.mark.slow),
]
BFLOAT16_CASES = [
    Case("tpu", 200, heads=4, kv_heads=2, segments=True, dtype="bfloat16"),
    Case("gpu", 64, window=20, strong=True, dtype="bfloat16"),
]


class _KernelChecks:
  """The checks; subclasses say whether they run in interpret mode."""
  interpret: bool

  def skip_unless_runnable(self, backend):
    if not self.interpret and backend != ACCELERATOR:
      pytest.skip(f"the {backend} kernel compiles only on a {backend}")

  @pytest.mark.parametrize("case", CASES, ids=str)
  def test_matches_reference(self, case):
    self.skip_unless_runnable(case.backend)
    assert_close_errors(kernel_errors(case, interpret=self.interpret), 1e-5,
                        label=str(case))

  @pytest.mark.parametrize("case", BFLOAT16_CASES, ids=str)
  def test_bfloat16(self, case):
    self.skip_unless_runnable(case.backend)
    assert_close_errors(kernel_errors(case, interpret=self.interpret), 1e-2,
                        label=str(case))


class TestKernelsInterpret(_KernelChecks):
  interpret = True


@pytest.mark.skipif(ACCELERATOR is None, reason="needs a TPU or a GPU")
class TestKernelsCompiled(_KernelChecks):
  interpret = False


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_single_token(backend):
  """T = 1: the one key gets all the weight, so ``o = v`` and ``dv = do``
  summed over the group, and the scores and gates get no gradient (up to
  the rounding of ``delta = o . do`` against ``do . v``)."""
  inputs, _ = make_inputs(Case(backend, 1, heads=4, kv_heads=2))
  o, grads = _outputs_and_grads(
      lambda x: forgetting_attention(
          x["q"], x["k"], x["v"], x["c"], backend=backend, interpret=True,
          block_sizes=Case(backend, 1).block_sizes), inputs)
  do = jax.random.normal(jax.random.PRNGKey(1), o.shape)
  np.testing.assert_allclose(o, jnp.repeat(inputs["v"], 2, axis=2),
                             rtol=1e-6)
  np.testing.assert_allclose(grads["v"], do.reshape(1, 1, 2, 2, -1).sum(3),
                             rtol=1e-6, atol=1e-6)
  for name in ("q", "k", "c"):
    assert np.max(np.abs(grads[name])) < 1e-5, name


def test_by_platform_under_scan_and_default_blocks():
  """Without a backend a CPU call runs the Mosaic kernels in interpret mode
  with the default blocks; inside ``lax.scan`` (two layers that share the
  gates), gradients through every step."""
  inputs, ids = make_inputs(Case("tpu", 20, heads=2, kv_heads=2,
                                 dim_v=16, segments=True))

  def layers(attention):
    def run(x):
      def step(h, _):
        return attention(h, x["k"], x["v"], x["c"], segment_ids=ids), None
      return jax.lax.scan(step, x["q"], None, length=2)[0]
    return run

  o, grads = _outputs_and_grads(layers(forgetting_attention), inputs)
  ref_o, ref_grads = _outputs_and_grads(
      layers(forgetting_attention_reference), inputs)
  errors = {"o": rel_rms(o, ref_o)}
  errors.update({"d" + n: rel_rms(grads[n], ref_grads[n]) for n in GRAD_ARGS})
  assert_close_errors(errors, 1e-5, label="scan")


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("own, step", [(16, 32), (32, 16), (16, 16)])
def test_walks_visit_exactly_the_visible_blocks(own, step, window):
  """Every block pair holding a visible (query, key) pair is visited, and
  each program's first and last visited blocks hold one (no block is
  visited before or after them needlessly)."""
  t, t_pad = 150, 160
  ids = np.repeat([3, 1, 3, 2, 2, 5], [10, 40, 1, 29, 0, 70])[None]
  lay = layout.make_layout(
      (1, t, 1, 16), 1, 16, BlockSizes("gpu", block_q=16, block_k=16,
                                       backward_block_q=32,
                                       backward_block_k=32),
      bf16=False, window=window, segments=True)
  assert lay.t_pad == t_pad
  doc = layout.documents_to_kernel(
      layout.document_index(jnp.asarray(ids)), lay)
  padded_ids = np.concatenate([ids, np.full((1, t_pad - t), -1)], axis=1)
  mask = np.asarray(allowed_pairs(t_pad, padded_ids, window))[0]
  for kind, block_q, block_k in (("keys", own, step), ("queries", step, own)):
    if kind == "keys":
      walk = layout.key_walk(lay, block_q, block_k)
      first = np.asarray(layout.key_bounds(walk, doc, lay))
      last = walk.last
    else:
      walk = layout.query_walk(lay, block_q, block_k)
      first, last = walk.first, np.asarray(layout.query_bounds(walk, doc,
                                                               lay))
    pairs = mask.reshape(t_pad // block_q, block_q, t_pad // block_k,
                         block_k).any(axis=(1, 3))             # [NQ, NK]
    if kind == "queries":
      pairs = pairs.T
    for n, row in enumerate(pairs):
      visible = np.flatnonzero(row)
      assert visible.min() == first[n] and visible.max() == last[n], (
          kind, n, visible, first[n], last[n])
      assert last[n] - first[n] + 1 <= walk.steps


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_exports_kernels(platform, dtype):
  """Forward and backward lower to the platform's Pallas kernels."""
  case = Case("tpu", 20, heads=4, kv_heads=2, segments=True, window=8,
              dtype=jnp.dtype(dtype).name)
  inputs, ids = make_inputs(case)
  args = [inputs[n] for n in GRAD_ARGS]

  def forward(*args):
    return forgetting_attention(*args, segment_ids=ids, window_size=8)

  def loss(*args):
    return jnp.sum(forward(*args).astype(jnp.float32))

  for fn, kernels in ((forward, ["forgetting_attn_fwd"]),
                      (jax.grad(loss, argnums=(0, 1, 2, 3)),
                       ["forgetting_attn_fwd", "forgetting_attn_dq",
                        "forgetting_attn_dkv"])):
    assert_kernels(exported_text(fn, platform, *args), platform, kernels)


def _valid():
  inputs, _ = make_inputs(Case("tpu", 8, heads=4, kv_heads=2))
  return inputs


@pytest.mark.parametrize("change, message", [
    ({"q": jnp.zeros((1, 8, 4))}, "q must be"),
    ({"k": jnp.zeros((1, 8, 3, 16))}, "k must be"),
    ({"k": jnp.zeros((1, 8, 2, 8))}, "k must be"),
    ({"v": jnp.zeros((1, 8, 4, 24))}, "v must be"),
    ({"c": jnp.zeros((1, 8, 2))}, "c must be"),
    ({"q": jnp.zeros((1, 8, 4, 16), jnp.int32)}, "q must be floating"),
])
def test_rejects_bad_shapes(change, message):
  inputs = {**_valid(), **change}
  with pytest.raises(ValueError, match=message):
    forgetting_attention(inputs["q"], inputs["k"], inputs["v"], inputs["c"])


@pytest.mark.parametrize("kwargs, message", [
    ({"segment_ids": jnp.zeros((1, 7), jnp.int32)}, "segment_ids"),
    ({"window_size": 0}, "window_size"),
    ({"window_size": 2.5}, "window_size"),
    ({"backend": "cpu"}, "backend"),
    ({"interpret": True}, "explicit backend"),
    ({"block_sizes": 16}, "BlockSizes"),
])
def test_rejects_bad_arguments(kwargs, message):
  x = _valid()
  with pytest.raises(ValueError, match=message):
    forgetting_attention(x["q"], x["k"], x["v"], x["c"], **kwargs)


def test_rejects_a_traced_scale():
  x = _valid()
  with pytest.raises(ValueError, match="scale"):
    jax.jit(lambda s: forgetting_attention(x["q"], x["k"], x["v"], x["c"],
                                           scale=s))(0.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "tpu", "block_q": 64}, "multiple of 128"),
    ({"backend": "tpu", "backward_block_k": 200}, "multiple of 128"),
    ({"backend": "tpu", "num_warps": 4}, "GPU settings"),
    ({"backend": "gpu", "block_k": 24}, "power of two"),
    ({"backend": "gpu", "backward_block_q": 8}, "power of two"),
    ({"backend": "gpu", "num_warps": 3}, "num_warps"),
    ({"backend": "gpu", "num_stages": 0}, "num_stages"),
    ({"backend": "mps"}, "backend"),
])
def test_block_sizes_validate(kwargs, message):
  with pytest.raises(ValueError, match=message):
    BlockSizes(**kwargs)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("bf16", [True, False])
@pytest.mark.parametrize("width", [64, 256])
def test_default_tiles_are_valid(backend, bf16, width):
  tiles = BlockSizes.default(backend).tiles(bf16=bf16, k_pad=width,
                                            v_pad=width)
  BlockSizes(backend, **dataclasses.asdict(tiles))
