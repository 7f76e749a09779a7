"""Regenerates tests/fixtures/hybrid_layers/*.npz: the attention layers and
blocks of hybrid checkpoints, run by transformers on fixed inputs.

For each layer: a tiny transformers config, the layer built from it with
every parameter redrawn from ``N(0, 0.3^2)`` (so that zero-initialised
norms and gates are exercised), its float32 output on ``x [B, T, D]``
(positions ``0 .. T - 1``, causal), and its parameters under their
transformers names. tests/layers/test_layers_hybrid.py loads the
parameters into the zoo's mixers and compares the outputs. Needs torch and
transformers (5.x), not the project's dependencies:

  python -m experiments.make_layer_fixtures --out=tests/fixtures/hybrid_layers

The fixtures and what they set:

- ``qwen3_next_attention``: ``Qwen3NextAttention``, 4 query heads of 16 on
  ``D = 32`` (``H K != D``), 2 key/value heads, ``partial_rotary_factor``
  0.25, the output gate and zero-centred q/k norms.
- ``deepseek_v3_mla``: ``DeepseekV3Attention`` with a query LoRA
  (``q_lora_rank`` 12), ``kv_lora_rank`` 10, nope/rope/value widths 8, 4, 6,
  interleaved RoPE.
- ``kimi_mla``: ``KimiLinearAttention`` (no query LoRA, no RoPE).
- ``lfm2_short_conv``: ``Lfm2ShortConv`` with ``conv_L_cache`` 3 and biases.
- ``falcon_h1_parallel``: the mixing half of ``FalconH1DecoderLayer``
  (``m_so mamba(x) + m_ao attn(m_ai x)``, the multipliers and
  ``ssm_multipliers`` not 1, two groups, the gated RMSNorm on).
"""

from __future__ import annotations

import os

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "..",
                                        "tests", "fixtures", "hybrid_layers"),
                    "Directory of the .npz fixtures.")

BATCH, LENGTH, D_MODEL, SEED, STD = 2, 9, 32, 0, 0.3


def _randomised(module, torch):
  """Every parameter of ``module`` redrawn from ``N(0, STD^2)``."""
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(torch.randn_like(p) * STD)
  return module


def _causal_mask(torch):
  """The additive ``[B, 1, T, T]`` causal mask of the eager attention."""
  allowed = torch.tril(torch.ones(LENGTH, LENGTH, dtype=torch.bool))
  mask = torch.zeros(LENGTH, LENGTH).masked_fill(~allowed, float("-inf"))
  return mask[None, None].expand(BATCH, 1, LENGTH, LENGTH)


def _positions(torch):
  return torch.arange(LENGTH)[None].expand(BATCH, LENGTH)


def qwen3_next_attention(torch):
  from transformers.models.qwen3_next import modeling_qwen3_next as m
  config = m.Qwen3NextConfig(
      hidden_size=D_MODEL, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, num_hidden_layers=1, layer_types=["full_attention"],
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.25})
  config._attn_implementation = "eager"
  layer = _randomised(m.Qwen3NextAttention(config, 0), torch).eval()
  rotary = m.Qwen3NextRotaryEmbedding(config)

  def run(x):
    return layer(x, rotary(x, _positions(torch)), _causal_mask(torch))[0]

  return layer, run


def _mla_config(config_cls, **extra):
  return config_cls(
      hidden_size=D_MODEL, num_attention_heads=4, num_key_value_heads=4,
      kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
      num_hidden_layers=1, **extra)


def deepseek_v3_mla(torch):
  from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m
  config = _mla_config(m.DeepseekV3Config, q_lora_rank=12,
                       rope_interleave=True)
  config._attn_implementation = "eager"
  layer = _randomised(m.DeepseekV3Attention(config, 0), torch).eval()
  rotary = m.DeepseekV3RotaryEmbedding(config)

  def run(x):
    return layer(x, rotary(x, _positions(torch)), _causal_mask(torch))[0]

  return layer, run


def kimi_mla(torch):
  from transformers.models.kimi_linear import modeling_kimi_linear as m
  config = _mla_config(m.KimiLinearConfig, q_lora_rank=None,
                       layer_types=["full_attention"])
  config._attn_implementation = "eager"
  layer = _randomised(m.KimiLinearAttention(config, 0), torch).eval()

  def run(x):
    return layer(x, _causal_mask(torch))[0]

  return layer, run


def lfm2_short_conv(torch):
  from transformers.models.lfm2 import modeling_lfm2 as m
  config = m.Lfm2Config(hidden_size=D_MODEL, num_hidden_layers=1,
                        layer_types=["conv"], conv_L_cache=3, conv_bias=True)
  layer = _randomised(m.Lfm2ShortConv(config, 0), torch).eval()
  return layer, layer


def falcon_h1_parallel(torch):
  from transformers.models.falcon_h1 import modeling_falcon_h1 as m
  config = m.FalconH1Config(
      hidden_size=D_MODEL, num_attention_heads=4, num_key_value_heads=2,
      num_hidden_layers=1, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_state=8,
      mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=4,
      mamba_rms_norm=True, mamba_norm_before_gate=True,
      key_multiplier=0.7, attention_in_multiplier=1.3,
      attention_out_multiplier=0.8, ssm_in_multiplier=1.1,
      ssm_out_multiplier=0.9, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.6],
      vocab_size=16)
  config._attn_implementation = "eager"
  model = m.FalconH1Model(config).eval()
  block = _randomised(model.layers[0], torch)
  with torch.no_grad():
    block.mamba.dt_bias.copy_(torch.randn(6) * STD - 1.0)

  def run(x):
    y_ssm = block.mamba(hidden_states=x) * block.ssm_out_multiplier
    y_attn = block.self_attn(
        hidden_states=x * block.attention_in_multiplier,
        position_embeddings=model.rotary_emb(x, _positions(torch)),
        attention_mask=_causal_mask(torch))[0]
    return y_ssm + y_attn * block.attn_out_multiplier

  params = {k: v for k, v in block.named_parameters()
            if k.startswith(("mamba.", "self_attn."))}
  return params, run


FIXTURES = {"qwen3_next_attention": qwen3_next_attention,
            "deepseek_v3_mla": deepseek_v3_mla, "kimi_mla": kimi_mla,
            "lfm2_short_conv": lfm2_short_conv,
            "falcon_h1_parallel": falcon_h1_parallel}


def main(argv):
  del argv
  import torch
  os.makedirs(FLAGS.out, exist_ok=True)
  for name, make in FIXTURES.items():
    torch.manual_seed(SEED)
    module, run = make(torch)
    params = (module if isinstance(module, dict)
              else dict(module.named_parameters()))
    x = torch.randn(BATCH, LENGTH, D_MODEL)
    with torch.no_grad():
      y = run(x)
    arrays = {f"param/{k}": v.detach().numpy() for k, v in params.items()}
    np.savez(os.path.join(FLAGS.out, f"{name}.npz"), x=x.numpy(),
             y=y.detach().numpy(), **arrays)
    print(name, tuple(y.shape), sorted(params))


if __name__ == "__main__":
  app.run(main)
