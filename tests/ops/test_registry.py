"""The table of ops (``lin_attn_jax.ops.registry``) and the harness's
checks of its arguments and of context parallelism."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from lin_attn_jax import testing
from lin_attn_jax.ops import registry

SPECS = registry.all_specs()


def test_table_covers_every_core():
  by_core = {core: [s.name for s in registry.core_specs(core)]
             for core in registry.CORES}
  names = [n for core in by_core.values() for n in core]
  assert len(names) == len(set(names)) == len(SPECS)
  assert {"gla", "kda", "ssd", "softmax_attn"} <= set(names)
  with pytest.raises(KeyError, match="unknown core"):
    registry.core_specs("mamba")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_is_complete(name):
  spec = SPECS[name]
  assert registry.get_spec(name) is spec
  assert "naive" in spec.forms and len(spec.forms) >= 1
  assert set(spec.chunked) <= set(spec.forms)
  assert set(spec.context_parallel) <= set(spec.forms) - {"naive"}
  inputs = jax.eval_shape(
      lambda: {n: x for n, x in spec.make_inputs(
          jax.random.PRNGKey(0), registry.Dims(length=8), False).items()
               if not isinstance(x, tuple)})
  assert set(spec.grad_args) <= set(inputs) | {"initial_state"}


def test_lookup_names_the_known_ops():
  with pytest.raises(KeyError, match="no op 'nope' in the registry; ops: "
                     r"\[.*'gla'"):
    registry.get_spec("nope")


# One op of each kind of sequence split, against the naive form (the
# harness's option; every op's split is in test_context_parallel.py, so
# the second and third kinds are slow here).
@pytest.mark.parametrize("name, parts", [
    ("gla", 2), pytest.param("gated_delta_rule", 4, marks=pytest.mark.slow),
    pytest.param("linear_scan", 8, marks=pytest.mark.slow)])
def test_check_forms_context_parallel(name, parts):
  errors = testing.check_forms(
      registry.get_spec(name), dims=registry.Dims(length=32, dim_k=8,
                                                  dim_v=4),
      chunk_size=4, forms=("chunk",), context_parallel=(parts,))
  assert set(errors) == {"chunk", f"chunk@sequence={parts}"}


def test_check_forms_argument_errors():
  spec = registry.get_spec("linear_attn")
  with pytest.raises(ValueError, match=r"no forms \['fused'\]"):
    testing.check_forms(spec, forms=("fused",))
  with pytest.raises(ValueError, match="splits a sequence"):
    testing.check_forms(spec, forms=("parallel",), context_parallel=(2,))
  with pytest.raises(ValueError, match="number of devices divisible"):
    testing.sequence_mesh(3)
  with pytest.raises(ValueError, match="no 'naive' form"):
    testing.check_forms(dataclasses.replace(
        spec, forms={"chunk": spec.forms["chunk"]}))


def test_numpy_inputs_are_differentiated():
  spec = registry.get_spec("linear_attn")
  inputs = testing.make_inputs(spec, registry.Dims(length=9, dim_k=4,
                                                   dim_v=6))
  as_numpy = {n: None if x is None else np.asarray(x)
              for n, x in inputs.items()}
  errors = testing.check_forms(spec, inputs=as_numpy, forms=("chunk",),
                               chunk_size=4)
  assert set(errors["chunk"]) == {"o", "state", "dq", "dk", "dv",
                                  "dinitial_state"}


def test_one_program_matches_separate_programs():
  """The same inputs and cotangents in both modes: a wrong form's errors
  (far above rounding) agree, and the right forms pass in both."""
  spec = registry.get_spec("hgrn")
  chunk = spec.forms["chunk"]

  def scaled(x, **inputs):
    return chunk(x=1.5 * x, **inputs)

  broken = dataclasses.replace(spec, forms={**spec.forms, "chunk": scaled})
  options = dict(dims=registry.Dims(length=21, dim_v=6), strong=True,
                 chunk_size=8, seed=3, raise_on_failure=False)
  separate = testing.check_forms(broken, **options)
  together = testing.check_forms(broken, one_program=True, **options)
  assert set(separate) == set(together) == {"parallel", "chunk", "recurrent"}
  assert separate["chunk"]["o"] > 0.1
  for quantity, error in separate["chunk"].items():
    if error > 1e-3:
      assert together["chunk"][quantity] == pytest.approx(error, rel=1e-3)
  for form in ("parallel", "recurrent"):
    assert max(together[form].values()) <= spec.tol
