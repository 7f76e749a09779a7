"""A multi-host TPU pod slice (v4-64 .. v5e-256): a 24-layer, 2048-wide
GLA + sliding-window hybrid (1.2B parameters), FSDP over every chip,
rematerialised blocks, bfloat16 compute.

A global batch of 512 x 4096 tokens (2M tokens per step) needs a large
corpus: pass ``--data=tokens:PATH,dtype=uint16`` (a token file on every
worker's disk) with its ``--vocab_size`` (padded to a multiple of 128);
the default ``stdlib`` data only lets the command run anywhere.
Checkpoints belong on a bucket: ``--checkpoint_dir=gs://BUCKET/PATH``.
"""

from experiments.configs.base import Experiment
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig
import jax.numpy as jnp

CONFIG = Experiment(
    model=LMConfig(
        vocab_size=256, d_model=2048, n_layers=24, n_heads=16,
        mixer=("gla", "gla", "gla", "sliding_window_attn"),
        mixer_options={"gla": {"chunk_size": 64},
                       "sliding_window_attn": {"window_size": 1024}},
        dtype=jnp.bfloat16, remat="block"),
    train=TrainConfig(batch_size=512, seq_len=4096, steps=20000,
                      learning_rate=3e-4, warmup_steps=2000,
                      checkpoint_every=500, checkpoint_keep=3),
    mesh="fsdp=-1",
    rules="fsdp",
    data="stdlib",
    eval_every=1000,
    eval_batches=16,
    sample_every=2000,
    sample_tokens=128,
    prompt="def ",
    log_every=20,
)
