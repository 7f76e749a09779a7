"""Training: the train state, sharded creation, steps, checkpoints.

- ``config.TrainConfig``: optimizer, schedule, batch and checkpoint settings;
- ``trainer.Trainer``: sharded init, the jitted train and eval steps;
- ``loss``: next-token cross-entropy over packed rows, z-loss;
- ``optim``: AdamW, warmup + cosine, clipping, the weight-decay mask;
- ``checkpoint.Checkpointer``: orbax checkpoints, restorable on any mesh;
- ``flops``: model FLOPs per token and MFU;
- ``loop.fit``: the loop that ties them to the data and a work directory.
"""

from lin_attn_jax.train.checkpoint import Checkpointer
from lin_attn_jax.train.config import TrainConfig
from lin_attn_jax.train.trainer import Trainer, TrainState

__all__ = ["Checkpointer", "TrainConfig", "TrainState", "Trainer"]
