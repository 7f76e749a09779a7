"""HuggingFace-format architectures and their maps onto the project's LM.

Each architecture is keyed by the ``model_type`` of its ``config.json``:
``lm_config(hf) -> LMConfig`` (raising ``ValueError`` for options the LM
cannot reproduce exactly) and ``entries(hf, config) -> [Entry]`` (see
``core.py``). Tensor names are those of ``save_pretrained``: transformers'
``mamba``, ``mamba2``, ``recurrent_gemma`` and ``xlstm`` (the hybrids of
``linear_hybrids.py``: ``qwen3_next``, ``kimi_linear`` and ``minimax``; of
``ssm_hybrids.py``: ``falcon_h1``, ``nemotron_h``, ``granitemoehybrid``,
``jamba`` and ``lfm2``),
and flash-linear-attention's ``gla``, ``delta_net``, ``gated_deltanet``,
``rwkv6``, ``rwkv7``, ``stickbreaking_attn``, ``forgetting_transformer``,
``nsa``, ``path_attn``, ``gated_deltaproduct``, ``comba``, ``mamba3``,
``log_linear_mamba2`` and ``mesa_net``.

Norm conventions: RecurrentGemma and Qwen3-Next scale by ``1 + w``; the LM's
scale is that sum (an export subtracts 1 again). Heads of fla's and
Qwen3-Next's output norms share one weight, which the LM tiles over heads.
RWKV-7's GroupNorm epsilon is ``head_dim * norm_eps`` as in fla.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from lin_attn_jax.convert import ssm_hybrids
from lin_attn_jax.convert.common import (block, frame, head, norm, rope,
                                         swiglu, unsupported)
from lin_attn_jax.convert.core import (Entry, conv, copy, head_shared, linear,
                                       transpose)
from lin_attn_jax.models.lm import LMConfig


def _common(hf: dict, **kw) -> dict:
  out = dict(vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
             n_layers=int(hf["num_hidden_layers"]),
             tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
  out.update(kw)
  return out


# --- transformers: Mamba --------------------------------------------------

def mamba_config(hf: dict) -> LMConfig:
  unsupported(hf, "hidden_act", ("silu",))
  rank = hf.get("time_step_rank", "auto")
  rank = math.ceil(hf["hidden_size"] / 16) if rank == "auto" else int(rank)
  width = int(hf.get("intermediate_size") or hf["expand"] * hf["hidden_size"])
  options = dict(d_state=int(hf["state_size"]), d_conv=int(hf["conv_kernel"]),
                 expand=width / hf["hidden_size"], dt_rank=rank,
                 conv_bias=bool(hf.get("use_conv_bias", True)),
                 bias=bool(hf.get("use_bias", False)))
  return LMConfig(**_common(hf, tie_embeddings=bool(
      hf.get("tie_word_embeddings", True))), n_heads=1, mixer="mamba",
                  mixer_options={"mamba": options}, mlp="none",
                  norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)))


def _mamba_backbone(hf: dict, config: LMConfig, layer_rest) -> list[Entry]:
  """Entries of transformers' Mamba and Mamba-2 backbones: embedding, final
  norm and per layer its norm, ``in_proj`` and convolution, then
  ``layer_rest(p, m)`` (the mixer's own tensors) and ``out_proj``."""
  bias = bool(hf.get("use_bias", False))
  out = frame("backbone.embeddings.weight", "backbone.norm_f")
  for i in range(config.n_layers):
    p = f"backbone.layers.{i}"
    m = block(i, "mixer")
    out += norm(f"{p}.norm", block(i, "mixer_norm"))
    out += linear(f"{p}.mixer.in_proj", m + ("in_proj",), bias)
    out += [conv(f"{p}.mixer.conv1d.weight", m + ("conv", "weight"))]
    if hf.get("use_conv_bias", True):
      out += [copy(f"{p}.mixer.conv1d.bias", m + ("conv", "bias"))]
    out += layer_rest(p, m)
    out += linear(f"{p}.mixer.out_proj", m + ("out_proj",), bias)
  return out + head(config)


def mamba_entries(hf: dict, config: LMConfig) -> list[Entry]:
  def layer_rest(p, m):
    return (linear(f"{p}.mixer.x_proj", m + ("x_proj",))
            + linear(f"{p}.mixer.dt_proj", m + ("dt_proj",))
            + [copy(f"{p}.mixer.dt_proj.bias", m + ("dt_bias",)),
               copy(f"{p}.mixer.A_log", m + ("A_log",)),
               copy(f"{p}.mixer.D", m + ("D",))])

  return _mamba_backbone(hf, config, layer_rest)


# --- transformers: Mamba-2 ------------------------------------------------

def mamba2_config(hf: dict) -> LMConfig:
  unsupported(hf, "hidden_act", ("silu",))
  unsupported(hf, "rms_norm", (True, None), "the gated RMSNorm is always on")
  width = int(hf["expand"] * hf["hidden_size"])
  heads, head_dim = int(hf["num_heads"]), int(hf["head_dim"])
  if heads * head_dim != width:
    raise ValueError(f"config.json has num_heads * head_dim = {heads} * "
                     f"{head_dim} != expand * hidden_size = {width}; only "
                     "checkpoints without an MLP part in the mixer load")
  limit = tuple(float(v) for v in hf.get("time_step_limit", (0.0, math.inf)))
  options = dict(d_state=int(hf["state_size"]), d_conv=int(hf["conv_kernel"]),
                 n_groups=int(hf.get("n_groups", 1)), head_dim=head_dim,
                 conv_bias=bool(hf.get("use_conv_bias", True)),
                 bias=bool(hf.get("use_bias", False)),
                 norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                 time_step_limit=limit,
                 chunk_size=int(hf.get("chunk_size", 64)))
  return LMConfig(**_common(hf), n_heads=heads, mixer="mamba2",
                  mixer_options={"mamba2": options}, mlp="none",
                  norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)))


def mamba2_entries(hf: dict, config: LMConfig) -> list[Entry]:
  def layer_rest(p, m):
    return [copy(f"{p}.mixer.dt_bias", m + ("dt_bias",)),
            copy(f"{p}.mixer.A_log", m + ("A_log",)),
            copy(f"{p}.mixer.D", m + ("D",)),
            copy(f"{p}.mixer.norm.weight", m + ("norm", "scale"))]

  return _mamba_backbone(hf, config, layer_rest)


# --- transformers: RecurrentGemma -----------------------------------------

