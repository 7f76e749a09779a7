"""The table of ops: every op, its forms, and how to make inputs for it.

An ``OpSpec`` names an op's forms (``"naive"``, the reference, and any of
``"parallel"``, ``"chunk"``, ``"recurrent"``, ``"step"``, ...), each called
as ``form(**inputs)`` and returning ``(o, final_state)``; a maker of random
inputs (``spec_inputs.py``); the inputs the gradients are checked for; and
the tolerances the forms are held to. The tests, the form verifier, the
forms benchmark and ``lin_attn_jax.testing.check_forms`` read this table.

    from lin_attn_jax.ops import registry
    spec = registry.get_spec("gla")
    o, state = spec.forms["chunk"](**spec.make_inputs(key, registry.Dims(),
                                                      False))

A new op is added to ``SPECS`` here, or registered at run time with
``register(spec)`` (see docs/new_variant.md).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from lin_attn_jax import ops
from lin_attn_jax.ops import spec_inputs
from lin_attn_jax.ops.common.segments import reset_flags
from lin_attn_jax.ops.log_linear_attn.inputs import positions


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
  # Forms that split the sequence over a mesh axis named "sequence" when
  # one of size > 1 is current (ops/common/context_parallel.py).
  context_parallel: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepForm:
  """An op's decoding step run over a whole sequence: a sequence form.

  ``step(**token_inputs, **other_inputs, state=..., reset=..., **static)``
  returns ``(o_t, state)``; it gets one token (``x[:, t]``) of each of
  ``token_args`` and the other inputs whole. Floating inputs other than the
  tokens (parameters read at every step) are cast to float32 once, before
  the scan, so that their gradients sum over time in float32 (as in the
  recurrent forms). ``lin_attn_jax.testing`` calls ``step`` directly too.
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
  first = next(x for x in sequence_inputs.values() if x is not None)
  batch, length = first.shape[:2]
  reset = reset_flags(segment_ids, batch, length)

  def body(state, xs):
    token, reset_t = xs
    o_t, state = step(**token, state=state, reset=reset_t, **static)
    return state, o_t

  token_major = {n: (None if x is None else jnp.moveaxis(x, 1, 0))
                 for n, x in sequence_inputs.items()}
  if initial_state is None:
    # Let the step build its zero state from the first token.
    tok0 = {n: (None if x is None else x[0]) for n, x in token_major.items()}
    _, initial_state = step(**tok0, state=None, reset=None, **static)
    initial_state = jax.tree.map(jnp.zeros_like, initial_state)
  state, o = jax.lax.scan(body, initial_state, (token_major, reset.T))
  return jnp.moveaxis(o, 0, 1), (state if output_final_state else None)


@dataclasses.dataclass(frozen=True)
class PositionedStepForm(StepForm):
  """A ``StepForm`` whose step takes ``offset``, the position of its token
  in its document (log-linear attention): the sequence's ``offset`` (the
  first token's) and ``segment_ids`` give each token its own."""

  def __call__(self, *, offset=0, segment_ids=None, **inputs):
    first = inputs[self.token_args[0]]
    tokens = positions(segment_ids, offset, *first.shape[:2])    # [B, T]
    form = dataclasses.replace(self, token_args=self.token_args + ("offset",))
    return StepForm.__call__(form, segment_ids=segment_ids, offset=tokens,
                             **inputs)


SEQUENCE_FORMS = ("naive_recurrent", "parallel", "chunk", "recurrent")


def sequence_forms(op: str, names=SEQUENCE_FORMS, step_tokens=None,
                   **static) -> dict[str, Callable]:
  """``ops.<name>_<op>`` for each of ``names`` (``naive_recurrent`` keyed
  ``"naive"``), with ``static`` bound; with ``step_tokens``, also
  ``ops.<op>_step`` scanned over the sequence (key ``"step"``), taking one
  token of each of ``step_tokens``."""
  forms = {}
  for name in names:
    fn = getattr(ops, f"{name}_{op}")
    forms["naive" if name == "naive_recurrent" else name] = (
        functools.partial(fn, **static) if static else fn)
  if step_tokens is not None:
    forms["step"] = step_form(op, step_tokens, **static)
  return forms


