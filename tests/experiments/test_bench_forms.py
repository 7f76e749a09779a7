"""``experiments.bench_forms``'s per-op options: how ``--options`` entries
are read, and that the options reach the compiled forms in place of the
registry's own."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from experiments.bench_forms import parse_options
from experiments.bench_utils import compile_form
from lin_attn_jax import ops
from lin_attn_jax.ops import registry


def test_parse_options():
  options = parse_options(["moba:block_size=256, top_k=4",
                           "nsa:chunk_size=None,impl=pallas",
                           "moba:chunk_size=32"])
  assert options == {"moba": {"block_size": 256, "top_k": 4,
                              "chunk_size": 32},
                     "nsa": {"chunk_size": None, "impl": "pallas"}}
  for entry in ("block_size=256", "moba:block_size", "moba:=3", ":a=1"):
    with pytest.raises(ValueError, match="--options entry"):
      parse_options([entry])


def test_options_replace_the_registry_ones():
  """MoBA with blocks of 8 and top-k 2 (the registry's are 4 and 3), the
  chunk form in tiles of 8 queries: both compiled forms give the op's own
  output for those options, which the registry's options do not."""
  spec = registry.get_spec("moba")
  inputs = spec.make_inputs(jax.random.PRNGKey(0),
                            registry.Dims(batch=1, length=40, heads=2,
                                          dim_k=8, dim_v=8), False)
  inputs["segment_ids"] = None
  qkv = [inputs[n] for n in ("q", "k", "v")]
  options = dict(block_size=8, top_k=2)
  expected = jax.jit(lambda *x: ops.parallel_moba(*x, **options))(*qkv)
  registry_default = jax.jit(lambda *x: ops.parallel_moba(
      *x, block_size=registry.MOBA_BLOCK, top_k=registry.MOBA_TOP_K))(*qkv)
  assert np.max(np.abs(expected - registry_default)) > 1e-2
  for form in ("naive", "chunk"):
    forward, _, temp, grad_temp = compile_form(spec, form, inputs, 8, options)
    o, state = forward()
    assert state is None and temp > 0 and grad_temp > 0
    np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)
