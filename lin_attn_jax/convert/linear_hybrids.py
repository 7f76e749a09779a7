"""transformers' hybrid models with mixture-of-experts MLPs: Qwen3-Next
(every layer), Kimi Linear and MiniMax.

Each model type gives ``<type>_config(hf) -> LMConfig`` and
``<type>_entries(hf, config) -> [Entry]`` as in ``architectures.py``. The
tensor names are those ``save_pretrained`` writes (transformers 5 maps its
fused expert tensors back to one tensor per expert):

- ``qwen3_next``: Gated DeltaNet (``linear_attention``) and gated softmax
  attention (``full_attention``) layers, dense MLPs in ``mlp_only_layers``
  (or with ``num_experts = 0``), mixture-of-experts MLPs elsewhere (a
  softmax router and a shared expert with a sigmoid gate); norms scale by
  ``1 + w``.
- ``kimi_linear``: KDA and MLA layers (MLA without RoPE), dense MLPs in the
  first layers (``mlp_layer_types`` / ``first_k_dense_replace``) and
  mixture-of-experts MLPs (a sigmoid router with a selection bias, grouped
  choice, a routed scale and shared experts), all under
  ``block_sparse_moe``.
- ``minimax``: lightning attention (``linear_attention``) and softmax
  attention (``full_attention``), mixture-of-experts MLPs (softmax router,
  top-k renormalised), and MiniMax's blocks ``x <- alpha norm(x) + beta
  f(norm(x))`` (``residual_from_norm``; the factors per layer kind).
  Lightning layers store their decay tables as buffers (``slope_rate``,
  ``query_decay``, ``key_decay``, ``diagonal_decay``): the LM derives them
  from the config; their shapes are checked and an export writes them.

Options the LM cannot reproduce raise ``ValueError`` naming them.
"""

from __future__ import annotations

import numpy as np

from lin_attn_jax.convert import architectures as arch
from lin_attn_jax.convert.common import (block, frame, head, norm,
                                         per_expert, rope, swiglu,
                                         unsupported)
from lin_attn_jax.convert.core import (Entry, constant, conv, copy,
                                       head_shared, linear, transpose)
from lin_attn_jax.layers.lightning import lightning_slopes
from lin_attn_jax.models.lm import LMConfig

LINEAR, FULL = "linear_attention", "full_attention"


def _layer_kinds(hf: dict, kinds: list, allowed=(LINEAR, FULL)) -> list:
  n = int(hf["num_hidden_layers"])
  if len(kinds) != n or any(kind not in allowed for kind in kinds):
    raise ValueError(f"config.json has layer_types = {kinds}; each of the "
                     f"num_hidden_layers = {n} layers must be one of "
                     f"{list(allowed)}")
  return list(kinds)


def _rope(hf: dict, partial_default: float = 1.0) -> tuple[float, float]:
  """``common.rope``, with the older ``rope_scaling`` key refused too."""
  theta, fraction = rope(hf, partial_default)
  unsupported(hf, "rope_scaling", (None,), "scaled RoPE is not implemented")
  return theta, fraction


def _moe_entries(p: str, mlp, n_experts: int, expert_names: dict,
                 shared: str | None, shared_gate: str | None = None,
                 bias: str | None = None) -> list[Entry]:
  """A mixture-of-experts MLP under ``p``: the router ``{p}.gate.weight``,
  the experts (``expert_names``: ours -> the name of expert ``e``'s weight
  under ``{p}.experts.{e}``), the shared expert's ``gate_proj``,
  ``up_proj`` and ``down_proj`` under ``{p}.{shared}``, its gate and the
  router's selection bias."""
  out = [transpose(f"{p}.gate.weight", mlp + ("router",))]
  out += per_expert(p, mlp, n_experts, expert_names)
  if shared is not None:
    out += swiglu(f"{p}.{shared}", mlp + ("shared",))
  if shared_gate is not None:
    out += linear(f"{p}.{shared_gate}", mlp + ("shared_gate",))
  if bias is not None:
    out.append(copy(f"{p}.gate.{bias}", mlp + ("selection_bias",)))
  return out


def _frame(offset: bool = False) -> list[Entry]:
  return frame("model.embed_tokens.weight", "model.norm", offset=offset)


def _norms(p: str, i: int, offset: bool = False) -> list[Entry]:
  """Layer ``p``'s ``input_layernorm`` and ``post_attention_layernorm``
  <-> block ``i``'s mixer and MLP norms."""
  return (norm(f"{p}.input_layernorm", block(i, "mixer_norm"), offset)
          + norm(f"{p}.post_attention_layernorm", block(i, "mlp_norm"),
                 offset))