def step_form(op: str, tokens: tuple[str, ...], **static) -> StepForm:
  """``ops.<op>_step`` as a sequence form, taking one token of ``tokens``."""
  return StepForm(getattr(ops, f"{op}_step"), tuple(tokens), static)


def _gated_linear_specs():
  qkv, qkvg = ("q", "k", "v"), ("q", "k", "v", "g")
  return [
      OpSpec("linear_attn", sequence_forms("linear_attn", step_tokens=qkv),
             spec_inputs.linear_attn, qkv + ("initial_state",),
             context_parallel=("chunk",)),
      OpSpec("linear_attn_normalized",
             sequence_forms("linear_attn", step_tokens=qkv, normalize=True),
             functools.partial(spec_inputs.linear_attn, normalize=True),
             qkv + ("initial_state",), context_parallel=("chunk",)),
      OpSpec("simple_gla", sequence_forms("simple_gla", step_tokens=qkvg),
             spec_inputs.simple_gla, qkvg + ("initial_state",),
             context_parallel=("chunk",)),
      OpSpec("retention", sequence_forms("retention", step_tokens=qkv),
             spec_inputs.retention, qkv + ("initial_state",),
             context_parallel=("chunk",)),
      OpSpec("gla", sequence_forms("gla", step_tokens=qkvg), spec_inputs.gla,
             qkvg + ("initial_state",), context_parallel=("chunk",)),
      OpSpec("based", sequence_forms("based", step_tokens=qkv),
             spec_inputs.based, qkv + ("initial_state",),
             context_parallel=("chunk",)),
      # With strong gates a denominator |q . n| can be small (one key
      # dominates n, the floor exp(-m) is tiny): the naive form's own
      # float32 gradients of q and k are then off by up to 4e-4 against
      # float64 (T = 200), the chunk form's by 2e-6.
      OpSpec("mlstm", sequence_forms("mlstm", step_tokens=qkv + ("i", "f")),
             spec_inputs.mlstm, qkv + ("i", "f", "initial_state"),
             grad_tol=1e-3, context_parallel=("chunk",)),
      OpSpec("mamba3",
             sequence_forms("mamba3",
                            step_tokens=("q", "k", "v", "g", "dt", "trap",
                                         "angles")),
             spec_inputs.mamba3,
             ("q", "k", "v", "g", "dt", "trap", "angles", "initial_state"),
             context_parallel=("chunk",)),
      OpSpec("mamba3_mimo",
             sequence_forms("mamba3_mimo",
                            step_tokens=("q", "k", "v", "g", "dt", "trap",
                                         "angles")),
             spec_inputs.mamba3_mimo,
             ("q", "k", "v", "g", "dt", "trap", "angles", "initial_state"),
             context_parallel=("chunk",)),
      OpSpec("log_linear_attn",
             {**sequence_forms("log_linear_attn"),
              "step": PositionedStepForm(ops.log_linear_attn_step,
                                         qkvg + ("level_scales",))},
             spec_inputs.log_linear_attn,
             qkvg + ("level_scales", "initial_state"),
             context_parallel=("chunk",)),
      # Two gated-linear states (keys beta k, values [k | v]) and a CG
      # solve per token; every form differentiates the solve implicitly.
      OpSpec("mesa_net",
             sequence_forms("mesa_net", step_tokens=qkv + ("g", "beta"),
                            use_qk_l2norm=True),
             spec_inputs.mesa_net,
             qkv + ("g", "beta", "lamb", "initial_state"),
             context_parallel=("chunk",)),
  ]