def bfloat16_round(x: float) -> float:
  """``x`` rounded to bfloat16, as RecurrentGemma's embedding normaliser."""
  return float(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16))


def _rg_block_types(hf: dict) -> list[str]:
  types = list(hf.get("block_types") or ("recurrent", "recurrent",
                                         "attention"))
  return (types * hf["num_hidden_layers"])[:hf["num_hidden_layers"]]


def recurrent_gemma_config(hf: dict) -> LMConfig:
  unsupported(hf, "hidden_activation", ("gelu_pytorch_tanh",))
  unsupported(hf, "attention_bias", (False, None))
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  rope_theta, fraction = rope(hf, partial_default=0.5)
  names = tuple("rg_lru" if kind == "recurrent" else "sliding_window_attn"
                for kind in _rg_block_types(hf))
  options = {
      "rg_lru": dict(lru_width=int(hf.get("lru_width") or d),
                     conv_width=int(hf.get("conv1d_width", 4)),
                     use_bias=True, scale_first_token=False),
      "sliding_window_attn": dict(
          window_size=int(hf.get("attention_window_size", 2048)),
          n_kv_heads=int(hf.get("num_key_value_heads") or heads),
          rope_base=rope_theta, rope_fraction=fraction, out_bias=True),
  }
  options = {k: v for k, v in options.items() if k in names}
  cap = hf.get("logits_soft_cap")
  return LMConfig(**_common(hf, tie_embeddings=True), n_heads=heads,
                  mixer=names, mixer_options=options, mlp="geglu",
                  mlp_bias=True, mlp_dim=int(hf["intermediate_size"]) // 2,
                  norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                  embed_scale=bfloat16_round(math.sqrt(d)),
                  logits_soft_cap=None if cap is None else float(cap))


def recurrent_gemma_entries(hf: dict, config: LMConfig) -> list[Entry]:
  if not hf.get("tie_word_embeddings", True):
    raise ValueError("config.json has tie_word_embeddings = False; "
                     "RecurrentGemma's head is the embedding")
  out = frame("model.embed_tokens.weight", "model.final_norm", offset=True)
  for i, kind in enumerate(_rg_block_types(hf)):
    p = f"model.layers.{i}"
    m = block(i, "mixer")
    out += norm(f"{p}.temporal_pre_norm", block(i, "mixer_norm"),
                offset=True)
    out += norm(f"{p}.channel_pre_norm", block(i, "mlp_norm"), offset=True)
    out += swiglu(f"{p}.mlp_block", block(i, "mlp"), bias=True)
    t = f"{p}.temporal_block"
    if kind == "recurrent":
      out += linear(f"{t}.linear_y", m + ("gate_proj",), True)
      out += linear(f"{t}.linear_x", m + ("in_proj",), True)
      out += linear(f"{t}.linear_out", m + ("out_proj",), True)
      out += [conv(f"{t}.conv_1d.weight", m + ("conv", "weight")),
              copy(f"{t}.conv_1d.bias", m + ("conv", "bias")),
              copy(f"{t}.rg_lru.recurrent_param", m + ("a_param",))]
      for hf_gate, ours in (("recurrent_gate", "a_gate"),
                            ("input_gate", "x_gate")):
        out += [copy(f"{t}.rg_lru.{hf_gate}_weight", m + (ours, "kernel")),
                copy(f"{t}.rg_lru.{hf_gate}_bias", m + (ours, "bias"))]
    else:
      for name in ("q_proj", "k_proj", "v_proj"):
        out += linear(f"{t}.{name}", m + (name,))
      out += linear(f"{t}.o_proj", m + ("o_proj",), True)
  return out


# --- transformers: Qwen3-Next's fused Gated DeltaNet tensors (linear_hybrids)

def _qkvz_entry(hf_name: str, m, nk: int, nv: int, hk: int, hv: int) -> Entry:
  """``in_proj_qkvz``: per key head ``[q (hk), k (hk), v (r hv), z (r hv)]``
  rows, ``r = nv / nk``."""
  r = nv // nk
  sizes = np.cumsum([hk, hk, r * hv])

  def to_ours(w):
    d = w.shape[-1]
    w = w.reshape(nk, 2 * hk + 2 * r * hv, d)
    q, k, v, z = jnp.split(w, sizes, axis=1)
    return tuple(x.reshape(-1, d).T for x in (q, k, v, z))

  def to_hf(q, k, v, z):
    d = q.shape[0]
    parts = [x.T.reshape(nk, -1, d) for x in (q, k, v, z)]
    return (jnp.concatenate(parts, axis=1).reshape(-1, d),)

  names = ("q_proj", "k_proj", "v_proj", "g_proj")
  return Entry((hf_name,), tuple(m + (n, "kernel") for n in names), to_ours,
               to_hf)


def _ba_entry(hf_name: str, m, nk: int, nv: int) -> Entry:
  """``in_proj_ba``: per key head ``[b (r), a (r)]`` rows."""
  r = nv // nk

  def to_ours(w):
    d = w.shape[-1]
    b, a = jnp.split(w.reshape(nk, 2 * r, d), 2, axis=1)
    return b.reshape(nv, d).T, a.reshape(nv, d).T

  def to_hf(b, a):
    d = b.shape[0]
    return (jnp.concatenate([b.T.reshape(nk, r, d), a.T.reshape(nk, r, d)],
                            axis=1).reshape(2 * nv, d),)

  return Entry((hf_name,), (m + ("b_proj", "kernel"), m + ("a_proj", "kernel")),
               to_ours, to_hf)


def _split_conv_entry(hf_name: str, convs, sizes) -> Entry:
  """One depthwise conv over concatenated channels <-> one per part."""
  cuts = np.cumsum(sizes)[:-1]
  return Entry((hf_name,), tuple(c + ("weight",) for c in convs),
               lambda w: tuple(jnp.split(w[:, 0, :], cuts, axis=0)),
               lambda *ws: (jnp.concatenate(ws, axis=0)[:, None, :],))


# --- transformers: xLSTM (xLSTM-7B) ---------------------------------------