# --- Qwen3-Next --------------------------------------------------------------

def _qwen3_next_kinds(hf: dict) -> list:
  n = int(hf["num_hidden_layers"])
  kinds = hf.get("layer_types")
  if kinds is None:
    interval = int(hf.get("full_attention_interval", 4))
    kinds = [LINEAR if (i + 1) % interval else FULL for i in range(n)]
  return _layer_kinds(hf, kinds)


def _qwen3_next_sparse(hf: dict) -> list[bool]:
  """Whether each layer's MLP is a mixture of experts (transformers'
  rule)."""
  dense = set(hf.get("mlp_only_layers") or [])
  experts = int(hf.get("num_experts") or 0)
  step = int(hf.get("decoder_sparse_step") or 1)
  return [i not in dense and experts > 0 and (i + 1) % step == 0
          for i in range(int(hf["num_hidden_layers"]))]


def qwen3_next_config(hf: dict) -> LMConfig:
  """transformers' ``qwen3_next``: every layer kind (see the module
  docstring). The router's training-time options (``router_aux_loss_coef``,
  ``output_router_logits``) change no output."""
  unsupported(hf, "hidden_act", ("silu",))
  kinds = _qwen3_next_kinds(hf)
  sparse = _qwen3_next_sparse(hf)
  d, eps = int(hf["hidden_size"]), float(hf.get("rms_norm_eps", 1e-6))
  nk, nv = int(hf["linear_num_key_heads"]), int(hf["linear_num_value_heads"])
  heads = int(hf.get("num_attention_heads", 16))
  attention = FULL in kinds
  options = {}
  if LINEAR in kinds:
    options["gated_deltanet"] = dict(
        n_v_heads=nv, head_k_dim=int(hf["linear_key_head_dim"]),
        head_v_dim=int(hf["linear_value_head_dim"]),
        conv_size=int(hf.get("linear_conv_kernel_dim", 4)),
        use_output_gate=True, norm_eps=eps,
        **({"n_heads": nk} if attention else {}))
  if attention:
    theta, fraction = _rope(hf, partial_default=0.25)
    bias = bool(hf.get("attention_bias", False))
    options["gated_attn"] = dict(
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or d // heads), rope_base=theta,
        rope_fraction=fraction, qk_norm_eps=eps, qkv_bias=bias,
        out_bias=bias)
  moe = {}
  if any(sparse):
    shared = int(hf.get("shared_expert_intermediate_size") or 0)
    if shared <= 0:
      raise ValueError(f"config.json has shared_expert_intermediate_size = "
                       f"{shared}; Qwen3-Next's experts always have a shared "
                       "expert")
    moe = dict(n_experts=int(hf["num_experts"]),
               top_k=int(hf["num_experts_per_tok"]),
               expert_dim=int(hf["moe_intermediate_size"]), score="softmax",
               normalize_topk=bool(hf.get("norm_topk_prob", True)),
               shared_dim=shared, shared_gate=True)
  return LMConfig(
      **arch._common(hf), n_heads=heads if attention else nk,
      mixer=tuple("gated_deltanet" if k == LINEAR else "gated_attn"
                  for k in kinds),
      mixer_options=options,
      mlp=tuple("moe" if s else "swiglu" for s in sparse),
      moe_options=moe, mlp_dim=int(hf["intermediate_size"]), norm_eps=eps)


def qwen3_next_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _frame(offset=True)
  kinds, sparse = _qwen3_next_kinds(hf), _qwen3_next_sparse(hf)
  bias = bool(hf.get("attention_bias", False))
  for i in range(config.n_layers):
    p, m, mlp = f"model.layers.{i}", block(i, "mixer"), block(i, "mlp")
    out += _norms(p, i, offset=True)
    if sparse[i]:
      out += _moe_entries(f"{p}.mlp", mlp, int(hf["num_experts"]),
                          {"gate": "gate_proj", "up": "up_proj",
                           "down": "down_proj"}, "shared_expert",
                          "shared_expert_gate")
    else:
      out += swiglu(f"{p}.mlp", mlp)
    if kinds[i] == LINEAR:
      out += _gdn_entries(hf, f"{p}.linear_attn", m)
      continue
    a = f"{p}.self_attn"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      out += linear(f"{a}.{name}", m + (name,), bias)
    out += [copy(f"{a}.q_norm.weight", m + ("q_norm", "scale")),
            copy(f"{a}.k_norm.weight", m + ("k_norm", "scale"))]
  return out + head(config)


