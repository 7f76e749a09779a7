"""The chunkwise form of the causal convolution."""

from __future__ import annotations

from lin_attn_jax.ops.common import checks, context_parallel
from lin_attn_jax.ops.conv import context_parallel as split
from lin_attn_jax.ops.conv.parallel import parallel_causal_conv1d


@context_parallel.splits_sequence(
    lambda: split.context_parallel_causal_conv1d)
def chunk_causal_conv1d(x, weight, bias=None, *, activation=None,
                        initial_state=None, output_final_state=False,
                        segment_ids=None, chunk_size=64):
  """Depthwise causal convolution, the training form.

  The taps are summed over the whole sequence at once, one shifted,
  document-masked copy per tap (as in ``parallel_causal_conv1d``): XLA fuses
  the copies into one pass, which on CPU is faster than a ``lax.scan`` over
  chunks carrying the last ``W - 1`` inputs (the chunk axis copies and the
  per-step overhead cost more than the ``W`` taps).

  Args:
    x: ``[B, T, D]``.
    weight: ``[D, W]``, ``1 <= W <= MAX_WIDTH`` (64); the last tap multiplies
      the current input.
    bias: ``[D]``, or None.
    activation: None, ``"silu"`` or ``"swish"``.
    initial_state: ``[B, W - 1, D]`` float32, the inputs before ``x_0``
      (oldest first), or None for zeros.
    output_final_state: also return the last ``W - 1`` inputs.
    segment_ids: ``[B, T]`` int; no tap crosses a change of id.
    chunk_size: kept for the common signature of the chunk forms (checked,
      no effect).
  Returns:
    ``(y [B, T, D] in x's dtype, final_state [B, W - 1, D] float32 or
    None)``.

  Example:
    >>> x = jnp.ones((2, 100, 8)); weight = jnp.ones((8, 4))
    >>> y, s = chunk_causal_conv1d(x, weight, activation="silu",
    ...                            output_final_state=True)
    >>> y.shape, s.shape
    ((2, 100, 8), (2, 3, 8))
  """
  checks.check_chunk_size(chunk_size)
  return parallel_causal_conv1d(x, weight, bias, activation=activation,
                                initial_state=initial_state,
                                output_final_state=output_final_state,
                                segment_ids=segment_ids)
