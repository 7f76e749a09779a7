"""``convert.load_sharded``: a checkpoint converted straight into the
sharded layout of 8 CPU devices equals the plain load, each device holds
about 1/8 of the bytes, and no sharded parameter's HF tensor is read
whole."""

from __future__ import annotations

import collections
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lin_attn_jax import convert
from lin_attn_jax import sharding as shd
from lin_attn_jax.convert import core, safetensors_io, sharded
from tests.convert.test_convert import FIXTURES


def _leaves(tree):
  return {jax.tree_util.keystr(p): x
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("name", ["nemotron_h", "qwen3_next"])
def test_sharded_load_equals_the_plain_load_and_reads_slices(name,
                                                             monkeypatch):
  path = os.path.join(FIXTURES, name)
  reads = collections.defaultdict(list)
  whole = []
  read_slice = safetensors_io.TensorInfo.read_slice

  def counted(self, index):
    out = read_slice(self, index)
    reads[(self.path, self.start)].append(out.size)
    return out

  monkeypatch.setattr(safetensors_io.TensorInfo, "read_slice", counted)
  monkeypatch.setattr(safetensors_io.TensorInfo, "read",
                      lambda self: whole.append(self) or 1 / 0)
  mesh = shd.make_mesh()
  assert mesh.devices.size == 8
  lm, config, _ = convert.load_sharded(path, mesh)
  monkeypatch.undo()
  want, want_config, _ = convert.load_pretrained(path)
  assert config == want_config
  got, expected = _leaves(core.loaded_state(lm)), _leaves(
      core.loaded_state(want))
  assert got.keys() == expected.keys()
  for key, value in got.items():
    np.testing.assert_array_equal(value, expected[key], err_msg=key)

  # Per device: 1/8 of every sharded parameter, all of a replicated one.
  split = {k for k, v in got.items() if any(v.sharding.spec)}
  total = sum(v.nbytes for v in got.values())
  small = sum(v.nbytes for k, v in got.items() if k not in split)
  assert sum(got[k].nbytes for k in split) > 0.9 * total
  for key in split:
    assert {s.data.nbytes for s in got[key].addressable_shards} == {
        got[key].nbytes // 8}, key
  per_device = shd.per_device_bytes(got)
  assert per_device <= (total - small) / 8 + small
  assert per_device < 0.15 * total

  # Reads: no whole-tensor read at all; each read of an HF tensor of
  # sharded parameters is smaller than the tensor and no larger than the
  # device slice it serves (a replicated parameter's tensors are read
  # whole, once per device slice).
  assert not whole
  _, entries, _ = convert.plan(core.read_config(path))
  infos = safetensors_io.checkpoint_tensors(path)
  made = {}
  for entry in entries:
    for p in entry.ours:
      made.setdefault(entry.hf, []).append(
          "".join(f"['{k}']" if isinstance(k, str) else f"[{k}]" for k in p))
  checked = 0
  for hf_names, ours in made.items():
    if not all(o in split for o in ours):
      continue
    for hf_name in hf_names:
      info = infos[hf_name]
      size = int(np.prod(info.shape))
      sizes = reads[(info.path, info.start)]
      shard = max(got[o].size // 8 for o in ours)
      assert sizes and max(sizes) < size and max(sizes) <= shard, (
          hf_name, sizes, shard)
      checked += 1
  assert checked > 0.5 * len(infos)


def test_a_value_computing_entry_is_read_whole(tmp_path):
  """An entry that does more than move elements (here a doubling) is
  converted from the whole tensor, sliced, and named in ``whole_reads``;
  gather entries are not."""
  value = np.arange(64, dtype=np.float32).reshape(16, 4)
  file = str(tmp_path / "t.safetensors")
  safetensors_io.write_file(file, {"w": value, "v": value})
  infos = safetensors_io.read_header(file)
  entries = [core.Entry(("w",), (("a",),), lambda w: (2 * w,),
                        lambda a: (a / 2,)),
             core.Entry(("v",), (("b",),), lambda v: (v.reshape(8, 8),),
                        lambda b: (b.reshape(16, 4),))]
  abstract = {"a": jax.ShapeDtypeStruct((16, 4), jnp.float32),
              "b": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
  mesh = shd.make_mesh()
  spec = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("fsdp"))
  loaded = sharded.sharded_params(entries, infos, abstract,
                                  {"a": spec, "b": spec}, np.float32)
  assert loaded.whole_reads == ["w"]
  np.testing.assert_array_equal(loaded.params["a"], 2 * value)
  np.testing.assert_array_equal(loaded.params["b"], value.reshape(8, 8))
