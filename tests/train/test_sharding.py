"""Meshes, logical axis rules and the placement of model parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from lin_attn_jax import sharding as shd
from lin_attn_jax.models.lm import LM, LMConfig


def test_parse_mesh_spec():
  assert shd.parse_mesh_spec("data=2,fsdp=-1", 8) == {
      "data": 2, "fsdp": 4, "expert": 1, "tensor": 1, "sequence": 1}
  assert shd.parse_mesh_spec(None, 8)["fsdp"] == 8
  assert shd.parse_mesh_spec({"tensor": 2, "fsdp": 4}, 8)["tensor"] == 2


@pytest.mark.parametrize("spec, match", [
    ("model=2", r"unknown mesh axis \['model'\]"),
    ("fsdp=3", r"needs 3 devices, but there are 8"),
    ("fsdp=-1,data=-1", r"only one mesh axis may be -1"),
    ("data=3,fsdp=-1", r"take 3 devices, which does not divide the 8"),
    ("fsdp", r"must look like 'fsdp=4'"),
    ("fsdp=0", r"positive size or -1"),
    ("fsdp=2,fsdp=4", r"given twice"),
])
def test_bad_mesh_specs(spec, match):
  with pytest.raises(ValueError, match=match):
    shd.parse_mesh_spec(spec, 8)


def test_make_mesh_axes():
  mesh = shd.make_mesh("fsdp=4,tensor=2")
  assert mesh.axis_names == shd.MESH_AXES
  assert dict(zip(mesh.axis_names, mesh.axis_sizes)) == {
      "data": 1, "fsdp": 4, "expert": 1, "tensor": 2, "sequence": 1}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_rules_place_left_to_right_without_reusing_an_axis():
  sizes = {"data": 1, "fsdp": 4, "tensor": 2, "sequence": 1}
  tp = shd.PRESETS["fsdp_tp"]
  assert tp.spec((64, 32), ("embed", "heads"), sizes) == P("fsdp", "tensor")
  assert tp.spec((32, 64), ("heads", "embed"), sizes) == P("tensor", "fsdp")
  assert tp.spec((256, 64), ("vocab", "embed"), sizes) == P("tensor", "fsdp")
  # A dimension that does not divide falls to the next candidate or stays
  # whole.
  assert tp.spec((6,), ("heads",), {**sizes, "fsdp": 2, "tensor": 4}) == P(
      "fsdp")
  assert tp.spec((5,), ("heads",), sizes) == P(None)
  fsdp = shd.PRESETS["fsdp"]
  assert fsdp.spec((64, 32), ("embed", "heads"), sizes) == P("fsdp", None)
  assert fsdp.spec((2, 32), ("heads", "embed"), sizes) == P(None, "fsdp")
  assert shd.PRESETS["dp"].spec((64, 32), ("embed", "heads"), sizes) == P(
      None, None)
  assert fsdp.spec((8, 16), ("batch", "length"),
                   {**sizes, "data": 2}) == P(("data", "fsdp"), None)


def test_state_shardings_follow_the_declared_axes():
  mesh = shd.make_mesh("fsdp=4,tensor=2")
  config = LMConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2,
                    mixer="gla")
  abstract = nnx.eval_shape(lambda: LM(config, rngs=nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param)
  placed = shd.state_shardings(params, mesh, "fsdp_tp")
  mixer = placed["blocks"][0]["mixer"]
  assert mixer["q_proj"]["kernel"].get_value().spec == P("fsdp", "tensor")
  assert mixer["o_proj"]["kernel"].get_value().spec == P("tensor", "fsdp")
  assert placed["embed"]["embedding"].get_value().spec == P("tensor", "fsdp")


def test_constrain_is_a_no_op_without_mesh_or_rules():
  x = jnp.ones((4, 8, 16))
  assert shd.constrain(x, ("batch", "length", "act_embed")) is x
  with shd.use_rules("fsdp"):
    assert shd.constrain(x, ("batch", "length", "act_embed")) is x


@pytest.mark.parametrize("spec, rules, config, match", [
    ("tensor=8", "fsdp_tp", dict(n_heads=4), r"n_heads = 4 is not divisible "
     r"by the tensor mesh axis \(8\)"),
    ("fsdp=8", "fsdp", dict(d_model=36, n_heads=2),
     r"d_model = 36 is not divisible by the fsdp mesh axis \(8\)"),
    ("tensor=2,fsdp=4", "fsdp_tp", dict(vocab_size=255),
     r"vocab_size = 255 is not divisible by the tensor mesh axis \(2\) "
     r"\(pad the vocabulary"),
])
def test_model_that_does_not_split(spec, rules, config, match):
  base = dict(vocab_size=256, d_model=32, n_layers=1, n_heads=8)
  base.update(config)
  with pytest.raises(ValueError, match=match):
    shd.check_model_fits(LMConfig(**base), shd.make_mesh(spec), rules)


def test_unknown_rules():
  with pytest.raises(ValueError, match="unknown sharding rules 'zero3'"):
    shd.get_rules("zero3")


def test_per_device_bytes():
  mesh = shd.make_mesh("fsdp=8")
  x = jax.device_put(np.zeros((64, 4), np.float32),
                     jax.sharding.NamedSharding(mesh, P("fsdp", None)))
  assert shd.per_device_bytes(x) == 64 * 4 * 4 // 8
