"""Efficient attention for JAX: ops, layers and models (see README.md)."""

from lin_attn_jax import xla_workarounds

xla_workarounds.avoid_ynn_reduce_crash()
