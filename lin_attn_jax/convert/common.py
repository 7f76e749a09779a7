"""Pieces the architecture tables share (``architectures.py``,
``linear_hybrids.py``, ``ssm_hybrids.py``): refusing a config option, the
LM's block paths, the embedding, norms and head, the default RoPE's
settings, SwiGLU MLPs and routed experts stored one ``Linear`` per expert.
"""

from __future__ import annotations

import jax.numpy as jnp

from lin_attn_jax.convert.core import (Entry, copy, linear, offset_scale,
                                       transpose)
from lin_attn_jax.models.lm import LMConfig


def unsupported(hf: dict, key: str, allowed, why: str = "", default=None):
  """``ValueError`` unless ``hf[key]`` (``default`` when absent) is one of
  ``allowed``; ``why`` says what the LM lacks."""
  value = hf.get(key, default)
  if value not in allowed:
    raise ValueError(f"config.json has {key} = {value!r}; only {allowed} can "
                     f"be loaded{': ' + why if why else ''}")


def block(i: int, *rest):
  """The path of block ``i``'s ``rest`` in the LM's parameters."""
  return ("blocks", i) + rest


def norm(prefix: str, ours, offset: bool = False,
         bias: bool = False) -> list[Entry]:
  """``{prefix}.weight`` (and ``.bias``) <-> ``ours + scale`` (``bias``);
  ``offset``: the checkpoint stores ``w`` of a norm scaling by ``1 + w``."""
  make = offset_scale if offset else copy
  out = [make(f"{prefix}.weight", ours + ("scale",))]
  if bias:
    out.append(copy(f"{prefix}.bias", ours + ("bias",)))
  return out


def frame(embedding: str, final_norm: str,
          offset: bool = False) -> list[Entry]:
  """The token embedding ``embedding`` and the final norm ``final_norm``
  (see ``norm``)."""
  out = [copy(embedding, ("embed", "embedding"))]
  return out + norm(final_norm, ("final_norm",), offset=offset)


def head(config: LMConfig, name: str = "lm_head.weight") -> list[Entry]:
  """The output projection, unless the LM ties it to the embedding."""
  return [] if config.tie_embeddings else [transpose(name, ("lm_head",
                                                            "kernel"))]


def rope(hf: dict, partial_default: float = 1.0) -> tuple[float, float]:
  """``(rope_theta, partial_rotary_factor)`` of ``rope_parameters`` (or of
  the older top-level keys); ``ValueError`` for any ``rope_type`` but the
  default."""
  rope_parameters = hf.get("rope_parameters") or {}
  unsupported({"rope_type": rope_parameters.get("rope_type", "default")},
              "rope_type", ("default",), "scaled RoPE is not implemented")
  theta = float(rope_parameters.get("rope_theta",
                                    hf.get("rope_theta", 10000.0)))
  fraction = float(rope_parameters.get(
      "partial_rotary_factor", hf.get("partial_rotary_factor",
                                      partial_default)))
  return theta, fraction


SWIGLU_NAMES = ("gate_proj", "up_proj", "down_proj")


def swiglu(prefix: str, mlp, names=SWIGLU_NAMES,
           bias: bool = False) -> list[Entry]:
  """A SwiGLU MLP: ``{prefix}.{names}`` (gate, up, down ``Linear``s) <->
  ``mlp + gate/up/down``."""
  out = []
  for hf_name, ours in zip(names, ("gate", "up", "down")):
    out += linear(f"{prefix}.{hf_name}", mlp + (ours,), bias)
  return out


def stacked_experts(hf_names, ours) -> Entry:
  """One ``Linear`` weight ``[out, in]`` per expert (``hf_names``, in
  expert order) <-> the stacked kernels ``[E, in, out]`` at ``ours``."""
  return Entry(tuple(hf_names), (ours,),
               lambda *ws: (jnp.stack([w.T for w in ws]),),
               lambda p: tuple(p[e].T for e in range(p.shape[0])))


def per_expert(prefix: str, mlp, n_experts: int,
               names: dict) -> list[Entry]:
  """``{prefix}.experts.{e}.{hf}.weight`` for each of our ``gate`` /
  ``up`` / ``down`` in ``names`` (ours -> hf) <-> ``mlp + ours``."""
  return [stacked_experts([f"{prefix}.experts.{e}.{hf}.weight"
                           for e in range(n_experts)], mlp + (ours,))
          for ours, hf in names.items()]
