"""``impl="auto" | "xla" | "pallas"`` on ``chunk_forgetting_attn``.

``impl="pallas"`` on CPU runs the kernels of ``pallas_kernels.
forgetting_attn`` in interpret mode; it must equal ``impl="xla"``, outputs
and the gradients of q, k, v and g for random cotangents, relative RMS
``1e-5``: both compute in float32 from the same gate sums ``c``, the
kernels' blocks and sums in another order (measured at most 5.4e-7, in
``dg``). The cases hold an odd length, grouped heads, segment ids and a
window. ``"auto"`` lowers to the kernels only where the dispatch rule
says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import ops
from lin_attn_jax.ops.common import dispatch
from lin_attn_jax.ops.forgetting_attn import chunk as fox_chunk
from lin_attn_jax.testing import assert_close_errors, rel_rms
from tests.kernels.test_kernels_gated_linear import (CUSTOM_CALLS, cpu_jit,
                                                     custom_calls,
                                                     exported_text)

TOL = 1e-5


def make_inputs(batch, length, heads, kv_heads, dim_k, dim_v, seed=0):
  """q, k, v and log forget gates ``log sigmoid(2 + N(0, 1))``."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  return dict(
      q=jax.random.normal(keys[0], (batch, length, heads, dim_k)),
      k=jax.random.normal(keys[1], (batch, length, kv_heads, dim_k)),
      v=jax.random.normal(keys[2], (batch, length, kv_heads, dim_v)),
      g=jax.nn.log_sigmoid(2.0 + jax.random.normal(keys[3],
                                                    (batch, length, heads))))


def _outputs_and_grads(impl, inputs, segment_ids, cotangent, *, window_size,
                       block_size):
  def form(x):
    return ops.chunk_forgetting_attn(**x, segment_ids=segment_ids,
                                     window_size=window_size,
                                     block_size=block_size, impl=impl)
  o, vjp = jax.vjp(form, inputs)
  return o, vjp(cotangent)[0]


# (length, heads, kv_heads, segment ids, window): odd T over several XLA
# blocks, two query heads per key head, three documents in row 0 (the last
# with row 1's id), a window shorter than a document; and one document, no
# window, one query head per key head.
CASES = [(37, 4, 2, True, 9), (21, 2, 2, False, None)]


@pytest.mark.parametrize("length, heads, kv_heads, segments, window", CASES)
def test_pallas_matches_xla(length, heads, kv_heads, segments, window):
  inputs = make_inputs(2, length, heads, kv_heads, 8, 12)
  ids = None
  if segments:
    row = np.repeat([0, 1, 2], [12, 13, length - 25])
    ids = jnp.asarray(np.stack([row, np.full(length, 2)]), jnp.int32)
  cotangent = jax.random.normal(jax.random.PRNGKey(5),
                                (2, length, heads, 12))
  results = {
      impl: cpu_jit(lambda x, c, impl=impl: _outputs_and_grads(
          impl, x, ids, c, window_size=window, block_size=16))(inputs,
                                                              cotangent)
      for impl in ("xla", "pallas")}
  (o, grads), (ref_o, ref_grads) = results["pallas"], results["xla"]
  errors = {"o": rel_rms(o, ref_o)}
  errors.update({"d" + name: rel_rms(grads[name], ref_grads[name])
                 for name in ("q", "k", "v", "g")})
  assert_close_errors(errors, TOL, label=f"T={length} H={heads}/{kv_heads}")


def test_invalid_impl_raises():
  x = make_inputs(1, 4, 2, 1, 8, 8)
  with pytest.raises(ValueError, match="impl must be one of"):
    ops.chunk_forgetting_attn(**x, impl="triton")


def _has_kernel(fn, inputs):
  return "pallas_call" in str(jax.make_jaxpr(fn)(inputs))


def test_auto_runs_xla_on_cpu(monkeypatch):
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "cpu")
  inputs = make_inputs(1, 8, 2, 1, 8, 8)
  assert not _has_kernel(
      lambda x: ops.chunk_forgetting_attn(**x, impl="auto"), inputs)
  assert _has_kernel(
      lambda x: ops.chunk_forgetting_attn(**x, impl="pallas"), inputs)


def test_auto_on_an_accelerator(monkeypatch):
  """With a TPU default backend and the kernel enabled on TPU, ``impl=
  "auto"`` lowers to the Mosaic kernel for tpu, to the XLA form for cuda
  (``AUTO_ON_CUDA``: no measurement on a GPU yet) and cpu, and to the XLA
  form on heads wider than ``AUTO_MAX_WIDTH``, where ``impl="pallas"``
  still runs the kernel. (The committed ``AUTO_ON_TPU`` keeps the XLA form
  too until a TPU measurement backs the kernel.)"""
  monkeypatch.setattr(dispatch, "_default_backend", lambda: "tpu")
  monkeypatch.setitem(dispatch.AUTO_ON_TPU, "forgetting_attn", "pallas")
  assert dispatch.AUTO_ON_CUDA["forgetting_attn"] == "xla"

  def form(impl):
    return lambda x: ops.chunk_forgetting_attn(**x, impl=impl)

  narrow = make_inputs(1, 8, 2, 1, 8, 8)
  for platform, calls in (("tpu", {CUSTOM_CALLS["tpu"]}), ("cuda", set()),
                          ("cpu", set())):
    assert custom_calls(exported_text(form("auto"), platform,
                                       narrow)) == calls, platform
  wide = make_inputs(1, 8, 2, 1, 8, fox_chunk.AUTO_MAX_WIDTH + 8)
  assert not _has_kernel(form("auto"), wide)
  assert _has_kernel(form("pallas"), wide)