def _delta_rule_specs():
  grads = ("q", "k", "v", "beta", "initial_state")
  l2 = dict(use_qk_l2norm=True)
  return [
      OpSpec("delta_rule",
             sequence_forms("delta_rule", step_tokens=("q", "k", "v", "beta"),
                            **l2),
             spec_inputs.delta_rule, grads, context_parallel=("chunk",)),
      OpSpec("gated_delta_rule",
             sequence_forms("gated_delta_rule",
                            step_tokens=("q", "k", "v", "g", "beta"), **l2),
             functools.partial(spec_inputs.delta_rule, gate="scalar"),
             grads + ("g",), context_parallel=("chunk",)),
      OpSpec("kda",
             sequence_forms("kda", step_tokens=("q", "k", "v", "g", "beta"),
                            **l2),
             functools.partial(spec_inputs.delta_rule, gate="channel"),
             grads + ("g",), context_parallel=("chunk",)),
      OpSpec("gated_delta_product",
             sequence_forms("gated_delta_product",
                            step_tokens=("q", "k", "v", "g", "beta"), **l2),
             spec_inputs.gated_delta_product, grads + ("g",),
             context_parallel=("chunk",)),
      OpSpec("rwkv6", sequence_forms("rwkv6", step_tokens=("r", "k", "v", "w")),
             spec_inputs.rwkv6, ("r", "k", "v", "w", "u", "initial_state"),
             context_parallel=("chunk",)),
      OpSpec("rwkv7",
             sequence_forms("rwkv7",
                            step_tokens=("r", "w", "k", "v", "a", "b")),
             spec_inputs.rwkv7, ("r", "w", "k", "v", "a", "b", "initial_state"),
             tol=1e-4, grad_tol=1e-4, context_parallel=("chunk",)),
      OpSpec("gdn2",
             sequence_forms("gdn2",
                            step_tokens=("q", "k", "v", "g", "b", "w"), **l2),
             spec_inputs.gdn2, ("q", "k", "v", "g", "b", "w", "initial_state"),
             context_parallel=("chunk",)),
      OpSpec("comba",
             sequence_forms("comba",
                            step_tokens=("q", "k", "v", "p", "g", "beta"),
                            **l2),
             spec_inputs.comba, grads + ("p", "g"),
             context_parallel=("chunk",)),
  ]


def _diagonal_ssm_specs():
  """Every recurrent form here is already the ``lax.scan`` of the op's
  step, so the step is verified through it (``OpSpec.step`` names it for
  the checks that call every step)."""
  return [
      OpSpec("linear_scan", sequence_forms("linear_scan"),
             spec_inputs.linear_scan, ("a", "b", "initial_state"),
             step=step_form("linear_scan", ("a", "b")),
             context_parallel=("chunk",)),
      OpSpec("selective_scan",
             sequence_forms("selective_scan", delta_softplus=True),
             spec_inputs.selective_scan,
             ("u", "delta", "A", "B", "C", "D", "z", "delta_bias",
              "initial_state"),
             step=step_form("selective_scan", ("u", "delta", "B", "C", "z"),
                            delta_softplus=True),
             context_parallel=("chunk",)),
      OpSpec("ssd", sequence_forms("ssd", dt_softplus=True), spec_inputs.ssd,
             ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_state"),
             step=step_form("ssd", ("x", "dt", "B", "C"), dt_softplus=True),
             context_parallel=("chunk",)),
      OpSpec("causal_conv1d", sequence_forms("causal_conv1d", activation="silu"),
             spec_inputs.causal_conv1d, ("x", "weight", "bias", "initial_state"),
             step=step_form("causal_conv1d", ("x",), activation="silu"),
             context_parallel=("chunk",)),
      OpSpec("shift_ssm", sequence_forms("shift_ssm"), spec_inputs.shift_ssm,
             ("u", "C", "D", "initial_state"),
             step=step_form("shift_ssm", ("u",))),
      OpSpec("s4d", sequence_forms("s4d"), spec_inputs.s4d,
             ("u", "log_dt", "A_real", "A_imag", "B", "C", "D",
              "initial_state"),
             step=step_form("s4d", ("u",))),
      OpSpec("rg_lru", sequence_forms("rg_lru"), spec_inputs.rg_lru,
             ("x", "a_gate", "x_gate", "a_param", "initial_state"),
             step=step_form("rg_lru", ("x", "a_gate", "x_gate")),
             context_parallel=("chunk",)),
      OpSpec("hgrn", sequence_forms("hgrn"), spec_inputs.hgrn,
             ("x", "g", "initial_state"), step=step_form("hgrn", ("x", "g")),
             context_parallel=("chunk",)),
  ]