def _gdn_entries(hf: dict, a: str, m) -> list[Entry]:
  """Qwen3-Next's Gated DeltaNet layer ``a`` <-> the ``gated_deltanet``
  mixer ``m`` (fused projections split per key head)."""
  nk, nv = int(hf["linear_num_key_heads"]), int(hf["linear_num_value_heads"])
  hk, hv = int(hf["linear_key_head_dim"]), int(hf["linear_value_head_dim"])
  out = [arch._qkvz_entry(f"{a}.in_proj_qkvz.weight", m, nk, nv, hk, hv),
         arch._ba_entry(f"{a}.in_proj_ba.weight", m, nk, nv),
         arch._split_conv_entry(f"{a}.conv1d.weight",
                                [m + ("short_conv", c)
                                 for c in ("q_conv", "k_conv", "v_conv")],
                                (nk * hk, nk * hk, nv * hv)),
         copy(f"{a}.dt_bias", m + ("dt_bias",)),
         copy(f"{a}.A_log", m + ("A_log",)),
         head_shared(f"{a}.norm.weight", m + ("norm", "scale"), nv)]
  return out + linear(f"{a}.out_proj", m + ("o_proj",))


# --- Kimi Linear ----------------------------------------------------------

def _kimi(hf: dict, name: str, default, *aliases):
  """``hf[name]`` under its saved name or an alias (transformers'
  ``attribute_map``), else ``default``."""
  for key in (name,) + aliases:
    if hf.get(key) is not None:
      return hf[key]
  return default


def _kimi_linear_attn(hf: dict) -> dict:
  """The KDA settings: the top-level keys transformers saves, or the
  checkpoint's ``linear_attn_config``."""
  sub = dict(hf.get("linear_attn_config") or {})
  return dict(head_dim=int(sub.get("head_dim", hf.get("linear_head_dim",
                                                       128))),
              num_heads=int(sub.get("num_heads", hf.get("linear_num_heads",
                                                        32))),
              conv=int(sub.get("short_conv_kernel_size",
                               hf.get("linear_conv_kernel_dim", 4))))


