"""Relative errors of a form against a reference: outputs, final states and
gradients.

``errors_against_reference`` compares outputs, final states and the
gradients of a random linear functional of both (random cotangents) for
every differentiable input, each with a relative RMS error against the
reference. Both are evaluated by ``outputs_and_grads``: one ``jax.jit``
whose body is a ``lax.scan`` whose body takes ``jax.grad``, with every array
input an argument, so that each form runs on tracers as it does inside a
training step.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def rel_rms(actual, expected, floor: float = 1e-12) -> float:
  """``rms(actual - expected) / max(rms(expected), floor)`` in float64."""
  a = np.asarray(jnp.asarray(actual, jnp.float32), np.float64)
  e = np.asarray(jnp.asarray(expected, jnp.float32), np.float64)
  if a.shape != e.shape:
    raise AssertionError(f"shape {a.shape} != reference shape {e.shape}")
  err = np.sqrt(np.mean((a - e) ** 2)) if a.size else 0.0
  ref = np.sqrt(np.mean(e ** 2)) if e.size else 0.0
  return float(err / max(ref, floor))


def cast_floats(inputs: Mapping[str, object], dtype,
                keep_f32: Sequence[str] = ()) -> dict[str, object]:
  """``inputs`` with every floating array not in ``keep_f32`` in ``dtype``."""
  out = {}
  for name, x in inputs.items():
    if (x is not None and name not in keep_f32 and hasattr(x, "dtype")
        and jnp.issubdtype(x.dtype, jnp.floating)):
      x = x.astype(dtype)
    out[name] = x
  return out


def _functional(o, state, co, cs):
  """``<co, o> + <cs, state>`` in float32 (``state`` may be None)."""
  total = jnp.sum(co.astype(jnp.float32) * o.astype(jnp.float32))
  if state is not None:
    total = total + jnp.sum(cs.astype(jnp.float32) * state.astype(jnp.float32))
  return total


def outputs_and_grads(fn: Callable, inputs: Mapping[str, object],
                      grad_args: Sequence[str], cotangent_seed: int = 0):
  """``fn``'s output, final state and the gradients of a random linear
  functional of both with respect to ``grad_args``.

  ``fn(**inputs)`` returns ``(o, final_state or None)``. It runs under
  ``jax.jit``, inside the body of a one-step ``lax.scan``, under
  ``jax.grad``; every array of ``inputs`` is an argument (a tracer), the
  other entries are passed as they are. Called inside a ``jax.jit``, the
  whole is part of that program.

  Returns:
    ``(o, final_state or None, {name: gradient})``.
  """
  arrays = {n: x for n, x in inputs.items() if isinstance(x, jax.Array)}
  static = {n: x for n, x in inputs.items() if n not in arrays}
  diff_names = [n for n in grad_args if arrays.get(n) is not None]

  # Cotangents from NumPy, outside the jit: jax.random inside it adds the
  # threefry graph to every compilation.
  o_shape, s_shape = jax.eval_shape(lambda a: fn(**static, **a), arrays)
  rng = np.random.default_rng(cotangent_seed)
  co = jnp.asarray(rng.standard_normal(o_shape.shape, np.float32),
                   o_shape.dtype)
  cs = (None if s_shape is None else
        jnp.asarray(rng.standard_normal(s_shape.shape, np.float32),
                    s_shape.dtype))

  def loss(diff, arrays, co, cs):
    o, state = fn(**static, **{**arrays, **diff})
    return _functional(o, state, co, cs), (o, state)

  def body(carry, _):
    arrays, co, cs = carry
    diff = {n: arrays[n] for n in diff_names}
    grads, (o, state) = jax.grad(loss, has_aux=True)(diff, arrays, co, cs)
    return carry, (o, state, grads)

  @jax.jit
  def run(arrays, co, cs):
    _, out = jax.lax.scan(body, (arrays, co, cs), None, length=1)
    return jax.tree.map(lambda x: x[0], out)

  return run(arrays, co, cs)


def run_reference(reference: Callable, inputs: Mapping[str, object], *,
                  grad_args: Sequence[str], dtype=jnp.float32,
                  keep_f32: Sequence[str] = ("initial_state",),
                  cotangent_seed: int = 0):
  """The reference's ``(o, state, grads)`` on the inputs as rounded to
  ``dtype`` (then computed in float32)."""
  low = cast_floats(dict(inputs), dtype, keep_f32)
  return outputs_and_grads(reference, cast_floats(low, jnp.float32),
                           grad_args, cotangent_seed)


def compare_results(result, reference_result) -> dict[str, float]:
  """Relative RMS errors of one ``outputs_and_grads`` result against
  another: ``{"o": err, "state": err, "d<name>": err, ...}`` (``inf`` for a
  gradient that is not finite). Raises ``AssertionError`` where only one
  has a final state or the final state is not float32."""
  (o, s, grads), (ro, rs, rgrads) = result, reference_result
  errors = {"o": rel_rms(o, ro)}
  if rs is not None or s is not None:
    if s is None or rs is None:
      raise AssertionError("one form returned a final state, the other not")
    if s.dtype != jnp.float32:
      raise AssertionError(f"final state dtype {s.dtype} != float32")
    errors["state"] = rel_rms(s, rs)
  for name in rgrads:
    if not np.all(np.isfinite(np.asarray(grads[name], np.float32))):
      errors["d" + name] = float("inf")
    else:
      errors["d" + name] = rel_rms(grads[name], rgrads[name])
  return errors


def errors_against_reference(form: Callable, reference: Callable,
                             inputs: Mapping[str, object], *,
                             grad_args: Sequence[str],
                             dtype=jnp.float32,
                             keep_f32: Sequence[str] = ("initial_state",),
                             cotangent_seed: int = 0,
                             reference_result=None) -> dict[str, float]:
  """Relative RMS errors of ``form`` against ``reference``.

  Both are called as ``fn(**inputs)`` and return ``(o, final_state)``. The
  form gets the floating inputs cast to ``dtype`` (except ``keep_f32``); the
  reference gets the same values in float32, so a low-precision run measures
  the form's arithmetic, not the rounding of its inputs. The form's output
  must have the dtype of the value input (``v``, ``x`` or ``u``).

  ``reference_result`` (from ``run_reference`` with the same arguments)
  saves recomputing the reference when several forms are checked.

  Returns:
    ``{"o": err, "state": err, "d<name>": err, ...}``.
  """
  low = cast_floats(dict(inputs), dtype, keep_f32)
  result = outputs_and_grads(form, low, grad_args, cotangent_seed)
  if reference_result is None:
    reference_result = run_reference(reference, inputs, grad_args=grad_args,
                                     dtype=dtype, keep_f32=keep_f32,
                                     cotangent_seed=cotangent_seed)
  value = low[value_name(inputs)]
  if result[0].dtype != value.dtype:
    raise AssertionError(f"output dtype {result[0].dtype} != value dtype "
                         f"{value.dtype}")
  return compare_results(result, reference_result)



def errors_against_fixture(form: Callable, data: Mapping[str, object],
                           args: Sequence[str]) -> dict[str, float]:
  """Relative RMS errors of ``form`` against a reference's committed
  outputs and gradients (``experiments/make_op_fixtures.py``).

  ``data`` holds the inputs ``args`` and ``h0`` (used as the initial state
  where ``data["initial"]``), the cotangents ``do`` and ``dht``, the
  reference's ``o``, ``ht`` and, for the inputs it differentiates,
  ``d<name>``. ``form(*args, initial_state=, output_final_state=True)``
  returns ``(o, final_state)``.

  Returns:
    ``{"o": err, "state": err, "d<name>": err, ...}``, a gradient for each
    ``d<name>`` in ``data``.
  """
  initial = bool(data["initial"])
  names = tuple(args) + ("h0",)

  def run(*arrays):
    *inputs, h0 = arrays
    return form(*inputs, initial_state=h0 if initial else None,
                output_final_state=True)

  (o, ht), vjp = jax.vjp(run, *(data[n] for n in names))
  grads = vjp((jnp.asarray(data["do"]), jnp.asarray(data["dht"])))
  errors = {"o": rel_rms(o, data["o"]), "state": rel_rms(ht, data["ht"])}
  for name, grad in zip(names, grads):
    if f"d{name}" in data:
      errors[f"d{name}"] = rel_rms(grad, data[f"d{name}"])
  return errors

def value_name(inputs: Mapping[str, object]) -> str:
  """The input whose dtype the output takes: ``v``, ``x``, ``u`` or the
  first."""
  for name in ("v", "x", "u"):
    if name in inputs:
      return name
  return next(iter(inputs))


def over_tolerance(errors: Mapping[str, float], tol: float,
                   grad_tol: float | None = None) -> dict[str, float]:
  """The entries of ``errors`` over their tolerance (``grad_tol`` for the
  gradients ``d<name>``, ``tol`` for the rest; NaN is over)."""
  grad_tol = tol if grad_tol is None else grad_tol
  return {name: err for name, err in errors.items()
          if not err <= (grad_tol if name.startswith("d") else tol)}


def assert_close_errors(errors: Mapping[str, float], tol: float,
                        grad_tol: float | None = None, label: str = ""):
  """Raises ``AssertionError`` naming every error over its tolerance."""
  grad_tol = tol if grad_tol is None else grad_tol
  bad = over_tolerance(errors, tol, grad_tol)
  if bad:
    raise AssertionError(f"{label}: errors over tolerance "
                         f"(out {tol:g}, grad {grad_tol:g}): {bad}; all: {errors}")