# Softmax attention: the window of the sliding-window forms, and the Sparse
# Transformer's stride and summary size.
WINDOW = 16
STRIDE = 4
SUMMARY = 2


def o_only(fn, block_arg=None, **static):
  """``fn`` returning ``o`` as a form returning ``(o, None)``; a
  ``chunk_size`` goes to ``block_arg``. ``static`` are defaults: a keyword
  of the call replaces one of the same name (as ``functools.partial``)."""
  def form(*, initial_state=None, output_final_state=False, chunk_size=None,
           **inputs):
    del output_final_state
    if initial_state is not None:
      raise ValueError("softmax attention has no initial state")
    if chunk_size is not None:
      inputs[block_arg] = chunk_size
    return fn(**{**static, **inputs}), None
  return form


def _empty_cache(window_size, q, k, v, **unused):
  """A cache for the whole of ``k`` [B, T, Hkv, K] (read from its ends, so
  that a k of the wrong rank reaches the op, which names it)."""
  del q, unused
  return ops.init_kv_cache(k.shape[0], k.shape[-2], k.shape[-1], v.shape[-1],
                           max_length=max(k.shape[:-2], default=1),
                           window_size=window_size, dtype=k.dtype)


def _cached_step(q, k, v, state, reset, scale=None):
  return ops.softmax_attn_step(q, k, v, state, scale=scale, reset=reset)


def _prefill(q, k, v, *, segment_ids=None, window_size=None, scale=None):
  cache = _empty_cache(window_size, q, k, v)
  return ops.softmax_attn_extend(q, k, v, cache, scale=scale,
                                 segment_ids=segment_ids)[0]


def _attention_forms(window_size=None):
  window = dict(window_size=window_size)
  return {
      "naive": o_only(ops.parallel_softmax_attn, **window),
      "chunk": o_only(ops.chunk_softmax_attn, "block_size", **window),
      "step": StepForm(_cached_step, ("q", "k", "v"),
                       init_state=functools.partial(_empty_cache, window_size),
                       final_state=False),
      "prefill": o_only(_prefill, **window),
  }


def _stickbreaking_step(q, k, v, state, reset, scale=None):
  return ops.stickbreaking_attn_step(q, k, v, state, scale=scale, reset=reset)


def _stickbreaking_prefill(q, k, v, *, segment_ids=None, scale=None):
  return ops.stickbreaking_attn_extend(q, k, v, _empty_cache(None, q, k, v),
                                       scale=scale,
                                       segment_ids=segment_ids)[0]


def _stickbreaking_forms():
  return {
      "naive": o_only(ops.parallel_stickbreaking_attn),
      "chunk": o_only(ops.chunk_stickbreaking_attn, "block_size"),
      "step": StepForm(_stickbreaking_step, ("q", "k", "v"),
                       init_state=functools.partial(_empty_cache, None),
                       final_state=False),
      "prefill": o_only(_stickbreaking_prefill),
  }


def _empty_forgetting_cache(window_size, q, k, v, **unused):
  """``_empty_cache`` with the gate decays of q's heads."""
  del unused
  return ops.init_forgetting_cache(
      k.shape[0], q.shape[-2], k.shape[-2], k.shape[-1], v.shape[-1],
      max_length=max(k.shape[:-2], default=1), window_size=window_size,
      dtype=k.dtype)


def _forgetting_step(q, k, v, g, state, reset, scale=None):
  return ops.forgetting_attn_step(q, k, v, g, state, scale=scale, reset=reset)


def _forgetting_prefill(q, k, v, g, *, segment_ids=None, window_size=None,
                        scale=None):
  cache = _empty_forgetting_cache(window_size, q, k, v)
  return ops.forgetting_attn_extend(q, k, v, g, cache, scale=scale,
                                    segment_ids=segment_ids)[0]


