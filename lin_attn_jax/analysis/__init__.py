"""Analyses of trained and random mixers: the token-mixing matrix of every
causal mixer (``attention_matrix``) and the sparsity of its rows."""

from lin_attn_jax.analysis.attention_matrix import (MixingCall,
                                                    attention_matrix,
                                                    mixing_calls,
                                                    mixing_output,
                                                    row_sparsity)

__all__ = ["MixingCall", "attention_matrix", "mixing_calls", "mixing_output",
           "row_sparsity"]
