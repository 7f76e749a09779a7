"""``check_forms``: every form of an op against its naive form.

For an ``OpSpec`` (``lin_attn_jax.ops.registry``), each form other than
``"naive"`` is run on the same inputs as the naive form and compared with
it: outputs, final states and the gradients of every input in
``spec.grad_args`` (a random linear functional of the output and the final
state, so random cotangents), each as a relative RMS error. Every run is
under ``jax.jit``, inside a ``lax.scan`` body, under ``jax.grad``, with every
array an argument (``errors.outputs_and_grads``). The inputs carry segment
ids and an initial state unless asked otherwise; ``context_parallel`` runs
the forms that split a sequence (``spec.context_parallel``) over a mesh
axis ``"sequence"`` of each size given, against the same naive run.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
import numpy as np

from lin_attn_jax.ops.registry import Dims, OpSpec
from lin_attn_jax.testing import errors as errors_lib


class FormMismatch(AssertionError):
  """A form's errors against the naive form exceed their tolerance.

  ``errors`` holds every checked form's errors (``{form: {quantity:
  error}}``), ``failures`` those over tolerance.
  """

  def __init__(self, message, errors, failures):
    super().__init__(message)
    self.errors = errors
    self.failures = failures


def sequence_mesh(parts: int) -> jax.sharding.Mesh:
  """A mesh ``data x sequence`` of all devices with ``parts`` on
  ``sequence``."""
  count = jax.device_count()
  if parts < 1 or count % parts:
    raise ValueError(f"context_parallel={parts} needs a number of devices "
                     f"divisible by it; there are {count} (on CPU, set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  return jax.make_mesh((count // parts, parts), ("data", "sequence"),
                       axis_types=(AxisType.Auto,) * 2)


def make_inputs(spec: OpSpec, dims: Dims, *, strong: bool = False,
                initial_state: bool = True, segment_ids: bool = True,
                seed: int = 0) -> dict:
  """``spec``'s inputs, without the initial state or segment ids if not
  wanted."""
  inputs = spec.make_inputs(jax.random.PRNGKey(seed), dims, strong)
  if not initial_state and "initial_state" in inputs:
    inputs["initial_state"] = None
  if not segment_ids and "segment_ids" in inputs:
    inputs["segment_ids"] = None
  return inputs


def check_forms(spec: OpSpec, *, dims: Dims | None = None,
                inputs: Mapping[str, object] | None = None,
                strong: bool = False, initial_state: bool = True,
                segment_ids: bool = True, chunk_size: int | None = 16,
                dtype=jnp.float32, forms: Iterable[str] | None = None,
                context_parallel: Iterable[int] = (), seed: int = 0,
                cotangent_seed: int | None = None, tol: float | None = None,
                grad_tol: float | None = None, one_program: bool = False,
                compiler_options: Mapping[str, object] | None = None,
                raise_on_failure: bool = True) -> dict[str, dict[str, float]]:
  """Checks every form of ``spec`` against ``spec.forms["naive"]``.

  Args:
    spec: the op: its forms, input maker, gradient inputs and tolerances.
    dims: the problem size for ``spec.make_inputs`` (default ``Dims()``).
    inputs: the inputs themselves (arrays, NumPy's included, become traced
      arguments; other values are passed as they are), instead of
      ``make_inputs`` (then
      ``dims``, ``strong``, ``initial_state``, ``segment_ids`` and ``seed``
      are unused).
    strong: strong gates or decays (``make_inputs``' third argument).
    initial_state: whether the forms get the maker's initial state.
    segment_ids: whether the forms get the maker's segment ids.
    chunk_size: passed to the forms in ``spec.chunked`` (None: their own).
    dtype: the floating inputs of the checked forms are cast to it (the
      initial state stays float32); the naive form gets the same values in
      float32. Below float32 the tolerance is ``spec.low_precision_tol``.
    forms: the forms to check (default: all but ``"naive"``).
    context_parallel: sequence-axis sizes; each form of
      ``spec.context_parallel`` (among ``forms``) also runs under a mesh
      ``data x sequence`` with that many devices on ``sequence``. The
      length must split into that many equal parts (and whole chunks where
      the form needs them).
    seed: the input maker's key.
    cotangent_seed: the cotangents' seed (default ``seed``).
    tol, grad_tol: override the spec's tolerances (outputs and states;
      gradients).
    one_program: make the inputs (when ``inputs`` is None) and run the
      naive form and every form in one compiled program (the context
      parallel runs stay separate): one compilation instead of one per
      form, which is what checking tiny shapes costs.
    compiler_options: XLA options of that program (``one_program`` only),
      e.g. ``{"xla_backend_optimization_level": 0}``.
    raise_on_failure: raise ``FormMismatch`` when an error exceeds its
      tolerance (else only return the errors).

  Returns:
    ``{form: {"o": err, "state": err, "d<input>": err, ...}}``; a context
    parallel run is keyed ``"<form>@sequence=<P>"``.
  """
  if "naive" not in spec.forms:
    raise ValueError(f"op {spec.name!r} has no 'naive' form; forms: "
                     f"{sorted(spec.forms)}")
  names = [n for n in spec.forms if n != "naive"]
  if forms is not None:
    forms = tuple(forms)
    unknown = sorted(set(forms) - set(names))
    if unknown:
      raise ValueError(f"op {spec.name!r} has no forms {unknown}; forms: "
                       f"{sorted(spec.forms)}")
    names = [n for n in names if n in forms]
  cotangent_seed = seed if cotangent_seed is None else cotangent_seed
  low = jnp.dtype(dtype) != jnp.float32
  tol = (spec.low_precision_tol if low else spec.tol) if tol is None else tol
  grad_tol = ((spec.low_precision_tol if low else spec.grad_tol)
              if grad_tol is None else grad_tol)
  split = [n for n in names if n in spec.context_parallel]
  if context_parallel and not split:
    raise ValueError(f"op {spec.name!r} has no form among {names} that "
                     f"splits a sequence (spec.context_parallel="
                     f"{spec.context_parallel})")

  reference = functools.partial(spec.forms["naive"], output_final_state=True)

  def bound(name):
    options = {"output_final_state": True}
    if name in spec.chunked and chunk_size is not None:
      options["chunk_size"] = chunk_size
    return functools.partial(spec.forms[name], **options)

  def make():
    return make_inputs(spec, Dims() if dims is None else dims, strong=strong,
                       initial_state=initial_state, segment_ids=segment_ids,
                       seed=seed)

  if inputs is not None:
    # NumPy arrays become arguments (traced, differentiated) like the rest.
    inputs = {n: jnp.asarray(x) if isinstance(x, np.ndarray) else x
              for n, x in inputs.items()}
  if one_program:
    make_all = make if inputs is None else (lambda: dict(inputs))
    expected, results = _one_program(spec, names, make_all, bound, dtype,
                                     cotangent_seed, compiler_options)
    if context_parallel and inputs is None:
      inputs = make()
  else:
    inputs = make() if inputs is None else inputs
    expected = errors_lib.run_reference(
        reference, inputs, grad_args=spec.grad_args, dtype=dtype,
        cotangent_seed=cotangent_seed)
    results = {}
  compare = functools.partial(
      errors_lib.errors_against_reference, reference=reference,
      grad_args=spec.grad_args, dtype=dtype, cotangent_seed=cotangent_seed,
      reference_result=expected)
  if not one_program:
    for name in names:
      results[name] = compare(bound(name), inputs=inputs)
  for parts in context_parallel:
    mesh = sequence_mesh(parts)
    for name in split:
      with jax.set_mesh(mesh):
        results[f"{name}@sequence={parts}"] = compare(bound(name),
                                                      inputs=inputs)

  failures = {name: bad for name, errs in results.items()
              if (bad := errors_lib.over_tolerance(errs, tol, grad_tol))}
  if failures and raise_on_failure:
    lines = [f"{spec.name}/{name}: {bad}" for name, bad in failures.items()]
    raise FormMismatch(
        f"forms of {spec.name!r} differ from the naive form beyond the "
        f"tolerance (outputs and states {tol:g}, gradients {grad_tol:g}, "
        f"relative RMS):\n  " + "\n  ".join(lines), results, failures)
  return results



def check_chunk_variant(spec: OpSpec, chunk, *, dims: Dims, seed: int = 0,
                        chunk_size: int | None = 16
                        ) -> dict[str, dict[str, float]]:
  """``check_forms`` of ``chunk`` (the op's chunk form with other options,
  e.g. ``impl="pallas"``) against ``spec``'s naive form, at the default
  tolerances, on the input maker's gentle inputs of ``dims``."""
  inputs = spec.make_inputs(jax.random.PRNGKey(seed), dims, False)
  variant = OpSpec(f"{spec.name}_variant",
                   {"naive": spec.forms["naive"], "chunk": chunk},
                   spec.make_inputs, spec.grad_args)
  return check_forms(variant, inputs=inputs, chunk_size=chunk_size)