def _forgetting_forms(window_size=None):
  window = dict(window_size=window_size)
  return {
      "naive": o_only(ops.parallel_forgetting_attn, **window),
      "chunk": o_only(ops.chunk_forgetting_attn, "block_size", **window),
      "step": StepForm(_forgetting_step, ("q", "k", "v", "g"),
                       init_state=functools.partial(_empty_forgetting_cache,
                                                    window_size),
                       final_state=False),
      "prefill": o_only(_forgetting_prefill, **window),
  }


# Native sparse attention: blocks of 4 tokens, 5 selected (the 3 forced
# ones and 2 ranked), a window of 8.
NSA = dict(block_size=4, block_counts=5, window_size=8)
NSA_GATES = ("g_cmp", "g_slc", "g_swa")


def _empty_nsa_cache(q, k, v, **unused):
  """An NSA cache for the whole of ``k`` (read from its ends, as
  ``_empty_cache``)."""
  del q, unused
  return ops.init_nsa_cache(k.shape[0], k.shape[-2], k.shape[-1],
                            v.shape[-1],
                            max_length=max(k.shape[:-2], default=1),
                            block_size=NSA["block_size"],
                            window_size=NSA["window_size"], dtype=k.dtype)


def _nsa_cached_step(q, k, v, g_cmp, g_slc, g_swa, state, reset, scale=None):
  return ops.nsa_step(q, k, v, g_cmp, g_slc, g_swa, state,
                      block_counts=NSA["block_counts"], scale=scale,
                      reset=reset)


def _nsa_prefill(q, k, v, g_cmp, g_slc, g_swa, *, segment_ids=None,
                 scale=None):
  return ops.nsa_extend(q, k, v, g_cmp, g_slc, g_swa,
                        _empty_nsa_cache(q, k, v), scale=scale,
                        block_counts=NSA["block_counts"],
                        segment_ids=segment_ids)[0]


def _nsa_forms():
  return {
      "naive": o_only(ops.parallel_nsa, **NSA),
      "chunk": o_only(ops.chunk_nsa, "chunk_size", **NSA),
      "step": StepForm(_nsa_cached_step, ("q", "k", "v") + NSA_GATES,
                       init_state=_empty_nsa_cache, final_state=False),
      "prefill": o_only(_nsa_prefill),
  }


def _empty_path_cache(q, k, v, g=None, **unused):
  """A PaTH cache for the whole of ``k`` [B, T, Hkv, K] (with a gate for
  ``g`` [B, T, H]); read from the ends of the arrays, as ``_empty_cache``."""
  del unused
  return ops.init_path_cache(
      k.shape[0], k.shape[-2], k.shape[-1], v.shape[-1],
      max_length=max(k.shape[:-2], default=1),
      gate_heads=None if g is None else q.shape[-2], dtype=k.dtype)


def _path_step(q, k, v, w, beta, g, state, reset, scale=None):
  return ops.path_attn_step(q, k, v, w, beta, state, g=g, scale=scale,
                            reset=reset)


def _path_prefill(q, k, v, w, beta, g=None, *, segment_ids=None, scale=None):
  cache = _empty_path_cache(q, k, v, g)
  return ops.path_attn_extend(q, k, v, w, beta, cache, g=g, scale=scale,
                              segment_ids=segment_ids)[0]


def _path_forms():
  return {
      "naive": o_only(ops.parallel_path_attn),
      "chunk": o_only(ops.chunk_path_attn, "chunk_size"),
      "step": StepForm(_path_step, ("q", "k", "v", "w", "beta", "g"),
                       init_state=_empty_path_cache, final_state=False),
      "prefill": o_only(_path_prefill),
  }


def _sparse_forms(pattern):
  static = dict(stride=STRIDE, pattern=pattern, summary_size=SUMMARY)
  return {
      "naive": o_only(ops.sparse_attn_reference, **static),
      "parallel": o_only(ops.parallel_sparse_attn, "block_size", **static),
  }


# MoBA: keys per block and blocks per query (its own included).
MOBA_BLOCK = 4
MOBA_TOP_K = 3


