"""transformers' hybrid SSM / attention checkpoints: ``falcon_h1``,
``nemotron_h``, ``granitemoehybrid`` (Granite 4.0-H), ``jamba`` and
``lfm2``; their ``<type>_config(hf) -> LMConfig`` and ``<type>_entries(hf,
config) -> [Entry]`` (see ``core.py``), joined to ``architectures.py``'s
table.

How each maps onto the LM:

- ``falcon_h1``: every block is the ``falcon_h1_parallel`` mixer
  (attention and Mamba-2 side by side) and a SwiGLU; the muP multipliers
  are the mixer's options (``key_multiplier``, ``ssm_multipliers``,
  ``attention_in/out_multiplier``, ``ssm_in/out_multiplier``) and the LM's
  ``embed_scale`` (``embedding_multiplier``) and ``multipliers``
  (``lm_head_multiplier`` -> ``"logits"``, ``mlp_multipliers`` ->
  ``"mlp_gate"`` and ``"mlp_out"``).
- ``nemotron_h``: every layer of its pattern is a residual block of its own
  with one norm: a Mamba-2 (``M``) or attention (``*``, no position
  encoding) layer is a block with that mixer and the MLP ``"none"``, an
  MLP layer (``-``, squared ReLU) a block with the mixer ``"none"`` and the
  MLP ``"relu2"``, a mixture-of-experts layer (``E``) one with the mixer
  ``"none"`` and the MLP ``"moe"`` (non-gated squared-ReLU experts, a
  sigmoid router with its ``e_score_correction_bias`` and groups, a shared
  expert).
- ``granitemoehybrid``: Mamba-2 or attention (RoPE or none) and the MoE
  beside a shared SwiGLU (``moe`` with ``shared_dim``), or the shared MLP
  alone without experts; ``residual_multiplier`` scales both residual
  terms, ``attention_multiplier`` (the attention's scale in place of
  ``1/sqrt(K)``) is a key multiplier ``attention_multiplier * sqrt(K)``,
  ``logits_scaling`` divides the logits.
- ``jamba``: Mamba-1 with its time-step, ``B`` and ``C`` norms
  (``inner_norms``) or attention without position encoding, the MLP a
  softmax top-k MoE (weights not renormalised) every
  ``expert_layer_period`` layers and a SwiGLU elsewhere.
- ``lfm2``: LFM2's gated short convolution (``short_conv``) or attention
  with q/k RMSNorms; its final norm is ``embedding_norm``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from lin_attn_jax.convert.common import (block, frame, head, norm,
                                         per_expert, rope, swiglu,
                                         unsupported)
from lin_attn_jax.convert.core import Entry, conv, copy, linear, transpose
from lin_attn_jax.models.lm import LMConfig


def _multipliers(**factors) -> dict:
  return {k: float(v) for k, v in factors.items() if float(v) != 1.0}


def _positive(hf: dict, key: str, default: float = 1.0) -> float:
  value = hf.get(key, default)
  value = default if value is None else float(value)
  if not value > 0:
    raise ValueError(f"config.json has {key} = {value!r}; only a positive "
                     "factor can be loaded")
  return value


def _attention(prefix: str, m, bias: bool = False, out: str = "o_proj"):
  entries = []
  for name in ("q_proj", "k_proj", "v_proj"):
    entries += linear(f"{prefix}.{name}", m + (name,), bias)
  return entries + linear(f"{prefix}.{out}", m + ("o_proj",), bias)


def _mamba2_tensors(prefix: str, m, options: dict) -> list[Entry]:
  """transformers' Mamba-2 mixers (Falcon-H1, Nemotron-H, Granite): the
  ``in_proj`` rows ``z, x, B, C, dt``, the convolution, ``dt_bias``,
  ``A_log``, ``D``, the gated norm and ``out_proj``."""
  out = linear(f"{prefix}.in_proj", m + ("in_proj",), options["bias"])
  out += [conv(f"{prefix}.conv1d.weight", m + ("conv", "weight"))]
  if options["conv_bias"]:
    out += [copy(f"{prefix}.conv1d.bias", m + ("conv", "bias"))]
  out += [copy(f"{prefix}.{name}", m + (name,))
          for name in ("dt_bias", "A_log", "D")]
  if options.get("rms_norm", True):
    out += [copy(f"{prefix}.norm.weight", m + ("norm", "scale"))]
  out_bias = options.get("out_bias")
  out += linear(f"{prefix}.out_proj", m + ("out_proj",),
                options["bias"] if out_bias is None else out_bias)
  return out


def _time_step_limit(hf: dict, key: str = "time_step_limit"):
  limit = hf.get(key)
  return ((0.0, math.inf) if limit is None
          else tuple(float(v) for v in limit))


def _fused_experts(hf_name: str, ours) -> Entry:
  """Routed experts in one ``[E, out, in]`` tensor <-> ``[E, in, out]``."""
  return Entry((hf_name,), (ours,), lambda w: (jnp.swapaxes(w, 1, 2),),
               lambda p: (jnp.swapaxes(p, 1, 2),))


def _split_rows(hf_name: str, first, second) -> Entry:
  """A fused ``[.., 2F, D]`` weight (gate rows, then up rows) <-> two
  kernels ``[.., D, F]``."""

  def to_ours(w):
    gate, up = jnp.split(w, 2, axis=-2)
    return jnp.swapaxes(gate, -1, -2), jnp.swapaxes(up, -1, -2)

  def to_hf(gate, up):
    return (jnp.concatenate([jnp.swapaxes(gate, -1, -2),
                             jnp.swapaxes(up, -1, -2)], axis=-2),)

  return Entry((hf_name,), (first, second), to_ours, to_hf)


# --- Falcon-H1 -------------------------------------------------------------

def falcon_h1_config(hf: dict) -> LMConfig:
  """transformers' ``falcon_h1``: see the module docstring. ``mamba_chunk_size``
  is speed only."""
  unsupported(hf, "hidden_act", ("silu",), default="silu")
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  m_heads = int(hf["mamba_n_heads"])
  d_ssm = hf.get("mamba_d_ssm")
  width = int(d_ssm) if d_ssm is not None else int(hf["mamba_expand"] * d)
  m_head_dim = hf.get("mamba_d_head", "auto")
  m_head_dim = width // m_heads if m_head_dim == "auto" else int(m_head_dim)
  if m_head_dim * m_heads != width:
    raise ValueError(f"config.json has mamba_d_head * mamba_n_heads = "
                     f"{m_head_dim} * {m_heads} != the Mamba width {width}")
  mlp_mult = list(hf.get("mlp_multipliers") or (1.0, 1.0))
  ssm_mult = tuple(float(v) for v in hf.get("ssm_multipliers")
                   or (1.0,) * 5)
  if len(mlp_mult) != 2 or len(ssm_mult) != 5:
    raise ValueError(f"config.json has mlp_multipliers = {mlp_mult} and "
                     f"ssm_multipliers = {list(ssm_mult)}; Falcon-H1 has 2 "
                     "and 5")
  eps = float(hf.get("rms_norm_eps", 1e-5))
  head_dim = hf.get("head_dim")
  options = dict(
      n_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=None if head_dim is None else int(head_dim),
      rope_base=rope(hf)[0], attention_bias=bool(hf.get("attention_bias")),
      key_multiplier=float(hf.get("key_multiplier", 1.0)),
      mamba_n_heads=m_heads, mamba_head_dim=m_head_dim,
      d_state=int(hf["mamba_d_state"]), d_conv=int(hf["mamba_d_conv"]),
      n_groups=int(hf.get("mamba_n_groups", 1)),
      mamba_conv_bias=bool(hf.get("mamba_conv_bias", True)),
      mamba_proj_bias=bool(hf.get("mamba_proj_bias", False)),
      projectors_bias=bool(hf.get("projectors_bias", False)),
      mamba_rms_norm=bool(hf.get("mamba_rms_norm", False)),
      mamba_norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
      norm_eps=eps, ssm_multipliers=ssm_mult,
      time_step_limit=_time_step_limit(hf),
      attention_in_multiplier=float(hf.get("attention_in_multiplier", 1.0)),
      attention_out_multiplier=float(hf.get("attention_out_multiplier",
                                            1.0)),
      ssm_in_multiplier=float(hf.get("ssm_in_multiplier", 1.0)),
      ssm_out_multiplier=float(hf.get("ssm_out_multiplier", 1.0)),
      chunk_size=int(hf.get("mamba_chunk_size", 64)))
  embed = _positive(hf, "embedding_multiplier")
  return LMConfig(
      vocab_size=int(hf["vocab_size"]), d_model=d,
      n_layers=int(hf["num_hidden_layers"]), n_heads=heads,
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      mixer="falcon_h1_parallel",
      mixer_options={"falcon_h1_parallel": options},
      mlp_dim=int(hf["intermediate_size"]),
      mlp_bias=bool(hf.get("mlp_bias", False)), norm_eps=eps,
      embed_scale=None if embed == 1.0 else embed,
      multipliers=_multipliers(
          logits=_positive(hf, "lm_head_multiplier"),
          mlp_gate=mlp_mult[0], mlp_out=mlp_mult[1]))


def falcon_h1_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for("falcon_h1_parallel")
  mamba = dict(bias=options["mamba_proj_bias"],
               conv_bias=options["mamba_conv_bias"],
               rms_norm=options["mamba_rms_norm"],
               out_bias=options["projectors_bias"])
  out = frame("model.embed_tokens.weight", "model.final_layernorm")
  for i in range(config.n_layers):
    p, m = f"model.layers.{i}", block(i, "mixer")
    out += norm(f"{p}.input_layernorm", block(i, "mixer_norm"))
    out += norm(f"{p}.pre_ff_layernorm", block(i, "mlp_norm"))
    out += swiglu(f"{p}.feed_forward", block(i, "mlp"),
                  bias=config.mlp_bias)
    out += _attention(f"{p}.self_attn", m + ("self_attn",),
                      options["attention_bias"])
    out += _mamba2_tensors(f"{p}.mamba", m + ("mamba",), mamba)
  return out + head(config)


# --- Nemotron-H ------------------------------------------------------------

_NEMOTRON_KINDS = {"M": "linear_attention", "*": "full_attention",
                   "-": "mlp", "E": "moe", "mamba": "linear_attention",
                   "attention": "full_attention"}


def _nemotron_kinds(hf: dict) -> list[str]:
  kinds = hf.get("layers_block_type") or hf.get("layer_types")
  if kinds is None:
    kinds = list(hf.get("hybrid_override_pattern") or "")
  kinds = [_NEMOTRON_KINDS.get(k, k) for k in kinds]
  unknown = sorted(set(kinds) - {"linear_attention", "full_attention", "mlp",
                                 "moe"})
  if not kinds or unknown:
    raise ValueError(f"config.json has layers_block_type = {kinds}; known "
                     "kinds: linear_attention (M), full_attention (*), mlp "
                     "(-), moe (E)")
  return kinds


def nemotron_h_config(hf: dict) -> LMConfig:
  """transformers' ``nemotron_h``: one block per layer of the pattern (see
  the module docstring). Its Mamba-2 clamps the time step below at
  ``time_step_min`` (the layer's ``time_step_limit``); the attention's
  biases are never built (``attention_bias`` is not read);
  ``mamba_proj_bias`` is not read either (``use_bias`` is)."""
  kinds = _nemotron_kinds(hf)
  unsupported(hf, "mlp_hidden_act", ("relu2",), default="relu2")
  unsupported(hf, "mamba_hidden_act", ("silu",), default="silu")
  unsupported(hf, "sliding_window", (None,))
  unsupported(hf, "num_nextn_predict_layers", (0, None),
              "multi-token prediction layers are not loaded")
  unsupported(hf, "moe_latent_size", (None,), "the latent projections of "
              "the experts are not implemented")
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  eps = float(hf.get("layer_norm_epsilon", 1e-5))
  m_heads, m_head_dim = int(hf["mamba_num_heads"]), int(hf["mamba_head_dim"])
  width = int(hf.get("expand", 2) * d)
  if m_heads * m_head_dim != width:
    raise ValueError(f"config.json has mamba_num_heads * mamba_head_dim = "
                     f"{m_heads} * {m_head_dim} != expand * hidden_size = "
                     f"{width}")
  table = {"linear_attention": ("mamba2", "none"),
           "full_attention": ("softmax_attn", "none"),
           "mlp": ("none", "relu2"), "moe": ("none", "moe")}
  mixers = tuple(table[k][0] for k in kinds)
  mlps = tuple(table[k][1] for k in kinds)
  options = {
      "mamba2": dict(n_heads=m_heads, head_dim=m_head_dim,
                     d_state=int(hf["ssm_state_size"]),
                     d_conv=int(hf.get("conv_kernel", 4)),
                     n_groups=int(hf.get("n_groups", 1)),
                     conv_bias=bool(hf.get("use_conv_bias", True)),
                     bias=bool(hf.get("use_bias", False)), norm_eps=eps,
                     time_step_limit=(float(hf.get("time_step_min", 1e-3)),
                                      math.inf),
                     chunk_size=int(hf.get("chunk_size", 128))),
      "softmax_attn": dict(n_kv_heads=int(hf.get("num_key_value_heads")
                                          or heads),
                           head_dim=int(hf.get("head_dim") or d // heads),
                           rope_fraction=0.0),
  }
  options = {k: v for k, v in options.items() if k in mixers}
  moe = {}
  if "moe" in mlps:
    moe = dict(n_experts=int(hf["n_routed_experts"]),
               top_k=int(hf["num_experts_per_tok"]),
               expert_dim=int(hf["moe_intermediate_size"]),
               activation="relu2", score="sigmoid", selection_bias=True,
               n_groups=int(hf.get("n_group", 1)),
               topk_groups=int(hf.get("topk_group", 1)),
               normalize_topk=bool(hf.get("norm_topk_prob", True)),
               routed_scale=float(hf.get("routed_scaling_factor", 1.0)),
               shared_dim=int(hf["moe_shared_expert_intermediate_size"]))
  return LMConfig(
      vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=len(kinds),
      n_heads=heads, tie_embeddings=bool(hf.get("tie_word_embeddings",
                                                False)),
      mixer=mixers, mixer_options=options, mlp=mlps, moe_options=moe,
      mlp_dim=int(hf["intermediate_size"]),
      mlp_bias=bool(hf.get("mlp_bias", False)), norm_eps=eps)


def nemotron_h_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = frame("backbone.embeddings.weight", "backbone.norm_f")
  options = config.options_for("mamba2")
  for i, (mixer, mlp) in enumerate(zip(config.layer_mixers,
                                       config.layer_mlps)):
    p, m = f"backbone.layers.{i}", block(i, "mixer")
    before = "mlp_norm" if mixer == "none" else "mixer_norm"
    out += norm(f"{p}.norm", block(i, before))
    if mixer == "mamba2":
      out += _mamba2_tensors(f"{p}.mixer", m, options)
    elif mixer == "softmax_attn":
      out += _attention(f"{p}.mixer", m)
    elif mlp == "moe":
      mlp_path = block(i, "mlp")
      out += [transpose(f"{p}.mixer.gate.weight", mlp_path + ("router",)),
              copy(f"{p}.mixer.gate.e_score_correction_bias",
                   mlp_path + ("selection_bias",))]
      out += per_expert(f"{p}.mixer", mlp_path, config.n_experts,
                        {"up": "up_proj", "down": "down_proj"})
      for name in ("up", "down"):
        out += linear(f"{p}.mixer.shared_experts.{name}_proj",
                      mlp_path + ("shared", name))
    else:
      for name in ("up", "down"):
        out += linear(f"{p}.mixer.{name}_proj", block(i, "mlp", name),
                      config.mlp_bias)
  return out + head(config)


# --- Granite 4.0-H ---------------------------------------------------------

def _granite_kinds(hf: dict) -> list[str]:
  n = int(hf["num_hidden_layers"])
  kinds = list(hf.get("layer_types") or hf.get("layers_block_type") or [])
  names = {"mamba": "mamba2", "linear_attention": "mamba2",
           "attention": "softmax_attn", "full_attention": "softmax_attn"}
  if len(kinds) != n or any(k not in names for k in kinds):
    raise ValueError(f"config.json has layer_types = {kinds}; need "
                     f"{n} of {sorted(names)}")
  return [names[k] for k in kinds]


def granitemoehybrid_config(hf: dict) -> LMConfig:
  """transformers' ``granitemoehybrid``: see the module docstring.
  ``router_aux_loss_coef`` is a training setting (the train step's)."""
  unsupported(hf, "hidden_act", ("silu",), default="silu")
  unsupported(hf, "position_embedding_type", ("rope", "nope", None),
              default="rope")
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  head_dim = int(hf.get("head_dim") or d // heads)
  eps = float(hf.get("rms_norm_eps", 1e-6))
  mixers = tuple(_granite_kinds(hf))
  bias = bool(hf.get("attention_bias", False))
  use_rope = hf.get("position_embedding_type", "rope") == "rope"
  options = {
      "mamba2": dict(n_heads=int(hf["mamba_n_heads"]),
                     head_dim=int(hf["mamba_d_head"]),
                     d_state=int(hf["mamba_d_state"]),
                     d_conv=int(hf.get("mamba_d_conv", 4)),
                     n_groups=int(hf.get("mamba_n_groups", 1)),
                     conv_bias=bool(hf.get("mamba_conv_bias", True)),
                     bias=bool(hf.get("mamba_proj_bias", False)),
                     norm_eps=eps, time_step_limit=_time_step_limit(hf),
                     chunk_size=int(hf.get("mamba_chunk_size", 256))),
      "softmax_attn": dict(
          n_kv_heads=int(hf.get("num_key_value_heads") or heads),
          head_dim=head_dim, qkv_bias=bias, out_bias=bias,
          rope_base=rope(hf)[0] if use_rope else 10000.0,
          rope_fraction=1.0 if use_rope else 0.0,
          key_multiplier=float(hf.get("attention_multiplier",
                                      head_dim ** -0.5)) * head_dim ** 0.5),
  }
  options = {k: v for k, v in options.items() if k in mixers}
  width = hf["mamba_n_heads"] * hf["mamba_d_head"]
  if "mamba2" in mixers and width != int(hf.get("mamba_expand", 2) * d):
    raise ValueError(f"config.json has mamba_n_heads * mamba_d_head = "
                     f"{width} != mamba_expand * hidden_size")
  experts = int(hf.get("num_local_experts") or 0)
  shared = int(hf["shared_intermediate_size"])
  if experts:
    mlp = dict(mlp="moe", moe_options=dict(
        n_experts=experts, top_k=int(hf["num_experts_per_tok"]),
        expert_dim=int(hf["intermediate_size"]), score="softmax",
        normalize_topk=True, shared_dim=shared))
  else:
    mlp = dict(mlp="swiglu", mlp_dim=shared)
  residual = _positive(hf, "residual_multiplier")
  embed = _positive(hf, "embedding_multiplier")
  return LMConfig(
      vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=len(mixers),
      n_heads=heads, tie_embeddings=bool(hf.get("tie_word_embeddings",
                                                False)),
      mixer=mixers, mixer_options=options, norm_eps=eps,
      embed_scale=None if embed == 1.0 else embed,
      multipliers=_multipliers(
          mixer_out=residual, mlp_out=residual,
          logits=1.0 / _positive(hf, "logits_scaling")), **mlp)


def granitemoehybrid_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = frame("model.embed_tokens.weight", "model.norm")
  options = config.options_for("mamba2")
  bias = bool(hf.get("attention_bias", False))
  for i, mixer in enumerate(config.layer_mixers):
    p, m, mlp = f"model.layers.{i}", block(i, "mixer"), block(i, "mlp")
    out += norm(f"{p}.input_layernorm", block(i, "mixer_norm"))
    out += norm(f"{p}.post_attention_layernorm", block(i, "mlp_norm"))
    if mixer == "mamba2":
      out += _mamba2_tensors(f"{p}.mamba", m, options)
    else:
      out += _attention(f"{p}.self_attn", m, bias)
    s = f"{p}.shared_mlp"
    shared = mlp + ("shared",) if config.layer_mlps[i] == "moe" else mlp
    out += [_split_rows(f"{s}.input_linear.weight",
                        shared + ("gate", "kernel"), shared + ("up", "kernel"))]
    out += linear(f"{s}.output_linear", shared + ("down",))
    if config.layer_mlps[i] == "moe":
      e = f"{p}.block_sparse_moe"
      out += [transpose(f"{e}.router.layer.weight", mlp + ("router",)),
              _split_rows(f"{e}.input_linear.weight", mlp + ("gate",),
                          mlp + ("up",)),
              _fused_experts(f"{e}.output_linear.weight", mlp + ("down",))]
  return out + head(config)


# --- Jamba -----------------------------------------------------------------

def _jamba_layers(hf: dict):
  """``(mixer, mlp)`` names of every layer."""
  n = int(hf["num_hidden_layers"])
  experts = int(hf.get("num_experts", 16))
  period, offset = int(hf.get("attn_layer_period", 8)), int(
      hf.get("attn_layer_offset", 4))
  e_period, e_offset = int(hf.get("expert_layer_period", 2)), int(
      hf.get("expert_layer_offset", 1))
  mixers = tuple("softmax_attn" if i % period == offset else "mamba"
                 for i in range(n))
  mlps = tuple("moe" if experts > 1 and i % e_period == e_offset
               else "swiglu" for i in range(n))
  return mixers, mlps


def jamba_config(hf: dict) -> LMConfig:
  """transformers' ``jamba``: see the module docstring. Its attention has
  no position encoding; its router takes the top-k of a softmax over all
  experts and does not renormalise."""
  unsupported(hf, "hidden_act", ("silu",), default="silu")
  unsupported(hf, "sliding_window", (None,))
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  eps = float(hf.get("rms_norm_eps", 1e-6))
  mixers, mlps = _jamba_layers(hf)
  rank = hf.get("mamba_dt_rank", "auto")
  rank = math.ceil(d / 16) if rank == "auto" else int(rank)
  options = {
      "mamba": dict(d_state=int(hf.get("mamba_d_state", 16)),
                    d_conv=int(hf.get("mamba_d_conv", 4)),
                    expand=float(hf.get("mamba_expand", 2)), dt_rank=rank,
                    conv_bias=bool(hf.get("mamba_conv_bias", True)),
                    bias=bool(hf.get("mamba_proj_bias", False)),
                    inner_norms=True, inner_norm_eps=eps),
      "softmax_attn": dict(n_kv_heads=int(hf.get("num_key_value_heads")
                                          or heads), rope_fraction=0.0),
  }
  options = {k: v for k, v in options.items() if k in mixers}
  moe = {}
  if "moe" in mlps:
    moe = dict(n_experts=int(hf["num_experts"]),
               top_k=int(hf.get("num_experts_per_tok", 2)),
               expert_dim=int(hf["intermediate_size"]), score="softmax",
               normalize_topk=False)
  return LMConfig(
      vocab_size=int(hf["vocab_size"]), d_model=d,
      n_layers=int(hf["num_hidden_layers"]), n_heads=heads,
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      mixer=mixers, mixer_options=options, mlp=mlps, moe_options=moe,
      mlp_dim=int(hf["intermediate_size"]), norm_eps=eps)


def jamba_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = frame("model.embed_tokens.weight", "model.final_layernorm")
  options = config.options_for("mamba")
  n_experts = config.n_experts
  for i, (mixer, mlp_kind) in enumerate(zip(config.layer_mixers,
                                            config.layer_mlps)):
    p, m, mlp = f"model.layers.{i}", block(i, "mixer"), block(i, "mlp")
    out += norm(f"{p}.input_layernorm", block(i, "mixer_norm"))
    out += norm(f"{p}.pre_ff_layernorm", block(i, "mlp_norm"))
    if mixer == "mamba":
      a = f"{p}.mamba"
      out += linear(f"{a}.in_proj", m + ("in_proj",), options["bias"])
      out += [conv(f"{a}.conv1d.weight", m + ("conv", "weight"))]
      if options["conv_bias"]:
        out += [copy(f"{a}.conv1d.bias", m + ("conv", "bias"))]
      out += linear(f"{a}.x_proj", m + ("x_proj",))
      out += linear(f"{a}.dt_proj", m + ("dt_proj",))
      out += [copy(f"{a}.dt_proj.bias", m + ("dt_bias",)),
              copy(f"{a}.A_log", m + ("A_log",)), copy(f"{a}.D", m + ("D",))]
      out += [copy(f"{a}.{hf_name}.weight", m + (ours, "scale"))
              for hf_name, ours in (("dt_layernorm", "dt_norm"),
                                    ("b_layernorm", "B_norm"),
                                    ("c_layernorm", "C_norm"))]
      out += linear(f"{a}.out_proj", m + ("out_proj",), options["bias"])
    else:
      out += _attention(f"{p}.self_attn", m)
    f = f"{p}.feed_forward"
    if mlp_kind == "moe":
      out += [transpose(f"{f}.router.weight", mlp + ("router",))]
      out += per_expert(f, mlp, n_experts, {"gate": "gate_proj",
                                            "up": "up_proj",
                                            "down": "down_proj"})
    else:
      out += swiglu(f, mlp)
  return out + head(config)


# --- LFM2 ------------------------------------------------------------------

def _lfm2_kinds(hf: dict) -> tuple[str, ...]:
  n = int(hf["num_hidden_layers"])
  kinds = hf.get("layer_types")
  if kinds is None:
    attention = set(hf.get("full_attn_idxs") or ())
    kinds = ["full_attention" if i in attention else "conv" for i in range(n)]
  names = {"conv": "short_conv", "full_attention": "softmax_attn"}
  if len(kinds) != n or any(k not in names for k in kinds):
    raise ValueError(f"config.json has layer_types = {kinds}; need {n} of "
                     f"{sorted(names)}")
  return tuple(names[k] for k in kinds)


def lfm2_mlp_dim(hf: dict) -> int:
  """LFM2's feed-forward width (``Lfm2MLP``): with
  ``block_auto_adjust_ff_dim``, ``2/3`` of ``intermediate_size``, times
  ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``."""
  width = int(hf["intermediate_size"])
  if hf.get("block_auto_adjust_ff_dim", True):
    width = int(2 * width / 3)
    multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
      width = int(multiplier * width)
    step = int(hf.get("block_multiple_of", 256))
    width = step * ((width + step - 1) // step)
  return width


def lfm2_config(hf: dict) -> LMConfig:
  """transformers' ``lfm2``: see the module docstring."""
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  eps = float(hf.get("norm_eps", 1e-5))
  mixers = _lfm2_kinds(hf)
  options = {
      "short_conv": dict(conv_size=int(hf.get("conv_L_cache", 3)),
                         bias=bool(hf.get("conv_bias", False))),
      "softmax_attn": dict(n_kv_heads=int(hf.get("num_key_value_heads")
                                          or heads),
                           rope_base=rope(hf)[0], qk_norm="rms",
                           qk_norm_eps=eps),
  }
  options = {k: v for k, v in options.items() if k in mixers}
  return LMConfig(
      vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=len(mixers),
      n_heads=heads, tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      mixer=mixers, mixer_options=options, mlp_dim=lfm2_mlp_dim(hf),
      norm_eps=eps)


def lfm2_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = frame("model.embed_tokens.weight", "model.embedding_norm")
  for i, mixer in enumerate(config.layer_mixers):
    p, m = f"model.layers.{i}", block(i, "mixer")
    out += norm(f"{p}.operator_norm", block(i, "mixer_norm"))
    out += norm(f"{p}.ffn_norm", block(i, "mlp_norm"))
    out += swiglu(f"{p}.feed_forward", block(i, "mlp"), ("w1", "w3", "w2"))
    if mixer == "short_conv":
      bias = config.options_for("short_conv")["bias"]
      c = f"{p}.conv"
      out += linear(f"{c}.in_proj", m + ("in_proj",), bias)
      out += [conv(f"{c}.conv.weight", m + ("conv", "weight"))]
      if bias:
        out += [copy(f"{c}.conv.bias", m + ("conv", "bias"))]
      out += linear(f"{c}.out_proj", m + ("out_proj",), bias)
    else:
      a = f"{p}.self_attn"
      out += _attention(a, m, out="out_proj")
      out += norm(f"{a}.q_layernorm", m + ("q_norm",))
      out += norm(f"{a}.k_layernorm", m + ("k_norm",))
  return out + head(config)


ARCHITECTURES = {
    "falcon_h1": (falcon_h1_config, falcon_h1_entries),
    "nemotron_h": (nemotron_h_config, nemotron_h_entries),
    "granitemoehybrid": (granitemoehybrid_config, granitemoehybrid_entries),
    "jamba": (jamba_config, jamba_entries),
    "lfm2": (lfm2_config, lfm2_entries),
}
