"""Agent Attention: two softmax attentions through ``N`` agent tokens.

Han et al. 2024, "Agent Attention: On the Integration of Softmax and Linear
Attention" (https://arxiv.org/abs/2312.08874). The agents ``A: [N, K]`` are
the queries average-pooled to ``N`` tokens; they gather the values by
softmax attention over the keys, and every query reads the agents:

    A = pool(Q)                                   [N, K]
    V_A = softmax(scale A K^T + B_1) V            [N, V]  (agent aggregation)
    O = softmax(scale Q A^T + B_2) V_A            [T, V]  (agent broadcast)

with the optional agent biases ``B_1: [N, T]`` and ``B_2: [T, N]``. Cost
``O(T N)``. Every agent pools queries from across the row and reads every
key, so the op is not causal and has no decoding step; packed documents
would see each other through the agents, so a row holds one document.
``agent_attn`` (``naive.py``) is the op's one form.
"""

from lin_attn_jax.ops.agent_attn.naive import agent_attn

__all__ = ["agent_attn"]