def _empty_moba_cache(q, k, v, **unused):
  """A MoBA cache for the whole of ``k`` [B, T, Hkv, K] (read from its
  ends, as ``_empty_cache``)."""
  del q, unused
  return ops.init_moba_cache(k.shape[0], k.shape[-2], k.shape[-1],
                             v.shape[-1],
                             max_length=max(k.shape[:-2], default=1),
                             block_size=MOBA_BLOCK, dtype=k.dtype)


def _moba_cached_step(q, k, v, state, reset, scale=None):
  return ops.moba_step(q, k, v, state, top_k=MOBA_TOP_K, scale=scale,
                       reset=reset)


def _moba_prefill(q, k, v, *, segment_ids=None, scale=None):
  return ops.moba_extend(q, k, v, _empty_moba_cache(q, k, v),
                         top_k=MOBA_TOP_K, scale=scale,
                         segment_ids=segment_ids)[0]


def _moba_forms():
  moba = dict(block_size=MOBA_BLOCK, top_k=MOBA_TOP_K)
  return {
      "naive": o_only(ops.parallel_moba, **moba),
      "chunk": o_only(ops.chunk_moba, "chunk_size", **moba),
      "step": StepForm(_moba_cached_step, ("q", "k", "v"),
                       init_state=_empty_moba_cache, final_state=False),
      "prefill": o_only(_moba_prefill),
  }


def _softmax_specs():
  """Softmax attention keeps no recurrent state: the forms return ``(o,
  None)`` and the reference is the dense ``[T, T]`` form. The decoding
  forms run ``softmax_attn_step`` over the sequence with a KV cache (a ring
  buffer of ``WINDOW`` entries for the window) or prefill the whole
  sequence into an empty cache; MoBA's the same with its own cache. Keys
  and values have half the query heads when ``Dims.heads`` is even.
  Linformer is not causal and has no form but its definition.
  Stick-breaking attention has the same forms (its dense definition as the
  reference), with the remaining stick left out (its tests check it); its
  strong inputs saturate the logits. The Forgetting Transformer's forms
  have the same shape, with its log forget gate ``g`` and its cache of gate
  decays. Native sparse attention's reference is its dense form; its
  decoding forms keep an ``NSACache``. PaTH attention decodes with its own
  cache (keys moved across every later reflection) and prefills into it."""
  qkv = ("q", "k", "v")
  attention = spec_inputs.attention
  return [
      OpSpec("softmax_attn", _attention_forms(), attention, qkv,
             context_parallel=("chunk",)),
      OpSpec("sliding_window_attn", _attention_forms(WINDOW), attention, qkv,
             context_parallel=("chunk",)),
      OpSpec("longformer_attn",
             {"naive": o_only(ops.parallel_softmax_attn, window_size=WINDOW),
              "chunk": o_only(ops.chunk_softmax_attn, "block_size",
                              window_size=WINDOW)},
             functools.partial(attention, global_tokens=True), qkv),
      OpSpec("sparse_attn_strided", _sparse_forms("strided"), attention, qkv,
             chunked=("parallel",)),
      OpSpec("sparse_attn_fixed", _sparse_forms("fixed"), attention, qkv,
             chunked=("parallel",)),
      OpSpec("moba", _moba_forms(), spec_inputs.moba, qkv,
             context_parallel=("chunk",)),
      OpSpec("linformer_attn", {"naive": o_only(ops.linformer_attn)},
             functools.partial(attention, projections=True),
             qkv + ("e", "f"), chunked=()),
      OpSpec("stickbreaking_attn", _stickbreaking_forms(),
             spec_inputs.stickbreaking_attn, qkv,
             context_parallel=("chunk",)),
      # Gradients to 3e-5: with strong gates the blockwise and prefill
      # biases c_i - c_j round by eps |c| (|c| a few hundred per document),
      # about 2e-5 relative in the weights next to the diagonal that dq and
      # dk are made of (measured up to 9e-6); outputs and the step's
      # gradients stay below 1e-6.
      OpSpec("forgetting_attn", _forgetting_forms(),
             spec_inputs.forgetting_attn, qkv + ("g",), grad_tol=3e-5,
             context_parallel=("chunk",)),
      OpSpec("forgetting_attn_window", _forgetting_forms(WINDOW),
             spec_inputs.forgetting_attn, qkv + ("g",), grad_tol=3e-5,
             context_parallel=("chunk",)),
      OpSpec("nsa", _nsa_forms(), spec_inputs.nsa, qkv + NSA_GATES,
             context_parallel=("chunk",)),
      OpSpec("path_attn", _path_forms(), spec_inputs.path_attn,
             qkv + ("w", "beta", "g"), tol=1e-5, grad_tol=1e-5,
             context_parallel=("chunk",)),
  ]


