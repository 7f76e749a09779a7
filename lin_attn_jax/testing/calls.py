"""Calls of every op form and every decoding step, generated from the op
specs (``lin_attn_jax.ops.registry``), for the checks that run on all of them.

A ``Call`` is one function with tiny inputs: a sequence form with the
inputs of its spec, or an op's step (``StepForm.step``) on one token of them
with the state. Its array inputs are abstract (``jax.ShapeDtypeStruct``,
from ``jax.eval_shape`` of the spec's input maker, so that nothing is
compiled); ``concrete_arrays`` gives them values where a check needs some.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from lin_attn_jax.ops.registry import Dims, StepForm, all_specs

# Sizes all different (so that a wrong rank cannot pass for another layout),
# 7 tokens in chunks of 4 (one padded), K != V.
DIMS = Dims(batch=3, length=7, heads=2, dim_k=4, dim_v=6)
CHUNK_SIZE = 4
# Inside every op's domain: log-decays <= 0, SSM poles < 0, beta, scales,
# projections and data of any sign.
CONCRETE_FLOAT = -0.5


@dataclasses.dataclass(frozen=True)
class Call:
  name: str                      # "<op>.<form>", or "<op>.<step function>"
  fn: Callable                   # called as fn(**static, **arrays)
  arrays: Mapping[str, Any]      # abstract array inputs (a pytree each)
  static: Mapping[str, Any]      # everything else, passed as is

  def run(self, arrays):
    return self.fn(**self.static, **arrays)


def _abstract(make):
  """``make()`` -> dict of inputs, run abstractly: ``(arrays as
  ShapeDtypeStructs, the non-array entries as they are)``."""
  static = {}

  def arrays_only():
    inputs = make()
    static.update({n: x for n, x in inputs.items()
                   if x is None or isinstance(x, (int, float, str, tuple))})
    return {n: x for n, x in inputs.items() if n not in static}

  return jax.eval_shape(arrays_only), static


def _step_inputs(form: StepForm, inputs):
  """The step's inputs on the first token: tokens ``[B, ...]``, the other
  inputs whole, the initial state (or the form's own) and a reset flag."""
  inputs = dict(inputs)
  segment_ids = inputs.pop("segment_ids", None)
  state = inputs.pop("initial_state", None)
  if state is None and form.init_state is not None:
    state = form.init_state(**inputs)
  step = dict(inputs, **{n: inputs[n][:, 0] for n in form.token_args})
  if state is not None:
    step["state"] = state
  if segment_ids is not None:
    step["reset"] = segment_ids[:, 0] != segment_ids[:, 1]
  return step


@functools.lru_cache(maxsize=None)
def op_calls() -> tuple[Call, ...]:
  """Every form of every op spec, and every op's step on its own."""
  calls = []
  for spec in all_specs().values():
    make = functools.partial(spec.make_inputs, jax.random.PRNGKey(0), DIMS,
                             True)
    arrays, static = _abstract(make)
    for form_name, form in spec.forms.items():
      options = {"output_final_state": True}
      if form_name in spec.chunked:
        options["chunk_size"] = CHUNK_SIZE
      calls.append(Call(f"{spec.name}.{form_name}", form, arrays,
                        {**static, **options}))
    steps = [f for f in spec.forms.values() if isinstance(f, StepForm)]
    for form in steps + ([spec.step] if spec.step is not None else []):
      step_arrays, step_static = _abstract(
          lambda form=form: _step_inputs(form, make()))
      step_name = getattr(form.step, "__name__", "step").strip("_")
      calls.append(Call(f"{spec.name}.{step_name}",
                        functools.partial(form.step, **form.static),
                        step_arrays, step_static))
  return tuple(calls)


def is_float(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def concrete_arrays(arrays):
  """Concrete values of the shapes of ``arrays`` (no compilation): floats
  ``CONCRETE_FLOAT``, integers 0, booleans False."""
  def fill(x):
    value = CONCRETE_FLOAT if is_float(x) else 0
    return jax.device_put(np.full(x.shape, value, x.dtype))
  return jax.tree.map(fill, arrays)
