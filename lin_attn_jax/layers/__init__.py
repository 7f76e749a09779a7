"""Flax NNX token mixers, one per variant, and the ``MIXERS`` registry.

Every mixer is built as ``cls(d_model, n_heads, *, rngs, dtype=...,
param_dtype=..., **options)`` and called as ``mixer(x, segment_ids=None,
mode="chunk", cache=None)``; see ``layers/base.py`` for the contract and
for ``OpForms``, the forms of an op that ``Mixer.apply_forms`` runs.
"""

from lin_attn_jax.layers.base import MODES, Context, Mixer, OpForms

from lin_attn_jax.layers.agent_attn import AgentAttention
from lin_attn_jax.layers.based import Based
from lin_attn_jax.layers.comba import Comba
from lin_attn_jax.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from lin_attn_jax.layers.efficientvit import EfficientViTAttention
from lin_attn_jax.layers.falcon_h1 import FalconH1Parallel
from lin_attn_jax.layers.forgetting_attn import ForgettingAttention
from lin_attn_jax.layers.gdn2 import GatedDeltaNet2
from lin_attn_jax.layers.gated_deltaproduct import GatedDeltaProduct
from lin_attn_jax.layers.gla import GLA
from lin_attn_jax.layers.h3 import H3
from lin_attn_jax.layers.hgrn2 import HGRN2
from lin_attn_jax.layers.lightning import LightningAttention
from lin_attn_jax.layers.linear_attn import LinearAttention
from lin_attn_jax.layers.linformer import Linformer
from lin_attn_jax.layers.nystromformer import Nystromformer
from lin_attn_jax.layers.mamba import Mamba
from lin_attn_jax.layers.mamba2 import Mamba2
from lin_attn_jax.layers.mla import MultiHeadLatentAttention
from lin_attn_jax.layers.log_linear_mamba2 import LogLinearMamba2
from lin_attn_jax.layers.mamba3 import Mamba3
from lin_attn_jax.layers.mlstm import MLSTM
from lin_attn_jax.layers.mesa_net import MesaNet
from lin_attn_jax.layers.nsa import NativeSparseAttention
from lin_attn_jax.layers.moba import MoBA
from lin_attn_jax.layers.path_attn import PaTHAttention
from lin_attn_jax.layers.performer import Performer
from lin_attn_jax.layers.retnet import RetNet
from lin_attn_jax.layers.rg_lru import RGLRU
from lin_attn_jax.layers.rwkv import RWKV6, RWKV7
from lin_attn_jax.layers.short_conv import GatedShortConv
from lin_attn_jax.layers.softmax import (GatedAttention,
                                         SlidingWindowAttention,
                                         SoftmaxAttention, SparseAttention)
from lin_attn_jax.layers.stickbreaking import StickBreakingAttention

MIXERS: dict[str, type[Mixer]] = {
    # Softmax family.
    "softmax_attn": SoftmaxAttention,
    "sliding_window_attn": SlidingWindowAttention,
    "sparse_attn": SparseAttention,
    "nsa": NativeSparseAttention,
    "linformer": Linformer,
    # Encoder-only (non-causal) mixers.
    "agent_attn": AgentAttention,
    "nystromformer": Nystromformer,
    "efficientvit": EfficientViTAttention,
    "stickbreaking_attn": StickBreakingAttention,
    "forgetting_attn": ForgettingAttention,
    "moba": MoBA,
    "path_attn": PaTHAttention,
    # The attention layers and blocks of hybrid checkpoints.
    "gated_attn": GatedAttention,
    "mla": MultiHeadLatentAttention,
    "short_conv": GatedShortConv,
    "falcon_h1_parallel": FalconH1Parallel,
    # Gated-linear-attention core.
    "linear_attn": LinearAttention,
    "performer": Performer,
    "based": Based,
    "retnet": RetNet,
    "lightning_attn": LightningAttention,
    "gla": GLA,
    "hgrn2": HGRN2,
    "mlstm": MLSTM,
    "mesa_net": MesaNet,
    # Diagonal-SSM core.
    "mamba": Mamba,
    "mamba2": Mamba2,
    "h3": H3,
    "rg_lru": RGLRU,
    # Delta-rule core and RWKV.
    "deltanet": DeltaNet,
    "gated_deltanet": GatedDeltaNet,
    "kda": KDA,
    "rwkv6": RWKV6,
    "rwkv7": RWKV7,
    "gdn2": GatedDeltaNet2,
    "gated_deltaproduct": GatedDeltaProduct,
    "comba": Comba,
    "mamba3": Mamba3,
    "log_linear_mamba2": LogLinearMamba2,
}

__all__ = ["AgentAttention", "Based", "Comba", "Context", "DeltaNet",
           "EfficientViTAttention", "FalconH1Parallel",
           "ForgettingAttention", "GLA", "GatedAttention", "GatedDeltaNet",
           "GatedDeltaNet2", "GatedDeltaProduct", "GatedShortConv", "H3",
           "HGRN2", "KDA", "LightningAttention", "LinearAttention",
           "Linformer", "LogLinearMamba2",
           "MIXERS", "MODES", "Mamba", "Mamba2", "Mamba3", "MesaNet", "Mixer",
           "MoBA", "MultiHeadLatentAttention", "NativeSparseAttention",
           "Nystromformer",
           "OpForms", "PaTHAttention", "Performer", "RGLRU", "RWKV6", "RWKV7",
           "RetNet", "SlidingWindowAttention", "SoftmaxAttention",
           "SparseAttention", "StickBreakingAttention"]