def noncausal(fn, **static):
  """``fn(..., causal=False)`` as a form returning ``(o, None)`` (a
  non-causal form has no state; ``output_final_state`` is dropped)."""
  def form(*, initial_state=None, output_final_state=False, **inputs):
    del output_final_state
    if initial_state is not None:
      raise ValueError("a non-causal form has no initial state")
    out = fn(**inputs, **static, causal=False)
    return (out[0] if isinstance(out, tuple) else out), None
  return form


def stateless(make):
  """The input maker ``make`` without its initial state."""
  def inputs(key, dims, strong):
    return {**make(key, dims, strong), "initial_state": None}
  return inputs


def _noncausal_forms(op, names=("parallel", "chunk", "recurrent"), **static):
  """``<form>_<op>(..., causal=False)`` for the naive form (the dense
  definition) and each of ``names``."""
  forms = {"naive": noncausal(getattr(ops, f"naive_recurrent_{op}"),
                              **static)}
  for name in names:
    forms[name] = noncausal(getattr(ops, f"{name}_{op}"), **static)
  return forms


def _noncausal_specs():
  """The non-causal forms (``causal=False``): the recurrences' LION forms
  (the causal form forward and on the reversed sequence, the diagonal
  counted once) against their dense ``[T, T]`` definitions (the naive
  forms with ``causal=False``), the softmax family without the causal
  mask against the dense masked form, and the encoder-only ops: EfficientViT's
  ReLU linear attention (its chunk form against its dense definition), Agent
  Attention and Nystromformer (one form each; their tests hold them to the
  papers' equations). No state: the inputs have none."""
  qkv, qkvg = ("q", "k", "v"), ("q", "k", "v", "g")
  attention = spec_inputs.attention
  softmax = {"naive": noncausal(ops.parallel_softmax_attn),
             "chunk": noncausal(_blocks(ops.chunk_softmax_attn))}
  window = {"naive": noncausal(ops.parallel_softmax_attn, window_size=WINDOW),
            "chunk": noncausal(_blocks(ops.chunk_softmax_attn),
                               window_size=WINDOW)}
  sparse = dict(stride=STRIDE, pattern="strided", summary_size=SUMMARY)
  return [
      OpSpec("linear_attn_noncausal",
             _noncausal_forms("linear_attn", normalize=True),
             stateless(functools.partial(spec_inputs.linear_attn,
                                         normalize=True)),
             qkv, context_parallel=("chunk",)),
      OpSpec("retention_noncausal", _noncausal_forms("retention"),
             stateless(spec_inputs.retention), qkv,
             context_parallel=("chunk",)),
      OpSpec("simple_gla_noncausal", _noncausal_forms("simple_gla"),
             stateless(spec_inputs.simple_gla), qkvg,
             context_parallel=("chunk",)),
      OpSpec("gla_noncausal", _noncausal_forms("gla"),
             stateless(spec_inputs.gla), qkvg, context_parallel=("chunk",)),
      OpSpec("ssd_noncausal", _noncausal_forms("ssd", dt_softplus=True),
             stateless(spec_inputs.ssd),
             ("x", "dt", "A", "B", "C", "D", "dt_bias"),
             context_parallel=("chunk",)),
      OpSpec("linear_scan_noncausal", _noncausal_forms("linear_scan"),
             stateless(spec_inputs.linear_scan), ("a", "b"),
             context_parallel=("chunk",)),
      OpSpec("selective_scan_noncausal",
             _noncausal_forms("selective_scan", delta_softplus=True),
             stateless(spec_inputs.selective_scan),
             ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"),
             context_parallel=("chunk",)),
      OpSpec("rg_lru_noncausal", _noncausal_forms("rg_lru"),
             stateless(spec_inputs.rg_lru),
             ("x", "a_gate", "x_gate", "a_param"),
             context_parallel=("chunk",)),
      OpSpec("softmax_attn_noncausal", softmax, attention, qkv,
             context_parallel=("chunk",)),
      OpSpec("sliding_window_attn_noncausal", window, attention, qkv,
             context_parallel=("chunk",)),
      OpSpec("sparse_attn_noncausal",
             {"naive": noncausal(ops.sparse_attn_reference, **sparse),
              "parallel": noncausal(_blocks(ops.parallel_sparse_attn),
                                    **sparse)},
             attention, qkv, chunked=("parallel",)),
      OpSpec("relu_linear_attn",
             {"naive": noncausal(ops.relu_linear_attn_reference),
              "chunk": noncausal(ops.chunk_relu_linear_attn)},
             spec_inputs.relu_linear_attn, qkv, context_parallel=("chunk",)),
      OpSpec("agent_attn",
             {"naive": noncausal(ops.agent_attn,
                                 agent_num=spec_inputs.AGENT_NUM)},
             spec_inputs.agent_attn, qkv + ("agent_bias", "query_bias"),
             chunked=()),
      OpSpec("nystrom_attn",
             {"naive": noncausal(ops.nystrom_attn,
                                 num_landmarks=spec_inputs.NUM_LANDMARKS)},
             spec_inputs.nystrom_attn, qkv, chunked=()),
  ]


