"""What the forms verifier and the forms benchmark need to know about an op."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Dims:
  """Problem size. Each op reads the fields it has a use for."""
  batch: int = 2        # B
  length: int = 200     # T
  heads: int = 2        # H (heads, or groups for Mamba-style ops)
  dim_k: int = 32       # K (key / state size N)
  dim_v: int = 48       # V (value / head size P / model width D)


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """An op with all its forms, and how to make inputs for it.

  Every form is called as ``form(**inputs)`` and returns ``(o, state)``;
  the ``"naive"`` form is the reference the others are checked against.
  """
  name: str                                   # op name, e.g. "gla"
  forms: Mapping[str, Callable]               # form name -> callable
  make_inputs: Callable[..., dict]            # (key, Dims, strong: bool) -> kwargs
  grad_args: tuple[str, ...]                  # inputs the gradients are checked for
  chunked: tuple[str, ...] = ("chunk",)       # forms that take chunk_size
  tol: float = 1e-5                           # float32 relative RMS, outputs
  grad_tol: float = 1e-5                      # float32 relative RMS, gradients
  low_precision_tol: float = 1e-2             # bfloat16 inputs, all quantities
  # The op's decoding step where no form in ``forms`` scans it on its own
  # (for the tests that call every step; not verified separately).
  step: StepForm | None = None


@dataclasses.dataclass(frozen=True)
class StepForm:
  """An op's decoding step run over a whole sequence: a sequence form.

  ``step(**token_inputs, **other_inputs, state=..., reset=..., **static)``
  returns ``(o_t, state)``; it gets one token (``x[:, t]``) of each of
  ``token_args`` and the other inputs whole. Floating inputs other than the
  tokens (parameters read at every step) are cast to float32 once, before
  the scan, so that their gradients sum over time in float32 (as in the
  recurrent forms). The harness of the tests calls ``step`` directly too.
  """
  step: Callable
  token_args: tuple[str, ...]
  static: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # inputs -> the state before the first token when initial_state is None
  # (default: the step's own state for state=None, zeroed).
  init_state: Callable[..., Any] | None = None
  # False: the state is internal (a KV cache) and no final state is returned.
  final_state: bool = True

  def __call__(self, *, initial_state=None, segment_ids=None,
               output_final_state=False, **inputs):
    import jax.numpy as jnp

    tokens = {n: inputs.pop(n) for n in self.token_args}
    params = {n: (jnp.asarray(x, jnp.float32)
                  if x is not None and jnp.issubdtype(jnp.result_type(x),
                                                      jnp.floating) else x)
              for n, x in inputs.items()}
    if initial_state is None and self.init_state is not None:
      initial_state = self.init_state(**tokens, **params)
    o, state = scan_steps(
        self.step, tokens, initial_state=initial_state,
        segment_ids=segment_ids,
        output_final_state=output_final_state and self.final_state,
        **params, **self.static)
    return o, state


def scan_steps(step, sequence_inputs, *, initial_state=None, segment_ids=None,
               output_final_state=False, **static):
  """Runs a decoding step over a whole sequence, as a sequence form.

  Args:
    step: ``step(**token_inputs, state=..., reset=..., **static) -> (o_t,
      state)``.
    sequence_inputs: name -> ``[B, T, ...]`` array (or None, passed as is).
  Returns:
    ``(o [B, T, ...], final_state or None)``.
  """
  import jax
  import jax.numpy as jnp

  from lin_attn_jax.ops.common.segments import reset_flags

  names = list(sequence_inputs)
  first = next(x for x in sequence_inputs.values() if x is not None)
  batch, length = first.shape[:2]
  reset = reset_flags(segment_ids, batch, length)

  def body(state, xs):
    token, reset_t = xs
    o_t, state = step(**token, state=state, reset=reset_t, **static)
    return state, o_t

  token_major = {n: (None if x is None else jnp.moveaxis(x, 1, 0))
                 for n, x in sequence_inputs.items() if n in names}
  if initial_state is None:
    # Let the step build its zero state from the first token.
    tok0 = {n: (None if x is None else x[0]) for n, x in token_major.items()}
    _, initial_state = step(**tok0, state=None, reset=None, **static)
    initial_state = jax.tree.map(jnp.zeros_like, initial_state)
  state, o = jax.lax.scan(body, initial_state, (token_major, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)
