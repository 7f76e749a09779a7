"""Next-token cross-entropy over packed rows.

The loss of a batch is the sum of ``-log p(target)`` over the positions
whose ``weights`` are 1 (the next token of the same document; never across
a document boundary, never on padding), divided by their count. Sums and
counts are returned separately so that micro-batches and devices add up to
exactly the loss of the whole batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_sums(logits, targets, weights, z_loss: float = 0.0):
  """Sums over a batch: ``(loss_sum, token_count, z_sum)``.

  Args:
    logits: ``[B, T, vocab]`` (any float dtype; computed in float32).
    targets: ``[B, T]`` int token ids.
    weights: ``[B, T]`` float, 1 where the target counts.
    z_loss: when > 0, ``loss_sum`` includes ``z_loss * logsumexp^2`` at the
      counted positions (PaLM's z-loss); ``z_sum`` is that term alone.
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)                    # [B, T]
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32),
                               axis=-1)[..., 0]                # [B, T]
  nll = (log_z - picked) * weights
  z_sum = jnp.sum(jnp.square(log_z) * weights) * z_loss
  return jnp.sum(nll) + z_sum, jnp.sum(weights), z_sum


def batch_targets(tokens, segment_ids=None, pad_id: int | None = None):
  """``inputs, targets, weights, segment_ids`` from token rows ``[B, T+1]``.

  For users with token arrays rather than ``data.model_inputs`` batches:
  ``weights`` is 1 where the target is the next token of the same segment
  and (with ``pad_id``) not padding.
  """
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(f"tokens must have shape [B, T + 1] with T >= 1, got "
                     f"{tokens.shape}")
  if segment_ids is None:
    segment_ids = jnp.ones(tokens.shape, jnp.int32)
  elif jnp.shape(segment_ids) != tokens.shape:
    raise ValueError(f"segment_ids must have the shape of tokens "
                     f"{tokens.shape}, got {jnp.shape(segment_ids)}")
  seg_in, seg_next = segment_ids[:, :-1], segment_ids[:, 1:]
  weights = (seg_in == seg_next) & (seg_next != 0)
  if pad_id is not None:
    weights &= tokens[:, 1:] != pad_id
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
          "weights": weights.astype(jnp.float32),
          "segment_ids": seg_in.astype(jnp.int32)}