def _blocks(fn):
  """``fn`` taking ``chunk_size`` as its ``block_size``."""
  def form(*args, chunk_size=None, **kwargs):
    if chunk_size is not None:
      kwargs["block_size"] = chunk_size
    return fn(*args, **kwargs)
  return form


# The cores, in the order of the table.
CORES = {
    "gated_linear": _gated_linear_specs,
    "diagonal_ssm": _diagonal_ssm_specs,
    "delta_rule": _delta_rule_specs,
    "softmax": _softmax_specs,
    "noncausal": _noncausal_specs,
}

_REGISTERED: dict[str, OpSpec] = {}


@functools.lru_cache(maxsize=None)
def _builtin() -> dict[str, dict[str, OpSpec]]:
  return {core: {spec.name: spec for spec in make()}
          for core, make in CORES.items()}


def core_specs(core: str) -> list[OpSpec]:
  """The specs of the ops on ``core`` (a key of ``CORES``)."""
  if core not in CORES:
    raise KeyError(f"unknown core {core!r}; cores: {sorted(CORES)}")
  return list(_builtin()[core].values())


def all_specs() -> dict[str, OpSpec]:
  """Every op of the table, then every registered one: name -> spec."""
  specs = {}
  for table in _builtin().values():
    specs.update(table)
  specs.update(_REGISTERED)
  return specs


def get_spec(name: str) -> OpSpec:
  """The spec of the op ``name``; a ``KeyError`` lists the known names."""
  specs = all_specs()
  if name not in specs:
    raise KeyError(f"no op {name!r} in the registry; ops: {sorted(specs)}")
  return specs[name]


def register(spec: OpSpec) -> OpSpec:
  """Adds ``spec`` to ``all_specs()`` (a name already taken raises)."""
  if "naive" not in spec.forms:
    raise ValueError(f"op {spec.name!r} has no 'naive' form to check "
                     f"the others against; forms: {sorted(spec.forms)}")
  if spec.name in all_specs():
    raise ValueError(f"op {spec.name!r} is already registered")
  _REGISTERED[spec.name] = spec
  return spec


def unregister(name: str) -> None:
  """Removes an op added by ``register`` (the table's own stay)."""
  if name not in _REGISTERED:
    raise KeyError(f"op {name!r} was not added by register()")
  del _REGISTERED[name]
