"""The short depthwise causal convolution (Mamba, H3, DeltaNet, ...).

    y_t = act(sum_{w < W} weight[:, w] * x_{t - W + 1 + w} + bias)

The last tap multiplies the current input. The decoding state is the last
``W - 1`` inputs, oldest first, ``[B, W - 1, D]``; ``initial_state`` holds
the inputs before ``x_0``. With ``segment_ids`` a tap only reads inputs of
the output's own document (the initial state belongs to the first one), and
the final state keeps only inputs of the last document (zeros elsewhere),
exactly as if the step form had been reset at every document start.

Letters: b batch, t time, d channel, w tap.
"""

from lin_attn_jax.ops.conv.inputs import MAX_WIDTH
from lin_attn_jax.ops.conv.token_shift import token_shift
from lin_attn_jax.ops.conv.naive import naive_recurrent_causal_conv1d
from lin_attn_jax.ops.conv.parallel import parallel_causal_conv1d
from lin_attn_jax.ops.conv.chunk import chunk_causal_conv1d
from lin_attn_jax.ops.conv.recurrent import recurrent_causal_conv1d
from lin_attn_jax.ops.conv.step import causal_conv1d_step

__all__ = [
    "MAX_WIDTH",
    "causal_conv1d_step",
    "chunk_causal_conv1d",
    "naive_recurrent_causal_conv1d",
    "parallel_causal_conv1d",
    "recurrent_causal_conv1d",
    "token_shift",
]
