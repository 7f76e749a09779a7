"""The CPU default (``make run``): a 4-layer GLA + sliding-window hybrid,
0.83M parameters, on the Python standard library's source, byte tokens.

Sized so that on two CPU cores the whole run (compiling included) takes
about three minutes and held-out bits per byte fall from about 8 to
below the README's target.
"""

from experiments.configs.base import Experiment
from lin_attn_jax.models.lm import LMConfig
from lin_attn_jax.train import TrainConfig

CONFIG = Experiment(
    model=LMConfig(
        vocab_size=256, d_model=128, n_layers=4, n_heads=4,
        # Three GLA layers, then one softmax layer over the last 64 tokens.
        mixer=("gla", "gla", "gla", "sliding_window_attn"),
        mixer_options={"gla": {"chunk_size": 32},
                       "sliding_window_attn": {"window_size": 64,
                                               "block_size": 64}}),
    train=TrainConfig(batch_size=16, seq_len=128, steps=300,
                      learning_rate=3e-3, warmup_steps=30,
                      checkpoint_every=100, checkpoint_keep=2),
    mesh="fsdp=-1",
    rules="fsdp",
    data="stdlib",
    eval_every=50,
    eval_batches=8,
    sample_every=100,
    sample_tokens=64,
    prompt="def ",
    log_every=25,
)