def xlstm_config(hf: dict) -> LMConfig:
  """transformers' ``xlstm``: every block an mLSTM layer and a SwiGLU MLP
  of width ``ffn_proj_factor * hidden_size`` rounded up to a multiple of
  ``ffn_round_up_to_multiple_of``, RMS norms (the final one always, whatever
  ``add_out_norm`` says, as in transformers), logits soft-capped. The
  reference's kernel dtype (``autocast_kernel_dtype``, bfloat16 by default)
  is a precision setting, not a parameter: the LM computes in its own
  ``dtype``."""
  unsupported(hf, "use_bias", (False, None),
              "the blocks' RMS norms would have biases, which the LM's RMS "
              "norms do not have")
  unsupported(hf, "weight_mode", ("single", "fused", None))
  d = int(hf["hidden_size"])
  for key, want in (("embedding_dim", d),
                    ("num_blocks", int(hf["num_hidden_layers"]))):
    if hf.get(key) is not None and int(hf[key]) != want:
      raise ValueError(f"config.json has {key} = {hf[key]}, not {want}; "
                       "transformers builds the model from both")
  multiple = int(hf.get("ffn_round_up_to_multiple_of", 64))
  width = d * float(hf.get("ffn_proj_factor", 2.667))
  mlp_dim = int((width + multiple - 1) // multiple * multiple)
  norm_eps = float(hf.get("norm_eps", 1e-6))
  cap = hf.get("gate_soft_cap", 15.0)
  options = dict(qk_dim_factor=float(hf.get("qk_dim_factor", 0.5)),
                 v_dim_factor=float(hf.get("v_dim_factor", 1.0)),
                 gate_soft_cap=None if cap is None else float(cap),
                 norm_eps=norm_eps, eps=float(hf.get("eps", 1e-6)),
                 n_blocks=int(hf["num_hidden_layers"]))
  logits_cap = hf.get("output_logit_soft_cap", 30.0)
  return LMConfig(**_common(hf), n_heads=int(hf.get("num_heads", 8)),
                  mixer="mlstm", mixer_options={"mlstm": options},
                  mlp_dim=mlp_dim, norm_eps=norm_eps,
                  logits_soft_cap=(None if logits_cap is None
                                   else float(logits_cap)))


def _split_rows(hf_name: str, ours, sizes) -> Entry:
  """A fused ``[sum(sizes), ...]`` weight (a ``Linear`` weight or bias)
  <-> one parameter per part (kernels ``[in, part]`` transposed, biases
  as they are)."""
  cuts = np.cumsum(sizes)[:-1]

  def to_ours(w):
    parts = jnp.split(w, cuts, axis=0)
    return tuple(p.T if p.ndim == 2 else p for p in parts)

  def to_hf(*parts):
    return (jnp.concatenate([p.T if p.ndim == 2 else p for p in parts],
                            axis=0),)

  return Entry((hf_name,), tuple(ours), to_ours, to_hf)


def xlstm_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for("mlstm")
  d, heads = config.d_model, config.n_heads
  qk = int(d * options["qk_dim_factor"])
  v = int(d * options["v_dim_factor"])
  fused = hf.get("weight_mode", "single") == "fused"
  out = frame("backbone.embeddings.weight", "backbone.out_norm")
  for i in range(config.n_layers):
    p, m, mlp = f"backbone.blocks.{i}", block(i, "mixer"), block(i, "mlp")
    a = f"{p}.mlstm_layer"
    out += norm(f"{p}.norm_mlstm", block(i, "mixer_norm"))
    out += norm(f"{p}.norm_ffn", block(i, "mlp_norm"))
    if fused:
      out += [_split_rows(f"{a}.qkv_opreact.weight",
                          [m + (n, "kernel") for n in
                           ("q_proj", "k_proj", "v_proj", "o_gate")],
                          (qk, qk, v, v)),
              _split_rows(f"{a}.ifgate_preact.weight",
                          [m + (n, "kernel") for n in ("i_gate", "f_gate")],
                          (heads, heads)),
              _split_rows(f"{a}.ifgate_preact.bias",
                          [m + (n, "bias") for n in ("i_gate", "f_gate")],
                          (heads, heads)),
              _split_rows(f"{p}.ffn.proj_up_gate_z.weight",
                          [mlp + (n, "kernel") for n in ("gate", "up")],
                          (config.mlp_dim, config.mlp_dim))]
    else:
      for hf_name, ours in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"),
                            ("ogate_preact", "o_gate")):
        out += linear(f"{a}.{hf_name}", m + (ours,))
      out += linear(f"{a}.igate_preact", m + ("i_gate",), True)
      out += linear(f"{a}.fgate_preact", m + ("f_gate",), True)
      out += linear(f"{p}.ffn.proj_up_gate", mlp + ("gate",))
      out += linear(f"{p}.ffn.proj_up", mlp + ("up",))
    out += [copy(f"{a}.multihead_norm.weight", m + ("norm", "scale"))]
    out += linear(f"{a}.out_proj", m + ("out_proj",))
    out += linear(f"{p}.ffn.proj_down", mlp + ("down",))
  return out + head(config)


# --- flash-linear-attention -----------------------------------------------

def _fla_checks(hf: dict) -> None:
  unsupported(hf, "attn", (None,), "hybrid softmax-attention layers of fla "
              "models are not mapped")
  unsupported(hf, "attnres_block_size", (None,))
  unsupported(hf, "elementwise_affine", (True, None))


