"""Checking an op's forms against each other, for the tests and for users.

``check_forms(spec)`` checks every form of an op of
``lin_attn_jax.ops.registry`` (or a new one) against its naive form,
outputs, final states and gradients, under ``jax.jit``, ``lax.scan`` and
``jax.grad``, with segment ids, an initial state and context parallelism;
see docs/new_variant.md. The checks of whole models (which need Flax) are
in ``lin_attn_jax.testing.lm_checks``, imported on its own.
"""

from lin_attn_jax.testing.calls import (CHUNK_SIZE, DIMS, Call,
                                        concrete_arrays, is_float, op_calls)
from lin_attn_jax.testing.errors import (assert_close_errors, cast_floats,
                                         compare_results,
                                         errors_against_fixture,
                                         errors_against_reference,
                                         outputs_and_grads, over_tolerance,
                                         rel_rms, run_reference, value_name)
from lin_attn_jax.testing.harness import (FormMismatch, check_chunk_variant,
                                          check_forms, make_inputs,
                                          sequence_mesh)
from lin_attn_jax.testing.traced import (CUSTOM_CALL_PRIMITIVES,
                                         check_custom_calls, primitives,
                                         traced_closed_over, traced_grads)

__all__ = [
    "CHUNK_SIZE", "CUSTOM_CALL_PRIMITIVES", "Call", "DIMS", "FormMismatch",
    "assert_close_errors", "cast_floats", "check_chunk_variant",
    "check_custom_calls", "check_forms",
    "compare_results", "concrete_arrays", "errors_against_fixture",
    "errors_against_reference",
    "is_float", "make_inputs", "op_calls", "outputs_and_grads",
    "over_tolerance", "primitives", "rel_rms", "run_reference",
    "sequence_mesh", "traced_closed_over", "traced_grads", "value_name",
]
