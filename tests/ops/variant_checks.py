"""Checks that the delta-rule variants' test files share: the Pallas sweep
against the naive form (interpret mode), the sweep kernels in the exported
forward and backward, and bad inputs raised by every sequence form."""

from __future__ import annotations

import functools
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import pytest

from lin_attn_jax import testing
from lin_attn_jax.ops.registry import Dims, OpSpec
from tests.kernels.test_kernels_gated_linear import CUSTOM_CALLS, exported_text


def check_pallas_sweep(spec: OpSpec, chunk: Callable) -> None:
  """``chunk(..., impl="pallas")`` (the delta-rule core's sweep kernels in
  interpret mode on CPU) against the naive form: outputs, final state and
  gradients, two chunks and a remainder."""
  testing.check_chunk_variant(
      spec, functools.partial(chunk, use_qk_l2norm=True, impl="pallas"),
      dims=Dims(batch=1, length=20, dim_k=8, dim_v=8), seed=3, chunk_size=8)


def check_pallas_exports(spec: OpSpec, chunk: Callable, platform: str) -> None:
  """The gradient of ``chunk(..., impl="pallas")`` lowers to the core's
  sweep kernels on ``platform`` (TPU: Mosaic, CUDA: Triton), from a
  CPU-only machine."""
  inputs = spec.make_inputs(jax.random.PRNGKey(4), Dims(batch=1, length=20,
                                                        dim_k=16, dim_v=16),
                            False)
  inputs.pop("segment_ids")

  def loss(inputs):
    o, state = chunk(**inputs, impl="pallas", chunk_size=16,
                     output_final_state=True, use_qk_l2norm=True)
    return jnp.sum(o) + jnp.sum(state)

  text = exported_text(jax.grad(loss), platform, inputs)
  assert CUSTOM_CALLS[platform] in text


def check_forms_raise(spec: OpSpec, inputs: Mapping[str, object],
                      match: str) -> None:
  """Every sequence form of ``spec`` (all but the step) raises a
  ``ValueError`` matching ``match`` on ``inputs``."""
  for name, form in spec.forms.items():
    if name == "step":
      continue
    with pytest.raises(ValueError, match=match):
      form(**inputs)
