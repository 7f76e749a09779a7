"""The short depthwise causal convolution, in every form."""

from lin_attn_jax.ops.conv.causal_conv1d import (causal_conv1d_step,
                                                 chunk_causal_conv1d,
                                                 naive_recurrent_causal_conv1d,
                                                 parallel_causal_conv1d,
                                                 recurrent_causal_conv1d)
from lin_attn_jax.ops.conv.inputs import MAX_WIDTH
from lin_attn_jax.ops.conv.token_shift import token_shift

__all__ = [
    "MAX_WIDTH",
    "causal_conv1d_step",
    "chunk_causal_conv1d",
    "naive_recurrent_causal_conv1d",
    "parallel_causal_conv1d",
    "recurrent_causal_conv1d",
    "token_shift",
]