def _kimi_kinds(hf: dict) -> tuple[list, list]:
  """``(layer kinds, MLP kinds)`` as transformers' ``KimiLinearConfig``
  derives them."""
  n = int(hf["num_hidden_layers"])
  kinds = hf.get("layer_types")
  sub = dict(hf.get("linear_attn_config") or {})
  if kinds is None and "full_attn_layers" in sub and "kda_layers" in sub:
    kinds = [None] * n
    for layer in sub["full_attn_layers"]:
      kinds[layer - 1] = FULL
    for layer in sub["kda_layers"]:
      kinds[layer - 1] = LINEAR
  elif kinds is None:
    kinds = [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
  mlps = hf.get("mlp_layer_types")
  if mlps is None:
    first = int(hf.get("first_k_dense_replace", 1))
    mlps = ["dense" if i < first else "sparse" for i in range(n)]
  if len(mlps) != n or any(k not in ("dense", "sparse") for k in mlps):
    raise ValueError(f"config.json has mlp_layer_types = {mlps}; each of "
                     f"the {n} layers must be 'dense' or 'sparse'")
  return _layer_kinds(hf, kinds), list(mlps)


def kimi_linear_config(hf: dict) -> LMConfig:
  """transformers' ``kimi_linear`` (see the module docstring). Its MLA
  layers have no RoPE (``qk_rope_head_dim`` channels stay unrotated) and
  their latent norms transformers' default epsilon 1e-6; its KDA gate's
  up-projection has no bias."""
  unsupported(hf, "hidden_act", ("silu",))
  kinds, mlps = _kimi_kinds(hf)
  heads = int(hf.get("num_attention_heads", 32))
  kv_heads = int(hf.get("num_key_value_heads") or heads)
  if kv_heads != heads:
    raise ValueError(f"config.json has num_key_value_heads = {kv_heads} != "
                     f"num_attention_heads = {heads}; transformers' MLA "
                     "expands its latent to every head")
  eps = float(hf.get("rms_norm_eps", 1e-5))
  kda = _kimi_linear_attn(hf)
  options = {}
  if LINEAR in kinds:
    options["kda"] = dict(n_heads=kda["num_heads"], head_k_dim=kda["head_dim"],
                          head_v_dim=kda["head_dim"], conv_size=kda["conv"],
                          use_short_conv=True, conv_bias=False,
                          gate_bias=False, norm_eps=eps)
  if FULL in kinds:
    q_rank = hf.get("q_lora_rank")
    options["mla"] = dict(
        q_lora_rank=None if q_rank is None else int(q_rank),
        kv_lora_rank=int(hf.get("kv_lora_rank", 512)),
        qk_nope_head_dim=int(hf.get("qk_nope_head_dim", 128)),
        qk_rope_head_dim=int(hf.get("qk_rope_head_dim", 64)),
        v_head_dim=int(hf.get("v_head_dim") or 128), use_rope=False,
        attention_bias=bool(hf.get("attention_bias", False)), norm_eps=1e-6)
  moe = {}
  if "sparse" in mlps:
    shared = int(_kimi(hf, "num_shared_experts", 1, "n_shared_experts"))
    expert_dim = int(hf.get("moe_intermediate_size", 1024))
    moe = dict(
        n_experts=int(_kimi(hf, "num_experts", 256, "num_local_experts")),
        top_k=int(_kimi(hf, "num_experts_per_token", 8,
                        "num_experts_per_tok")),
        expert_dim=expert_dim, score="sigmoid", selection_bias=True,
        n_groups=int(_kimi(hf, "num_expert_group", 1, "n_group")),
        topk_groups=int(_kimi(hf, "topk_group", 1)),
        normalize_topk=bool(_kimi(hf, "moe_renormalize", True,
                                  "norm_topk_prob")),
        routed_scale=float(hf.get("routed_scaling_factor", 2.446)),
        shared_dim=expert_dim * shared)
  return LMConfig(
      **arch._common(hf), n_heads=heads,
      mixer=tuple("kda" if k == LINEAR else "mla" for k in kinds),
      mixer_options=options,
      mlp=tuple("moe" if k == "sparse" else "swiglu" for k in mlps),
      moe_options=moe, mlp_dim=int(hf.get("intermediate_size", 9216)),
      norm_eps=eps)


def kimi_linear_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _frame()
  kinds, mlps = _kimi_kinds(hf)
  heads = _kimi_linear_attn(hf)["num_heads"]
  bias = bool(hf.get("attention_bias", False))
  moe = dict(config.moe_options)
  for i in range(config.n_layers):
    p, m, mlp = f"model.layers.{i}", block(i, "mixer"), block(i, "mlp")
    out += _norms(p, i)
    if mlps[i] == "sparse":
      out += _moe_entries(f"{p}.block_sparse_moe", mlp, moe["n_experts"],
                          {"gate": "w1", "up": "w3", "down": "w2"},
                          "shared_experts", bias="e_score_correction_bias")
    else:
      out += swiglu(f"{p}.block_sparse_moe", mlp)
    a = f"{p}.self_attn"
    if kinds[i] == LINEAR:
      for name in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj"):
        out += linear(f"{a}.{name}", m + (name,))
      for hf_name, ours in (("f_a_proj", "f_down"), ("f_b_proj", "f_up"),
                            ("g_a_proj", "g_down"), ("g_b_proj", "g_up")):
        out += linear(f"{a}.{hf_name}", m + (ours,))
      out += [conv(f"{a}.{c}_conv1d.weight",
                   m + ("short_conv", f"{c}_conv", "weight")) for c in "qkv"]
      out += [copy(f"{a}.A_log", m + ("A_log",), (1, 1, heads, 1), (heads,)),
              copy(f"{a}.dt_bias", m + ("dt_bias",)),
              head_shared(f"{a}.o_norm.weight", m + ("norm", "scale"),
                          heads)]
      continue
    if hf.get("q_lora_rank") is None:
      out += linear(f"{a}.q_proj", m + ("q_proj",))
    else:
      out += linear(f"{a}.q_a_proj", m + ("q_a_proj",), bias)
      out += [copy(f"{a}.q_a_layernorm.weight", m + ("q_a_norm", "scale"))]
      out += linear(f"{a}.q_b_proj", m + ("q_b_proj",))
    out += linear(f"{a}.kv_a_proj_with_mqa", m + ("kv_a_proj",), bias)
    out += [copy(f"{a}.kv_a_layernorm.weight", m + ("kv_a_norm", "scale"))]
    out += linear(f"{a}.kv_b_proj", m + ("kv_b_proj",))
    out += linear(f"{a}.o_proj", m + ("o_proj",), bias)
  return out + head(config)


# --- MiniMax --------------------------------------------------------------

def _minimax_kinds(hf: dict) -> list:
  """``layer_types``, or the original checkpoints' ``attn_type_list`` (0
  lightning, 1 softmax), or transformers' default (softmax in the even
  layers)."""
  n = int(hf["num_hidden_layers"])
  kinds = hf.get("layer_types")
  if kinds is None and hf.get("attn_type_list") is not None:
    kinds = [FULL if t == 1 else LINEAR if t == 0 else t
             for t in hf["attn_type_list"]]
  if kinds is None:
    kinds = [FULL if (i + 1) % 2 else LINEAR for i in range(n)]
  return _layer_kinds(hf, kinds)


def minimax_config(hf: dict) -> LMConfig:
  """transformers' ``minimax`` (see the module docstring). ``block_size``
  (the reference's chunk length) changes no output; the router's
  ``router_jitter_noise`` acts in training only and is not implemented."""
  unsupported(hf, "hidden_act", ("silu",))
  unsupported(hf, "sliding_window", (None,),
              "the softmax layers attend to every token")
  kinds = _minimax_kinds(hf)
  d, heads = int(hf["hidden_size"]), int(hf.get("num_attention_heads", 32))
  head_dim = int(hf.get("head_dim") or d // heads)
  options = {}
  if LINEAR in kinds:
    options["lightning_attn"] = dict(head_dim=head_dim)
  if FULL in kinds:
    theta, _ = _rope(hf)
    options["softmax_attn"] = dict(
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim, rope_base=theta)

  def factor(name):
    return float(hf.get(name, 1.0))

  alpha = {LINEAR: factor("linear_attn_alpha_factor"),
           FULL: factor("full_attn_alpha_factor")}
  beta = {LINEAR: factor("linear_attn_beta_factor"),
          FULL: factor("full_attn_beta_factor")}
  multipliers = {"mixer_residual": tuple(alpha[k] for k in kinds),
                 "mixer_out": tuple(beta[k] for k in kinds),
                 "mlp_residual": factor("mlp_alpha_factor"),
                 "mlp_out": factor("mlp_beta_factor")}
  moe = dict(n_experts=int(_kimi(hf, "num_local_experts", 8, "num_experts")),
             top_k=int(hf.get("num_experts_per_tok", 2)),
             expert_dim=int(hf.get("intermediate_size", 14336)),
             score="softmax", normalize_topk=True)
  return LMConfig(
      **arch._common(hf), n_heads=heads,
      mixer=tuple("lightning_attn" if k == LINEAR else "softmax_attn"
                  for k in kinds),
      mixer_options=options, mlp="moe", moe_options=moe,
      multipliers=multipliers, residual_from_norm=True,
      norm_eps=float(hf.get("rms_norm_eps", 1e-5)))


def minimax_decay_buffers(hf: dict, layer: int) -> dict[str, np.ndarray]:
  """The decay tables transformers' ``MiniMaxLightningAttention`` keeps as
  buffers for layer ``layer`` (float32, as transformers computes them)."""
  heads = int(hf.get("num_attention_heads", 32))
  size = int(hf.get("block_size", 256))
  slope = lightning_slopes(heads, layer, int(hf["num_hidden_layers"]))
  slope = slope[:, None, None]                                  # [H, 1, 1]
  steps = np.arange(1, size + 1, dtype=np.float32)[:, None]     # [S, 1]
  gaps = steps - steps.T                                        # [S, S]
  diagonal = slope * gaps[None]                                 # [H, S, S]
  diagonal = np.exp(np.where(diagonal >= 0, -diagonal, -np.inf))
  return {"slope_rate": slope,
          "query_decay": np.exp(-slope * steps),
          "key_decay": np.exp(-slope * (size - steps)),
          "diagonal_decay": diagonal[None].astype(np.float32)}


def minimax_entries(hf: dict, config: LMConfig) -> list[Entry]:
  out = _frame()
  kinds = _minimax_kinds(hf)
  n_experts = dict(config.moe_options)["n_experts"]
  for i in range(config.n_layers):
    p, m, mlp = f"model.layers.{i}", block(i, "mixer"), block(i, "mlp")
    out += _norms(p, i)
    out += _moe_entries(f"{p}.block_sparse_moe", mlp, n_experts,
                        {"gate": "w1", "up": "w3", "down": "w2"}, None)
    a = f"{p}.self_attn"
    if kinds[i] == FULL:
      for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out += linear(f"{a}.{name}", m + (name,))
      continue
    for name in ("qkv_proj", "output_gate", "out_proj"):
      out += linear(f"{a}.{name}", m + (name,))
    out += [copy(f"{a}.norm.weight", m + ("norm", "scale"))]
    out += [constant(f"{a}.{name}", value)
            for name, value in minimax_decay_buffers(hf, i).items()]
  return out + head(config)
