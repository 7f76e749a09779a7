"""Helpers to check a fast form against the naive form.

``assert_forms_match`` compares outputs, final states and the gradients of a
random linear functional of both (random cotangents) for every
differentiable input, each with a relative RMS error against the reference.
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


def _cast(inputs, dtype, keep_f32):
  out = {}
  for name, x in inputs.items():
    if (x is not None and name not in keep_f32 and hasattr(x, "dtype")
        and jnp.issubdtype(x.dtype, jnp.floating)):
      x = x.astype(dtype)
    out[name] = x
  return out


def _outputs_and_grads(fn, inputs, grad_args, cotangent_seed):
  """Outputs, final state and the vjp of random cotangents, in one jit."""
  arrays = {n: x for n, x in inputs.items() if isinstance(x, jax.Array)}
  static = {n: x for n, x in inputs.items() if n not in arrays}
  diff_names = [n for n in grad_args if arrays.get(n) is not None]

  # Cotangents from NumPy, outside the jit: jax.random inside it adds the
  # threefry graph to every compilation (several CPU seconds per check).
  o_shape, s_shape = jax.eval_shape(lambda a: fn(**static, **a), arrays)
  rng = np.random.default_rng(cotangent_seed)
  co = jnp.asarray(rng.standard_normal(o_shape.shape, np.float32),
                   o_shape.dtype)
  cs = (None if s_shape is None else
        jnp.asarray(rng.standard_normal(s_shape.shape, np.float32),
                    s_shape.dtype))

  @jax.jit
  def run(arrays, co, cs):
    def forward(diff):
      return fn(**static, **{**arrays, **diff})

    (o, state), vjp = jax.vjp(forward, {n: arrays[n] for n in diff_names})
    (grads,) = vjp((co, cs))
    return o, state, grads

  return run(arrays, co, cs)


def run_reference(reference: Callable, inputs: Mapping[str, object], *,
                  grad_args: Sequence[str], dtype=jnp.float32,
                  keep_f32: Sequence[str] = ("initial_state",),
                  cotangent_seed: int = 0):
  """The reference's ``(o, state, grads)`` on the inputs as rounded to
  ``dtype`` (then computed in float32)."""
  low = _cast(dict(inputs), dtype, keep_f32)
  return _outputs_and_grads(reference, _cast(low, jnp.float32, ()), grad_args,
                            cotangent_seed)


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
  the form's arithmetic, not the rounding of its inputs.

  ``reference_result`` (from ``run_reference`` with the same arguments)
  saves recomputing the reference when several forms are checked.

  Returns:
    ``{"o": err, "state": err, "d<name>": err, ...}``.
  """
  low = _cast(dict(inputs), dtype, keep_f32)
  o, s, grads = _outputs_and_grads(form, low, grad_args, cotangent_seed)
  if reference_result is None:
    reference_result = run_reference(reference, inputs, grad_args=grad_args,
                                     dtype=dtype, keep_f32=keep_f32,
                                     cotangent_seed=cotangent_seed)
  ro, rs, rgrads = reference_result
  if o.dtype != low[_value_name(inputs)].dtype:
    raise AssertionError(f"output dtype {o.dtype} != value dtype "
                         f"{low[_value_name(inputs)].dtype}")
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


def _value_name(inputs):
  for name in ("v", "x", "u"):
    if name in inputs:
      return name
  return next(iter(inputs))


def assert_close_errors(errors: Mapping[str, float], tol: float,
                        grad_tol: float | None = None, label: str = ""):
  grad_tol = tol if grad_tol is None else grad_tol
  bad = {name: err for name, err in errors.items()
         if not err <= (grad_tol if name.startswith("d") else tol)}
  if bad:
    raise AssertionError(f"{label}: errors over tolerance "
                         f"(out {tol:g}, grad {grad_tol:g}): {bad}; all: {errors}")
