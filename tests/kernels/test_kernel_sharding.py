"""Pallas kernels under a sharded ``jit`` run per shard (``shard_map`` over
the batch and head axes) instead of gathering their operands.

Eight CPU devices (``conftest.py``), a mesh ``data=2, fsdp=2, tensor=2,
sequence=1``, the kernels in interpret mode: the compiled program holds no
all-gather, and its values equal the unsharded call's. (Without the
``shard_map``, with ``kernel_sharding.split_axes`` patched to find no axes,
the same programs hold all-gathers: the check can fail.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from lin_attn_jax import ops
from lin_attn_jax.ops.common import kernel_sharding
from lin_attn_jax.testing import rel_rms

B, T, H = 4, 20, 2


def _mesh():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  return jax.make_mesh((2, 2, 2, 1), ("data", "fsdp", "tensor", "sequence"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)


def _inputs(op):
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(keys[0], (B, T, H, 8))
  k = jax.random.normal(keys[1], (B, T, H, 8))
  v = jax.random.normal(keys[2], (B, T, H, 8))
  if op == "simple_gla":
    g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (B, T, H)))
    return (q, k, v, g), ("bthk", "bthk", "bthv", "bth")
  beta = jax.nn.sigmoid(jax.random.normal(keys[3], (B, T, H)))
  g = jax.nn.log_sigmoid(jax.random.normal(keys[4], (B, T, H)))
  return (q, k, v, beta, g), ("bthk", "bthk", "bthv", "bth", "bth")


_OPS = {
    "simple_gla": functools.partial(ops.chunk_simple_gla, impl="pallas",
                                    chunk_size=16, output_final_state=True),
    "gated_delta_rule": functools.partial(
        ops.chunk_gated_delta_rule, impl="pallas", chunk_size=16,
        output_final_state=True, use_qk_l2norm=True),
}


def _spec(letters):
  return P(*({"b": ("data", "fsdp"), "h": "tensor"}.get(c) for c in letters))


def _compiled(op, mesh, args, layouts):
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, NamedSharding(mesh, _spec(l)))
              for x, l in zip(args, layouts)]
    fn = jax.jit(lambda *a: _OPS[op](*a))
    return fn.lower(*placed).compile(), placed


@pytest.mark.parametrize("op", [
    "simple_gla",
    pytest.param("gated_delta_rule", marks=pytest.mark.benchmark),
])
def test_kernel_runs_per_shard(op):
  mesh = _mesh()
  args, layouts = _inputs(op)
  compiled, placed = _compiled(op, mesh, args, layouts)
  assert "all-gather" not in compiled.as_text()
  o, state = compiled(*placed)
  ref_o, ref_state = jax.jit(_OPS[op])(*args)
  assert o.sharding.spec == _spec("bthv")
  # The same kernels on the same rows; XLA's float32 products around them
  # (the delta rule's WY terms) may round differently per shard.
  assert rel_rms(o, ref_o) < 1e-6
  assert rel_rms(state, ref_state) < 1e-6


def test_split_axes_keep_what_divides():
  mesh = jax.sharding.AbstractMesh((2, 3, 1), ("data", "fsdp", "tensor"))
  assert kernel_sharding.split_axes(mesh, ("data", "fsdp"), 12) == ("data",
                                                                     "fsdp")
  assert kernel_sharding.split_axes(mesh, ("data", "fsdp"), 4) == ("data",)
  assert kernel_sharding.split_axes(mesh, ("tensor",), 4) == ()
  assert kernel_sharding.split_axes(jax.sharding.get_abstract_mesh(),
                                    ("data",), 4) == ()


@pytest.mark.parametrize("op", [
    "simple_gla",
    pytest.param("gated_delta_rule", marks=pytest.mark.slow),
])
def test_gpu_chunk_kernels_run_per_shard(op, monkeypatch):
  """The chunk-parallel GPU kernels (interpret mode, as the CUDA branch
  runs them) per shard equal the unsharded call, with no all-gather."""
  from lin_attn_jax.ops.delta_rule import chunk as delta_rule_chunk
  from pallas_kernels.common import dispatch as kernel_dispatch
  monkeypatch.setattr(kernel_dispatch, "by_platform",
                      lambda backend, interpret, fn, *args: fn("gpu", True,
                                                               *args))
  monkeypatch.setattr(delta_rule_chunk, "by_platform",
                      lambda cuda, tpu, default: cuda())
  monkeypatch.setattr(delta_rule_chunk, "GPU_CHUNK_DTYPES",
                      (jax.numpy.dtype("float32"),))
  from pallas_kernels.delta_rule import chunk_delta_rule_gpu
  monkeypatch.setattr(delta_rule_chunk, "chunk_delta_rule_gpu",
                      functools.partial(chunk_delta_rule_gpu, interpret=True))
  test_kernel_runs_per_shard(op)


@pytest.mark.slow
def test_tpu_delta_rule_chunk_kernels_run_per_shard(monkeypatch):
  """The delta rule's chunk-parallel TPU kernels (interpret mode, as the
  TPU branch runs them) per shard equal the unsharded call, with no
  all-gather."""
  from lin_attn_jax.ops.delta_rule import chunk as delta_rule_chunk
  from pallas_kernels.delta_rule import chunk_delta_rule_tpu
  from pallas_kernels.gated_linear import BlockSizes
  monkeypatch.setattr(delta_rule_chunk, "by_platform",
                      lambda cuda, tpu, default: tpu())
  monkeypatch.setattr(delta_rule_chunk, "chunk_delta_rule_tpu",
                      functools.partial(
                          chunk_delta_rule_tpu, interpret=True,
                          block_sizes=BlockSizes("tpu", sub_chunk=16,
                                                 chunk=32)))
  test_kernel_runs_per_shard("gated_delta_rule")


def test_forgetting_attn_kernels_run_per_shard():
  """Forgetting attention's kernels under the mesh, batch over ``data x
  fsdp`` and the key/value heads (and with them their query heads) over
  ``tensor``: outputs and the gradients of q, k, v and g, with grouped
  heads and segment ids, equal the single-device kernel call; the program
  holds no all-gather."""
  mesh = _mesh()
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  args = (jax.random.normal(keys[0], (B, T, 2 * H, 8)),
          jax.random.normal(keys[1], (B, T, H, 8)),
          jax.random.normal(keys[2], (B, T, H, 12)),
          jax.nn.log_sigmoid(2.0 + jax.random.normal(keys[3],
                                                      (B, T, 2 * H))),
          jnp.repeat(jnp.array([[0, 1], [0, 0], [3, 1], [2, 2]]), T // 2,
                     axis=1),
          jax.random.normal(keys[4], (B, T, 2 * H, 12)))
  layouts = ("bthk", "bthk", "bthv", "bth", "bt", "bthv")

  def run(q, k, v, g, ids, cotangent):
    o, vjp = jax.vjp(lambda *x: ops.chunk_forgetting_attn(
        *x, segment_ids=ids, window_size=7, impl="pallas"), q, k, v, g)
    return o, vjp(cotangent)

  expected = jax.jit(run)(*args)
  with jax.set_mesh(mesh):
    placed = [jax.device_put(x, NamedSharding(mesh, _spec(l)))
              for x, l in zip(args, layouts)]
    compiled = jax.jit(run).lower(*placed).compile()
  assert "all-gather" not in compiled.as_text()
  o, grads = compiled(*placed)
  assert o.sharding.spec == _spec("bthv")
  for name, got, want in zip(("o", "dq", "dk", "dv", "dg"),
                             (o,) + grads, (expected[0],) + expected[1]):
    assert rel_rms(got, want) < 1e-6, name
