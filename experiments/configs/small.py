"""One TPU host (v4-8, v5e-8, v6e-8) or one GPU node: a 12-layer, 768-wide
GLA + sliding-window hybrid (85M parameters), bfloat16 compute,
every chip on ``fsdp``.

The standard-library corpus is about 31M bytes: the 2000 steps here are
about eight passes over it. For longer runs pass ``--data`` (a text glob
or a token file) and ``--steps``.
"""

from experiments.configs.base import Experiment
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig
import jax.numpy as jnp

CONFIG = Experiment(
    model=LMConfig(
        vocab_size=256, d_model=768, n_layers=12, n_heads=12,
        mixer=("gla", "gla", "gla", "sliding_window_attn"),
        mixer_options={"gla": {"chunk_size": 64},
                       "sliding_window_attn": {"window_size": 512}},
        dtype=jnp.bfloat16),
    train=TrainConfig(batch_size=64, seq_len=2048, steps=2000,
                      learning_rate=1e-3, warmup_steps=200,
                      checkpoint_every=500),
    mesh="fsdp=-1",
    rules="fsdp",
    data="stdlib",
    eval_every=250,
    eval_batches=8,
    sample_every=500,
    sample_tokens=128,
    prompt="def ",
    log_every=50,
)