def _fla_mlp_dim(hf: dict) -> int:
  if hf.get("intermediate_size") is not None:
    return int(hf["intermediate_size"])
  ratio = hf.get("hidden_ratio") or 4
  size = int(hf["hidden_size"] * ratio * 2 / 3)
  return 256 * ((size + 255) // 256)


def _fla_swiglu_config(hf: dict, mixer: str, n_heads: int,
                       options: dict) -> LMConfig:
  _fla_checks(hf)
  unsupported(hf, "hidden_act", ("swish",))
  return LMConfig(**_common(hf), n_heads=n_heads, mixer=mixer,
                  mixer_options={mixer: options}, mlp_dim=_fla_mlp_dim(hf),
                  norm_eps=float(hf.get("norm_eps", 1e-6)))


def _fla_swiglu_block(i: int) -> list[Entry]:
  p = f"model.layers.{i}"
  out = norm(f"{p}.attn_norm", block(i, "mixer_norm"))
  out += norm(f"{p}.mlp_norm", block(i, "mlp_norm"))
  out += swiglu(f"{p}.mlp", block(i, "mlp"))
  return out


def _fla_frame(hf: dict, config: LMConfig) -> list[Entry]:
  out = [copy("model.embeddings.weight", ("embed", "embedding"))]
  norm_bias = config.norm == "layer"
  out += norm("model.norm", ("final_norm",), bias=norm_bias)
  return out + head(config)


def _fla_short_conv(hf: dict, default: bool) -> dict:
  """The short-convolution options of an fla model's config (``default``:
  its ``use_short_conv`` when the file leaves it out). fla's GLA, DeltaNet
  and Gated DeltaNet models do not pass the config's ``conv_bias`` to their
  layers: their convolutions never have a bias, whatever the file says."""
  use = hf.get("use_short_conv")
  return dict(use_short_conv=default if use is None else bool(use),
              conv_size=int(hf.get("conv_size", 4)), conv_bias=False)


def _fla_short_conv_entries(a: str, m, config: LMConfig) -> list[Entry]:
  """``{a}.{q,k,v}_conv1d.weight`` ``[C, 1, W]`` <-> the mixer's
  ``short_conv``, when its options turn it on."""
  options = config.options_for(config.layer_mixers[0])
  if not options.get("use_short_conv"):
    return []
  return [conv(f"{a}.{name}_conv1d.weight",
               m + ("short_conv", f"{name}_conv", "weight"))
          for name in ("q", "k", "v")]


def gla_config(hf: dict) -> LMConfig:
  for key, allowed in (("num_kv_heads", (None,)), ("feature_map", (None,)),
                       ("use_output_gate", (True, None)),
                       ("clamp_min", (None,)), ("use_gk", (True, None)),
                       ("use_gv", (False, None))):
    unsupported(hf, key, allowed)
  options = dict(expand_k=float(hf.get("expand_k", 0.5)),
                 expand_v=float(hf.get("expand_v", 1.0)),
                 norm_eps=float(hf.get("norm_eps", 1e-6)),
                 **_fla_short_conv(hf, default=False))
  return _fla_swiglu_config(hf, "gla", int(hf["num_heads"]), options)


def gla_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _fla_frame(hf, config)
  heads = config.n_heads
  o_norm = ("g_norm_swish_gate" if hf.get("fuse_norm", True) else "g_norm")
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    out += _fla_swiglu_block(i)
    for hf_name, ours in (("q_proj", "q_proj"), ("k_proj", "k_proj"),
                          ("v_proj", "v_proj"), ("g_proj", "out_gate"),
                          ("o_proj", "o_proj"), ("gk_proj.0", "gate_down")):
      out += linear(f"{a}.{hf_name}", m + (ours,))
    out += linear(f"{a}.gk_proj.1", m + ("gate_up",), True)
    out += _fla_short_conv_entries(a, m, config)
    out += [head_shared(f"{a}.{o_norm}.weight", m + ("norm", "scale"),
                        heads)]
  return out


def _delta_common(hf: dict) -> dict:
  return dict(**_fla_short_conv(hf, default=True),
              allow_neg_eigval=bool(hf.get("allow_neg_eigval", False)),
              norm_eps=float(hf.get("norm_eps", 1e-5)))


def delta_net_config(hf: dict) -> LMConfig:
  for key, allowed in (("use_beta", (True, None)),
                       ("qk_activation", ("silu", None)),
                       ("qk_norm", ("l2", None))):
    unsupported(hf, key, allowed)
  options = dict(_delta_common(hf), expand_k=float(hf.get("expand_k", 1.0)),
                 expand_v=float(hf.get("expand_v", 1.0)),
                 use_output_gate=bool(hf.get("use_gate", False)))
  return _fla_swiglu_config(hf, "deltanet", int(hf["num_heads"]), options)


def gated_deltanet_config(hf: dict) -> LMConfig:
  unsupported(hf, "use_gate", (True, None))
  unsupported(hf, "output_gate_activation", ("swish", "silu", None))
  heads, head_dim = int(hf["num_heads"]), int(hf.get("head_dim", 256))
  value_width = head_dim * float(hf.get("expand_v", 2))
  if value_width != int(value_width):
    raise ValueError(f"config.json has head_dim * expand_v = {value_width}, "
                     "not an integer")
  options = dict(_delta_common(hf),
                 n_v_heads=int(hf.get("num_v_heads") or heads),
                 head_k_dim=head_dim, head_v_dim=int(value_width),
                 use_output_gate=True)
  return _fla_swiglu_config(hf, "gated_deltanet", heads, options)


def _delta_entries(hf: dict, config: LMConfig, gated: bool) -> list[Entry]:
  out = _fla_frame(hf, config)
  options = config.options_for(config.layer_mixers[0])
  heads = options.get("n_v_heads") or config.n_heads
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    out += _fla_swiglu_block(i)
    for name in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
      out += linear(f"{a}.{name}", m + (name,))
    out += _fla_short_conv_entries(a, m, config)
    if gated:
      out += linear(f"{a}.a_proj", m + ("a_proj",))
      out += [copy(f"{a}.A_log", m + ("A_log",)),
              copy(f"{a}.dt_bias", m + ("dt_bias",))]
    if options.get("use_output_gate"):
      out += linear(f"{a}.g_proj", m + ("g_proj",))
    out += [head_shared(f"{a}.o_norm.weight", m + ("norm", "scale"), heads)]
  return out


def delta_net_entries(hf, config):
  return _delta_entries(hf, config, gated=False)


def gated_deltanet_entries(hf, config):
  return _delta_entries(hf, config, gated=True)


def gated_deltaproduct_config(hf: dict) -> LMConfig:
  """fla's ``gated_deltaproduct``: the model config's defaults (one step, no
  forget gate, beta in (0, 1)) where the file leaves a key out."""
  heads, head_dim = int(hf["num_heads"]), int(hf.get("head_dim", 256))
  value_width = head_dim * float(hf.get("expand_v", 2))
  if value_width != int(value_width):
    raise ValueError(f"config.json has head_dim * expand_v = {value_width}, "
                     "not an integer")
  options = dict(_delta_common(hf), head_k_dim=head_dim,
                 head_v_dim=int(value_width),
                 num_householder=int(hf.get("num_householder", 1)),
                 use_forget_gate=bool(hf.get("use_forget_gate", False)),
                 use_output_gate=bool(hf.get("use_output_gate", True)))
  return _fla_swiglu_config(hf, "gated_deltaproduct", heads, options)


def gated_deltaproduct_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for(config.layer_mixers[0])
  return _delta_entries(hf, config, gated=options["use_forget_gate"])


def comba_config(hf: dict) -> LMConfig:
  """fla's ``comba``. Its model builds every layer with the inner decay
  and the output correction (``D`` from ones) whatever the config says
  (``use_inner_decay``, ``use_output_correction`` and ``correction_factor``
  are not passed on), and without convolution biases."""
  heads, head_dim = int(hf["num_heads"]), int(hf.get("head_dim", 256))
  value_width = head_dim * float(hf.get("expand_v", 2))
  if value_width != int(value_width):
    raise ValueError(f"config.json has head_dim * expand_v = {value_width}, "
                     "not an integer")
  options = dict(**_fla_short_conv(hf, default=True),
                 norm_eps=float(hf.get("norm_eps", 1e-6)),
                 n_v_heads=int(hf.get("num_v_heads") or heads),
                 head_k_dim=head_dim, head_v_dim=int(value_width),
                 use_output_gate=bool(hf.get("use_output_gate", True)),
                 use_inner_decay=True, use_output_correction=True)
  return _fla_swiglu_config(hf, "comba", heads, options)


def comba_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _delta_entries(hf, config, gated=True)
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    out += [copy(f"{a}.decay", m + ("decay",)), copy(f"{a}.D", m + ("D",))]
  return out


def forgetting_transformer_config(hf: dict) -> LMConfig:
  if hf.get("window_size") is not None:
    raise ValueError(
        f"config.json has window_size = {hf['window_size']!r}; only None "
        "loads: fla's ForgettingAttention attends to the whole sequence in "
        "its forward pass and keeps only the window in its decoding cache, "
        "so the model has no one meaning to reproduce")
  heads = int(hf["num_heads"])
  options = dict(n_kv_heads=int(hf.get("num_kv_heads") or heads),
                 qkv_bias=bool(hf.get("qkv_bias", False)),
                 qk_norm=bool(hf.get("qk_norm", False)),
                 use_output_gate=bool(hf.get("use_output_gate", False)))
  return _fla_swiglu_config(hf, "forgetting_attn", heads, options)


def _fla_attention_entries(hf: dict, config: LMConfig, qkv_bias: bool,
                           layer_entries) -> list[Entry]:
  """An fla attention model's frame and, per layer, its SwiGLU block, the
  q, k, v projections (with a bias when ``qkv_bias``) and
  ``layer_entries(a, m)``, the rest of the layer from fla's prefix ``a``
  to the mixer's path ``m``."""
  out = _fla_frame(hf, config)
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    out += _fla_swiglu_block(i)
    for name in ("q_proj", "k_proj", "v_proj"):
      out += linear(f"{a}.{name}", m + (name,), qkv_bias)
    out += layer_entries(a, m)
  return out


def forgetting_transformer_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for("forgetting_attn")

  def layer(a, m):
    out = linear(f"{a}.f_proj", m + ("f_proj",), True)
    out += linear(f"{a}.o_proj", m + ("o_proj",))
    if options["use_output_gate"]:
      out += linear(f"{a}.g_proj", m + ("g_proj",))
    if options["qk_norm"]:
      out += [copy(f"{a}.q_norm.weight", m + ("q_norm", "scale")),
              copy(f"{a}.k_norm.weight", m + ("k_norm", "scale"))]
    return out

  return _fla_attention_entries(hf, config, options["qkv_bias"], layer)


def _rwkv_config(hf: dict, mixer: str, n_heads: int, options: dict,
                 mlp_dim: int) -> LMConfig:
  _fla_checks(hf)
  unsupported(hf, "hidden_act", ("sqrelu",))
  unsupported(hf, "norm_bias", (True, None))
  return LMConfig(**_common(hf), n_heads=n_heads, mixer=mixer,
                  mixer_options={mixer: options}, mlp=mixer, mlp_dim=mlp_dim,
                  norm="layer", embed_norm=bool(hf.get("norm_first", True)),
                  norm_eps=float(hf.get("norm_eps", 1e-5)))


def _rwkv_mlp_dim(hf: dict, ratio: float) -> int:
  if hf.get("intermediate_size") is not None:
    return int(hf["intermediate_size"])
  size = int(hf["hidden_size"] * (hf.get("hidden_ratio") or ratio))
  return 32 * ((size + 31) // 32)


def _rwkv_frame(hf: dict, config: LMConfig) -> list[Entry]:
  out = _fla_frame(hf, config)
  if config.embed_norm:
    out += norm("model.layers.0.pre_norm", ("embed_norm",), bias=True)
  for i in range(config.n_layers):
    p = f"model.layers.{i}"
    out += norm(f"{p}.attn_norm", block(i, "mixer_norm"), bias=True)
    out += norm(f"{p}.ffn_norm", block(i, "mlp_norm"), bias=True)
  return out


def rwkv6_config(hf: dict) -> LMConfig:
  unsupported(hf, "fuse_norm", (True, False, None))
  heads = int(hf["num_heads"])
  options = dict(expand_k=float(hf.get("expand_k", 0.5)),
                 expand_v=float(hf.get("expand_v", 1.0)),
                 mix_low_rank_dim=int(hf.get("proj_low_rank_dim", 32)),
                 decay_low_rank_dim=int(hf.get("gate_low_rank_dim", 64)),
                 norm_eps=float(hf.get("norm_eps", 1e-5)))
  return _rwkv_config(hf, "rwkv6", heads, options, _rwkv_mlp_dim(hf, 3.5))


# fla's x_proj order (r, w, k, v, g) -> the layer's (w, k, v, r, g).
_RWKV6_ORDER = (1, 2, 3, 0, 4)
_RWKV6_INVERSE = tuple(int(i) for i in np.argsort(_RWKV6_ORDER))


def _rwkv6_lerp_entry(a: str, m, d: int, rank: int) -> Entry:
  """``x_proj.{0,2}`` and ``x_bias`` (five LoRAs in fla's order) <->
  ``lerp_down [D, 5R]``, ``lerp_up [5, R, D]``, ``lerp_weights [5, D]``."""
  order, inverse = list(_RWKV6_ORDER), list(_RWKV6_INVERSE)

  def to_ours(down, up, bias):
    down = down.reshape(5, rank, d)[jnp.array(order)]           # [5, R, D]
    up = up.reshape(d, 5, rank).transpose(1, 2, 0)[jnp.array(order)]
    return (down.reshape(5 * rank, d).T, up, bias[jnp.array(order)])

  def to_hf(down, up, weights):
    down = down.T.reshape(5, rank, d)[jnp.array(inverse)]
    up = up[jnp.array(inverse)].transpose(2, 0, 1).reshape(d, 5 * rank)
    return (down.reshape(5 * rank, d), up, weights[jnp.array(inverse)])

  return Entry((f"{a}.x_proj.0.linear.weight", f"{a}.x_proj.2.weight",
                f"{a}.x_bias"),
               (m + ("lerp_down",), m + ("lerp_up",), m + ("lerp_weights",)),
               to_ours, to_hf)


def rwkv6_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _rwkv_frame(hf, config)
  options = config.options_for("rwkv6")
  d, rank = config.d_model, options["mix_low_rank_dim"]
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    f, mlp = f"model.layers.{i}.ffn", block(i, "mlp")
    out += [_rwkv6_lerp_entry(a, m, d, rank),
            copy(f"{a}.x_proj.0.mu", m + ("lerp_base",)),
            copy(f"{a}.bonus", m + ("bonus",)),
            copy(f"{a}.g_norm.weight", m + ("norm", "scale")),
            copy(f"{a}.g_norm.bias", m + ("norm_bias",)),
            copy(f"{a}.w_proj.linear.lora.2.bias", m + ("decay_base",))]
    for name in ("r_proj", "k_proj", "v_proj", "g_proj"):
      out += linear(f"{a}.{name}.linear", m + (name,))
    out += [transpose(f"{a}.w_proj.linear.lora.0.weight",
                      m + ("decay_down",)),
            transpose(f"{a}.w_proj.linear.lora.2.weight", m + ("decay_up",))]
    out += linear(f"{a}.o_proj", m + ("o_proj",))
    out += [copy(f"{f}.key.mu", mlp + ("key_mix",)),
            copy(f"{f}.receptance.mu", mlp + ("receptance_mix",))]
    out += linear(f"{f}.key.linear", mlp + ("key",))
    out += linear(f"{f}.receptance.linear", mlp + ("receptance",))
    out += linear(f"{f}.value", mlp + ("value",))
  return out


def rwkv7_config(hf: dict) -> LMConfig:
  d = int(hf["hidden_size"])
  head_dim = hf.get("head_dim") or d // int(hf["num_heads"])
  heads = d // int(head_dim)
  values = hf.get("value_dim")
  if values is not None and any(int(v) != d for v in (
      values if isinstance(values, list) else [values])):
    raise ValueError(f"config.json has value_dim = {values}; only value_dim "
                     f"= hidden_size = {d} loads")
  norm_eps = float(hf.get("norm_eps", 1e-5))
  options = dict(decay_low_rank_dim=int(hf.get("decay_low_rank_dim", 64)),
                 iclr_low_rank_dim=int(hf.get("a_low_rank_dim", 64)),
                 gate_low_rank_dim=int(hf.get("gate_low_rank_dim", 128)),
                 value_low_rank_dim=int(hf.get("v_low_rank_dim", 16)),
                 value_residual=True, norm_eps=int(head_dim) * norm_eps)
  return _rwkv_config(hf, "rwkv7", heads, options, _rwkv_mlp_dim(hf, 4))


def _lora(prefix: str, m, down: str, up: str, base: str | None):
  out = [transpose(f"{prefix}.lora.0.weight", m + (down,)),
         transpose(f"{prefix}.lora.2.weight", m + (up,))]
  if base is not None:
    out.append(copy(f"{prefix}.lora.2.bias", m + (base,)))
  return out


def rwkv7_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _rwkv_frame(hf, config)
  d = config.d_model
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    f, mlp = f"model.layers.{i}.ffn", block(i, "mlp")
    mix_names = tuple(f"{a}.x_{c}" for c in "rwkvag")
    out += [Entry(mix_names, (m + ("lerp_weights",),),
                  lambda *xs: (jnp.stack([x.reshape(-1) for x in xs]),),
                  lambda w: tuple(w[j].reshape(1, 1, d) for j in range(6))),
            copy(f"{a}.k_k", m + ("key_norm_scale",)),
            copy(f"{a}.k_a", m + ("key_iclr_mix",)),
            copy(f"{a}.r_k", m + ("bonus",)),
            copy(f"{a}.g_norm.weight", m + ("norm", "scale")),
            copy(f"{a}.g_norm.bias", m + ("norm_bias",))]
    for name in ("r_proj", "k_proj", "v_proj", "o_proj"):
      out += linear(f"{a}.{name}", m + (name,))
    out += _lora(f"{a}.w_lora", m, "decay_down", "decay_up", "decay_base")
    out += _lora(f"{a}.a_lora", m, "iclr_down", "iclr_up", "iclr_base")
    out += _lora(f"{a}.g_lora", m, "gate_down", "gate_up", None)
    if i > 0:
      out += _lora(f"{a}.v_lora", m, "value_down", "value_up", "value_base")
    out += [copy(f"{f}.x_k", mlp + ("key_mix",))]
    out += linear(f"{f}.key", mlp + ("key",))
    out += linear(f"{f}.value", mlp + ("value",))
  return out


def stickbreaking_attn_config(hf: dict) -> LMConfig:
  heads = int(hf["num_heads"])
  options = dict(n_kv_heads=int(hf.get("num_kv_heads") or heads),
                 qkv_bias=bool(hf.get("qkv_bias", False)),
                 qk_norm=bool(hf.get("qk_norm", False)),
                 attend_current=bool(hf.get("attend_current", False)),
                 norm_eps=float(hf.get("norm_eps", 1e-6)))
  return _fla_swiglu_config(hf, "stickbreaking_attn", heads, options)


def stickbreaking_attn_entries(hf: dict, config: LMConfig) -> list[Entry]:
  """fla's stick-breaking model: the frame of its Transformer, and per
  layer the q, k, v, o projections and the q/k norms (one ``[head_dim]``
  weight each, as in the layer)."""
  def layer(a, m):
    out = linear(f"{a}.o_proj", m + ("o_proj",))
    if hf.get("qk_norm", False):
      out += norm(f"{a}.q_norm", m + ("q_norm",))
      out += norm(f"{a}.k_norm", m + ("k_norm",))
    return out

  return _fla_attention_entries(hf, config, bool(hf.get("qkv_bias", False)),
                                layer)


def nsa_config(hf: dict) -> LMConfig:
  counts = hf.get("block_counts", 16)
  if isinstance(counts, bool) or not isinstance(counts, int):
    raise ValueError(f"config.json has block_counts = {counts!r}; only an "
                     "int (the same count for every query) can be loaded")
  window = hf.get("window_size", 512)
  options = dict(n_kv_heads=int(hf.get("num_kv_heads") or hf["num_heads"]),
                 head_dim=int(hf.get("head_dim", 32)),
                 qkv_bias=bool(hf.get("qkv_bias", False)),
                 block_size=int(hf.get("block_size", 64)),
                 block_counts=int(counts),
                 window_size=int(window) if window else None,
                 rope_base=float(hf.get("rope_theta", 10000.0)))
  return _fla_swiglu_config(hf, "nsa", int(hf["num_heads"]), options)


def nsa_entries(hf: dict, config: LMConfig) -> list[Entry]:
  return _fla_attention_entries(
      hf, config, bool(hf.get("qkv_bias", False)),
      lambda a, m: (linear(f"{a}.g_proj", m + ("g_proj",))
                    + linear(f"{a}.o_proj", m + ("o_proj",))))


def path_attn_config(hf: dict) -> LMConfig:
  """fla's PaTH attention model: its blocks build the layer with the
  default short convolution (3 taps, no bias), rank-32 ``w`` projection
  and no q/k norms."""
  heads = int(hf["num_heads"])
  options = dict(n_kv_heads=int(hf.get("num_kv_heads") or heads),
                 use_forget_gate=bool(hf.get("use_forget_gate", False)),
                 use_w_shortconv=bool(hf.get("use_w_shortconv", True)),
                 use_low_rank_w=bool(hf.get("use_low_rank_w", True)))
  return _fla_swiglu_config(hf, "path_attn", heads, options)


def path_attn_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for(config.layer_mixers[0])

  def layer(a, m):
    out = linear(f"{a}.o_proj", m + ("o_proj",))
    if options["use_low_rank_w"]:
      out += linear(f"{a}.w_proj.0", m + ("w_down",))
      out += linear(f"{a}.w_proj.1", m + ("w_up",))
    else:
      out += linear(f"{a}.w_proj", m + ("w_proj",))
    if options["use_w_shortconv"]:
      out += [conv(f"{a}.w_conv1d.weight", m + ("w_conv", "weight"))]
    out += linear(f"{a}.bt_proj", m + ("b_proj",), True)
    if options["use_forget_gate"]:
      out += linear(f"{a}.g_proj", m + ("g_proj",), True)
    return out

  return _fla_attention_entries(hf, config, False, layer)


# --- flash-linear-attention: Mamba-3 ---------------------------------------

def mamba3_config(hf: dict) -> LMConfig:
  """fla's ``mamba3`` (SISO or MIMO): no MLP, the mixer alone in each
  block."""
  width = int(hf.get("expand", 2) * hf["hidden_size"])
  head_dim = int(hf.get("head_dim", 64))
  if width % head_dim:
    raise ValueError(f"config.json has expand * hidden_size = {width}, not a "
                     f"multiple of head_dim = {head_dim}")
  eps = float(hf.get("norm_eps", 1e-5))
  options = dict(d_state=int(hf.get("state_size", 128)), head_dim=head_dim,
                 n_groups=int(hf.get("n_groups", 1)),
                 rope_fraction=float(hf.get("rope_fraction", 0.5)),
                 A_floor=float(hf.get("A_floor", 1e-4)),
                 is_outproj_norm=bool(hf.get("is_outproj_norm", False)),
                 bias=bool(hf.get("use_bias", False)), norm_eps=eps,
                 chunk_size=int(hf.get("chunk_size", 64)))
  if hf.get("is_mimo", False):
    options.update(is_mimo=True, mimo_rank=int(hf.get("mimo_rank", 4)))
  return LMConfig(**_common(hf), n_heads=width // head_dim, mixer="mamba3",
                  mixer_options={"mamba3": options}, mlp="none",
                  norm_eps=eps)


def mamba3_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for("mamba3")
  heads, n = config.n_heads, options["d_state"]
  bias = options["bias"]
  out = frame("backbone.embeddings.weight", "backbone.norm_f")
  for i in range(config.n_layers):
    p, m = f"backbone.layers.{i}", block(i, "mixer")
    out += norm(f"{p}.norm", block(i, "mixer_norm"))
    out += linear(f"{p}.mixer.in_proj", m + ("in_proj",), bias)
    if options.get("is_mimo", False):
      out += [copy(f"{p}.mixer.{name}", m + (name,))
              for name in ("B_bias", "C_bias", "mimo_x", "mimo_z", "mimo_o")]
    else:
      out += [copy(f"{p}.mixer.{name}", m + (name,), (heads, 1, n),
                   (heads, n)) for name in ("B_bias", "C_bias")]
    out += [copy(f"{p}.mixer.{name}.weight", m + (name,))
            for name in ("B_norm", "C_norm")]
    out += [copy(f"{p}.mixer.{name}", m + (name,)) for name in ("dt_bias",
                                                                "D")]
    if options["is_outproj_norm"]:
      out += [copy(f"{p}.mixer.norm.weight", m + ("norm", "scale"))]
    out += linear(f"{p}.mixer.out_proj", m + ("out_proj",), bias)
  return out + head(config)


# --- flash-linear-attention: log-linear Mamba-2 ---------------------------

def log_linear_mamba2_config(hf: dict) -> LMConfig:
  """fla's ``log_linear_mamba2`` (a ``Mamba2Config``): its block hands the
  mixer ``num_heads = expand * hidden_size / head_dim`` heads and 15 levels
  (fla's ``MAX_NUM_LEVELS``), and builds its ``GatedMLP`` with
  ``hidden_ratio = 4`` whatever the file says. ``chunk_size`` (fla's kernel
  wants 64), ``fuse_norm`` and the initialisation keys change no output."""
  _fla_checks(hf)
  for key, allowed, why in (
      ("residual_in_fp32", (False, None), "fla's block refuses it"),
      ("hidden_act", ("silu", "swish", None), "the convolution's activation"),
      ("rmsnorm", (True, None), "the gated RMSNorm is always on"),
      ("norm_before_gate", (False, None), "the norm is norm(y * silu(z))"),
      ("D_has_hdim", (False, None), "D is one value per head")):
    unsupported(hf, key, allowed, why)
  limit = tuple(float(v) for v in hf.get("dt_limit", (0.0, math.inf)))
  if limit != (0.0, math.inf):
    raise ValueError(f"config.json has dt_limit = {list(limit)}; only (0.0, "
                     "inf) can be loaded: fla's layer refuses a clamp")
  width = int(hf.get("expand", 2) * hf["hidden_size"])
  head_dim = int(hf.get("head_dim", 64))
  heads = int(hf.get("num_heads") or width // head_dim)
  if heads * head_dim != width:
    raise ValueError(f"config.json has num_heads * head_dim = {heads} * "
                     f"{head_dim} != expand * hidden_size = {width}; only "
                     "checkpoints without an MLP part in the mixer load")
  options = dict(d_state=int(hf.get("state_size", 128)),
                 d_conv=int(hf.get("conv_kernel", 4)),
                 n_groups=int(hf.get("n_groups", 1)), head_dim=head_dim,
                 conv_bias=bool(hf.get("use_conv_bias", True)),
                 bias=bool(hf.get("use_bias", False)),
                 norm_eps=float(hf.get("norm_eps", 1e-5)),
                 dt_min=float(hf.get("dt_min", 1e-3)),
                 dt_max=float(hf.get("dt_max", 1e-1)),
                 dt_init_floor=float(hf.get("dt_init_floor", 1e-4)))
  mlp_dim = int(hf["hidden_size"] * 4 * 2 / 3)
  return LMConfig(**_common(hf), n_heads=heads, mixer="log_linear_mamba2",
                  mixer_options={"log_linear_mamba2": options},
                  mlp_dim=256 * ((mlp_dim + 255) // 256),
                  norm_eps=float(hf.get("norm_eps", 1e-5)))


def log_linear_mamba2_entries(hf: dict, config: LMConfig) -> list[Entry]:
  options = config.options_for("log_linear_mamba2")
  out = frame("backbone.embeddings.weight", "backbone.norm_f")
  for i in range(config.n_layers):
    p, m = f"backbone.layers.{i}", block(i, "mixer")
    out += norm(f"{p}.mixer_norm", block(i, "mixer_norm"))
    out += norm(f"{p}.mlp_norm", block(i, "mlp_norm"))
    out += linear(f"{p}.mixer.in_proj", m + ("in_proj",), options["bias"])
    out += [conv(f"{p}.mixer.conv1d.weight", m + ("conv", "weight"))]
    if options["conv_bias"]:
      out += [copy(f"{p}.mixer.conv1d.bias", m + ("conv", "bias"))]
    out += [copy(f"{p}.mixer.{name}", m + (name,))
            for name in ("dt_bias", "A_log", "D", "L")]
    out += [copy(f"{p}.mixer.norm.weight", m + ("norm", "scale"))]
    out += linear(f"{p}.mixer.out_proj", m + ("out_proj",), options["bias"])
    out += swiglu(f"{p}.mlp", block(i, "mlp"))
  return out + head(config)
def mesa_net_config(hf: dict) -> LMConfig:
  """fla's ``mesa_net``: the model config's defaults where the file leaves
  a key out. fla's layer always has the q and k short convolutions (its
  ``use_short_conv`` is stored, not read) and never a bias on them; it
  decodes from its kernel's diagonal CG start (``decode_cg_start``)."""
  options = dict(head_dim=int(hf.get("head_dim", 128)),
                 use_output_gate=bool(hf.get("use_output_gate", False)),
                 use_short_conv=True, conv_size=int(hf.get("conv_size", 4)),
                 conv_bias=False, norm_eps=float(hf.get("norm_eps", 1e-6)),
                 lambda_lower_bound=float(hf.get("lambda_lower_bound", 0.25)),
                 cg_steps=int(hf.get("max_cg_step_training", 30)),
                 decode_cg_steps=int(hf.get("max_cg_step_decoding", 30)),
                 decode_cg_start="diagonal")
  return _fla_swiglu_config(hf, "mesa_net", int(hf["num_heads"]), options)


def mesa_net_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _fla_frame(hf, config)
  options = config.options_for(config.layer_mixers[0])
  for i in range(config.n_layers):
    a, m = f"model.layers.{i}.attn", block(i, "mixer")
    out += _fla_swiglu_block(i)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      out += linear(f"{a}.{name}", m + (name,))
    for name in ("a_proj", "b_proj"):
      out += linear(f"{a}.{name}", m + (name,), True)
    if options.get("use_output_gate"):
      out += linear(f"{a}.g_proj", m + ("g_proj",))
    out += [copy(f"{a}.lambda_params", m + ("lambda_params",)),
            head_shared(f"{a}.o_norm.weight", m + ("norm", "scale"),
                        config.n_heads)]
    out += [conv(f"{a}.{name}_conv1d.weight",
                 m + ("short_conv", f"{name}_conv", "weight"))
            for name in ("q", "k")]
  return out


# The hybrids with mixture-of-experts MLPs use the helpers above.
from lin_attn_jax.convert import linear_hybrids  # noqa: E402

ARCHITECTURES = {
    "mamba": (mamba_config, mamba_entries),
    "mamba2": (mamba2_config, mamba2_entries),
    "recurrent_gemma": (recurrent_gemma_config, recurrent_gemma_entries),
    "qwen3_next": (linear_hybrids.qwen3_next_config,
                   linear_hybrids.qwen3_next_entries),
    "xlstm": (xlstm_config, xlstm_entries),
    "gla": (gla_config, gla_entries),
    "delta_net": (delta_net_config, delta_net_entries),
    "gated_deltanet": (gated_deltanet_config, gated_deltanet_entries),
    "rwkv6": (rwkv6_config, rwkv6_entries),
    "rwkv7": (rwkv7_config, rwkv7_entries),
    "nsa": (nsa_config, nsa_entries),
    "stickbreaking_attn": (stickbreaking_attn_config,
                           stickbreaking_attn_entries),
    "forgetting_transformer": (forgetting_transformer_config,
                               forgetting_transformer_entries),
    "path_attn": (path_attn_config, path_attn_entries),
    "gated_deltaproduct": (gated_deltaproduct_config,
                           gated_deltaproduct_entries),
    "comba": (comba_config, comba_entries),
    "mamba3": (mamba3_config, mamba3_entries),
    "log_linear_mamba2": (log_linear_mamba2_config,
                          log_linear_mamba2_entries),
    "mesa_net": (mesa_net_config, mesa_net_entries),
    "kimi_linear": (linear_hybrids.kimi_linear_config,
                    linear_hybrids.kimi_linear_entries),
    "minimax": (linear_hybrids.minimax_config, linear_hybrids.minimax_entries),
}
ARCHITECTURES.update(ssm_hybrids.ARCHITECTURES)


def ignored_tensor(name: str) -> bool:
  """Tensors a checkpoint may hold that the LM does not need: a tied
  head's copy of the embedding and rotary buffers."""
  return name == "lm_head.weight" or name.endswith("rotary_emb.inv_freq")