def _one_program(spec, names, make, bound, dtype, cotangent_seed,
                 compiler_options):
  """The naive form's and every form's ``(o, state, grads)`` (as
  ``errors.outputs_and_grads``), inputs made inside, as one program; then
  the errors of each form. Non-array inputs (static positions) are read
  from an abstract run of ``make``."""
  static = {}

  def arrays():
    inputs = make()
    static.update({n: x for n, x in inputs.items()
                   if x is not None and not isinstance(x, jax.Array)})
    return {n: x for n, x in inputs.items() if n not in static}

  abstract = jax.eval_shape(arrays)
  value = abstract[errors_lib.value_name(abstract)]
  reference = functools.partial(spec.forms["naive"], output_final_state=True)

  def run():
    inputs = {**arrays(), **static}
    low = errors_lib.cast_floats(inputs, dtype, ("initial_state",))
    out = {"naive": errors_lib.outputs_and_grads(
        reference, errors_lib.cast_floats(low, jnp.float32), spec.grad_args,
        cotangent_seed)}
    for name in names:
      out[name] = errors_lib.outputs_and_grads(bound(name), low,
                                               spec.grad_args, cotangent_seed)
    return out

  out = jax.jit(run, compiler_options=compiler_options)()
  expected = out.pop("naive")
  value_dtype = (jnp.dtype(dtype) if jnp.issubdtype(value.dtype, jnp.floating)
                 else value.dtype)
  errors = {}
  for name, result in out.items():
    if result[0].dtype != value_dtype:
      raise AssertionError(f"{spec.name}/{name}: output dtype "
                           f"{result[0].dtype} != value dtype {value_dtype}")
    errors[name] = errors_lib.compare_results(result, expected)
  return expected, errors
