"""Regenerates the checkpoint fixtures of tests/convert/test_convert.py.

For every supported architecture: a tiny randomly initialised model of the
reference implementation (transformers, or flash-linear-attention), saved
with ``save_pretrained`` (safetensors), plus its float32 logits on fixed
tokens, for one full forward pass and for a prefill followed by token-by-
token decoding with the reference's own cache. Needs the ``hf`` extra
(CPU torch, transformers, safetensors, flash-linear-attention):

  pip install -e '.[hf]'
  python -m experiments.make_hf_fixtures --out=tests/fixtures/hf

Every fixture also gets a ``tokenizer.json``: a byte-level BPE of at most
``VOCAB`` ids (40 most frequent byte symbols, the rest ``<unk>``) trained
with ``tokenizers`` on the standard library's source; its special ids come
from the fixture's ``config.json``. ``--tokenizer_only`` writes only these
(no torch needed):

  python -m experiments.make_hf_fixtures --tokenizer_only

(so an environment with torch but without the project's dependencies runs
``--notokenizer --only=NAME`` and then ``--tokenizer_only --only=NAME``
with them). transformers' xLSTM runs its native torch kernels in float32.

flash-linear-attention's models run their Triton kernels, which need a GPU;
on CPU the script swaps each kernel the models call (norms, short
convolutions, token shift, the recurrences, rotary embeddings, native
sparse attention, PaTH's attention, decoding step and L2 norm) for a
plain torch version of the same computation (``fla_cpu_reference``;
PaTH's attention is fla's own ``naive_path_attn``, log-linear Mamba-2's
layer runs fla's ``naive_log_linear_attn`` without a cache). transformers'
models run as they are.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "..",
                                        "tests", "fixtures", "hf"),
                    "Directory of the fixtures (one folder per model).")
flags.DEFINE_list("only", [], "Make only these fixtures (names as in "
                  "FIXTURES).")
flags.DEFINE_bool("tokenizer_only", False, "Write only the tokenizer.json of "
                  "the fixtures (needs tokenizers, not torch).")
flags.DEFINE_bool("tokenizer", True, "Also write the tokenizer.json of each "
                  "fixture (needs the project's dependencies; without them, "
                  "pass --notokenizer and run --tokenizer_only afterwards).")

BATCH, LENGTH, PREFILL, VOCAB = 2, 12, 5, 64
SEED = 0
# Byte symbols the fixtures' BPE keeps; merges fill the rest of VOCAB.
TOKENIZER_ALPHABET = 40


def write_tokenizer(path: str, vocab_size: int = VOCAB) -> None:
  """Writes ``path/tokenizer.json``: a BPE of at most ``vocab_size`` ids
  trained on the standard library's held-out source files."""
  from lin_attn_jax.data import stdlib_corpus, train_bpe
  corpus = stdlib_corpus("heldout")
  texts = [bytes(corpus.document(i)).decode("utf-8", "replace")
           for i in range(corpus.num_documents)]
  tokenizer = train_bpe(texts, vocab_size, limit_alphabet=TOKENIZER_ALPHABET)
  tokenizer.save(path, special_tokens=False)


def fla_cpu_reference():
  """Replaces the Triton entry points fla's models call with torch code."""
  import torch
  import torch.nn.functional as F
  import fla.layers.comba as fla_comba
  import fla.layers.delta_net as fla_delta_net
  import fla.layers.forgetting_attn as fla_forgetting
  import fla.layers.gated_deltanet as fla_gdn
  import fla.layers.gated_deltaproduct as fla_gdp
  import fla.layers.gla as fla_gla
  import fla.layers.log_linear_mamba2 as fla_log_linear_mamba2
  import fla.layers.mesa_net as fla_mesa_net
  import fla.layers.nsa as fla_nsa
  import fla.layers.path_attn as fla_path_attn
  import fla.layers.rwkv6 as fla_rwkv6
  import fla.layers.rwkv7 as fla_rwkv7
  import fla.layers.stickbreaking_attn as fla_stickbreaking
  import fla.models.rwkv6.modeling_rwkv6 as fla_rwkv6_model
  import fla.models.rwkv7.modeling_rwkv7 as fla_rwkv7_model
  import fla.modules as fla_modules
  import fla.modules.rotary.ops as fla_rotary
  from fla.ops.forgetting_attn.naive import naive_forgetting_attn
  from fla.ops.gated_delta_product.naive import (
      naive_recurrent_gated_delta_product)
  from fla.ops.log_linear_attn.naive import naive_log_linear_attn
  from fla.ops.mesa_net.naive import (naive_mesa_net_CG,
                                      naive_mesa_net_decoding_one_step)
  from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
  from fla.ops.rwkv7.fused_k_update import k_update_ref
  from fla.ops.path_attn.naive import naive_path_attn
  from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref
  from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn
  from experiments.fla_nsa_reference import parallel_nsa_on_cpu

  def prenorm(norm):
    def forward(self, x, residual=None, prenorm=False,
                residual_in_fp32=False, **kwargs):
      if residual is not None:
        x = x + residual
      y = norm(self, x)
      return (y, x) if prenorm else y
    return forward

  def rms(self, x):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
    return (y * self.weight.float() if self.weight is not None else y).to(
        x.dtype)

  def layer(self, x):
    y = F.layer_norm(x.float(), (x.shape[-1],), None, None, self.eps)
    if self.weight is not None:
      y = y * self.weight.float()
    if self.bias is not None:
      y = y + self.bias.float()
    return y.to(x.dtype)

  def group(self, x):
    shape = x.shape
    xf = x.float().reshape(*shape[:-1], self.num_groups, -1)
    if getattr(self, "is_rms_norm", False):
      y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
    else:
      y = F.layer_norm(xf, (xf.shape[-1],), None, None, self.eps)
    y = y.reshape(shape)
    if self.weight is not None:
      y = y * self.weight.float()
    if self.bias is not None:
      y = y + self.bias.float()
    return y.to(x.dtype)

  from fla.modules.activations import ops as fla_activations
  fla_activations.ACT2FN.update(
      sigmoid=torch.sigmoid, silu=F.silu, swish=F.silu,
      sqrelu=lambda x: torch.square(F.relu(x)))
  fla_modules.RMSNorm.forward = prenorm(rms)
  fla_modules.LayerNorm.forward = prenorm(layer)
  fla_modules.GroupNorm.forward = prenorm(group)

  def gated(self, x, g, residual=None, prenorm=False, residual_in_fp32=False,
            **kwargs):
    y = rms(self, x).float()
    act = getattr(self, "activation", "swish")
    gate = torch.sigmoid(g.float()) if act == "sigmoid" else F.silu(g.float())
    return (y * gate).to(x.dtype)

  fla_modules.FusedRMSNormGated.forward = gated

  def short_conv(self, x, residual=None, cache=None, output_final_state=False,
                 cu_seqlens=None, **kwargs):
    # cache: the last W - 1 inputs, [B, W - 1, D]; with cu_seqlens, x is
    # [1, total, D] and each sequence is convolved (and cached) alone.
    if cu_seqlens is not None:
      outs = [short_conv(self, x[:, a:b], output_final_state=True)
              for a, b in zip(cu_seqlens[:-1].tolist(),
                              cu_seqlens[1:].tolist())]
      y = torch.cat([o for o, _ in outs], dim=1)
      states = torch.cat([c for _, c in outs], dim=0)
      return y, (states if output_final_state else None)
    width = self.weight.shape[-1]
    past = (x.new_zeros(x.shape[0], width - 1, x.shape[-1]) if cache is None
            else cache)
    full = torch.cat([past, x], dim=1)                          # [B, W-1+T, D]
    weight = self.weight[:, 0, :]                               # [D, W]
    y = sum(full[:, j:j + x.shape[1]] * weight[:, j]
            for j in range(width))
    if self.bias is not None:
      y = y + self.bias
    if self.activation in ("silu", "swish"):
      y = F.silu(y)
    new_cache = full[:, -(width - 1):] if output_final_state else None
    return y, new_cache

  fla_modules.ShortConvolution.forward = short_conv
  fla_gdn.GatedDeltaNet._use_fused_qkv_conv = lambda self, *a, **kw: False

  def mlp(self, x, **kwargs):
    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

  fla_modules.GatedMLP.forward = mlp

  def token_shift(x, cu_seqlens=None, cache=None, output_cache=False,
                  **kwargs):
    past = (x.new_zeros(x.shape[0], 1, x.shape[-1]) if cache is None
            else cache.reshape(x.shape[0], 1, x.shape[-1]))
    shifted = torch.cat([past, x[:, :-1]], dim=1)
    delta = shifted - x
    return (delta, x[:, -1:]) if output_cache else delta

  for module in (fla_rwkv6, fla_rwkv7, fla_rwkv6_model, fla_rwkv7_model):
    module.token_shift = token_shift

  def state_of(initial_state, shape, dtype):
    return (torch.zeros(shape, dtype=dtype) if initial_state is None
            else initial_state.float())

  def l2(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

  def recurrent_gla(q, k, v, gk=None, g=None, scale=None, initial_state=None,
                    output_final_state=False, **kwargs):
    gk = g if gk is None else gk
    b, t, h, dk = q.shape
    scale = dk ** -0.5 if scale is None else scale
    s = state_of(initial_state, (b, h, dk, v.shape[-1]), torch.float32)
    out = []
    for i in range(t):
      s = s * gk[:, i].float().exp()[..., None] + (
          k[:, i].float()[..., None] * v[:, i].float()[..., None, :])
      out.append(torch.einsum("bhk,bhkv->bhv", q[:, i].float() * scale, s))
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)

  fla_gla.chunk_gla = fla_gla.fused_recurrent_gla = recurrent_gla
  fla_gla.fused_chunk_gla = recurrent_gla

  def recurrent_delta(q, k, v, beta, g=None, scale=None, initial_state=None,
                      output_final_state=False, use_qk_l2norm_in_kernel=False,
                      use_gate_in_kernel=False, A_log=None, dt_bias=None,
                      use_beta_sigmoid_in_kernel=False,
                      allow_neg_eigval=False, **kwargs):
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    q, k = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
      q, k = l2(q), l2(k)
    if hv != h:
      q = q.repeat_interleave(hv // h, dim=2)
      k = k.repeat_interleave(hv // h, dim=2)
    beta = beta.float()
    if use_beta_sigmoid_in_kernel:
      beta = beta.sigmoid()
      if allow_neg_eigval:
        beta = beta * 2
    if g is not None:
      g = g.float()
      if use_gate_in_kernel:
        g = -A_log.float().exp() * F.softplus(g + dt_bias.float())
    scale = dk ** -0.5 if scale is None else scale
    s = state_of(initial_state, (b, hv, dk, dv), torch.float32)
    out = []
    for i in range(t):
      if g is not None:
        s = s * g[:, i].exp()[..., None, None]
      k_i, b_i = k[:, i], beta[:, i][..., None]
      error = v[:, i].float() - torch.einsum("bhk,bhkv->bhv", k_i, s)
      s = s + k_i[..., None] * (b_i * error)[..., None, :]
      out.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, s))
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)

  fla_delta_net.chunk_delta_rule = recurrent_delta
  fla_delta_net.fused_recurrent_delta_rule = recurrent_delta
  fla_gdn.chunk_gated_delta_rule = recurrent_delta
  fla_gdn.fused_recurrent_gated_delta_rule = recurrent_delta

  def delta_product(q, k, v, g, beta, num_householder, scale=None,
                    initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    # k, v, beta: [B, T N, ...], the N steps of token t at t N + j.
    assert cu_seqlens is None
    if use_qk_l2norm_in_kernel:
      q, k = l2(q.float()), l2(k.float())
    o, s = naive_recurrent_gated_delta_product(
        q, k, v, g, beta, scale=q.shape[-1] ** -0.5 if scale is None
        else scale, initial_state=initial_state,
        output_final_state=output_final_state,
        num_householder=num_householder)
    return o.to(v.dtype), (s if output_final_state else None)

  fla_gdp.chunk_gated_delta_product = delta_product
  fla_gdp.fused_recurrent_gated_delta_rule = recurrent_delta

  def recurrent_comba(q, k, v, p, g, beta, scale=None, initial_state=None,
                      output_final_state=False, use_qk_l2norm_in_kernel=False,
                      cu_seqlens=None, **kwargs):
    # fla's Comba kernels: the state is read along p before the decay,
    # S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - S_{t-1}^T p_t)^T.
    assert cu_seqlens is None
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    q, k, p = q.float(), k.float(), p.float()
    if use_qk_l2norm_in_kernel:
      q, k, p = l2(q), l2(k), l2(p)
    if hv != h:
      q, k, p = (x.repeat_interleave(hv // h, dim=2) for x in (q, k, p))
    scale = dk ** -0.5 if scale is None else scale
    s = state_of(initial_state, (b, hv, dk, dv), torch.float32)
    out = []
    for i in range(t):
      read = torch.einsum("bhk,bhkv->bhv", p[:, i], s)
      error = beta[:, i].float()[..., None] * (v[:, i].float() - read)
      s = (s * g[:, i].float().exp()[..., None, None]
           + k[:, i][..., None] * error[..., None, :])
      out.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, s))
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)

  fla_comba.chunk_comba = fla_comba.fused_recurrent_comba = recurrent_comba
  def mesa_net(q, k, v, g, beta, lamb, h_kk_init=None, h_kv_init=None,
               output_final_state=False, max_CG_iteration=30,
               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    # fla's naive chunkwise CG with the whole sequence as one chunk.
    assert cu_seqlens is None
    if use_qk_l2norm_in_kernel:
      q, k = l2(q.float()), l2(k.float())
    o, h_kk, h_kv = naive_mesa_net_CG(
        q, k, v, g, lamb, beta, chunk_size=q.shape[1],
        max_CG_iteration=max_CG_iteration, h_kk_init=h_kk_init,
        h_kv_init=h_kv_init)
    final = (h_kk, h_kv) if output_final_state else (None, None)
    return (o.to(v.dtype), *final)

  def mesa_net_step(q, k, v, g, lamb, beta, prev_h_kk, prev_h_kv,
                    max_CG_iteration=30):
    return naive_mesa_net_decoding_one_step(
        q, k, v, g, lamb, beta, prev_h_kk, prev_h_kv,
        max_CG_iteration=max_CG_iteration)

  fla_mesa_net.chunk_mesa_net = mesa_net
  fla_mesa_net.mesa_net_decoding_one_step = mesa_net_step
  fla_mesa_net.l2_norm = lambda x, output_dtype=None, **kw: l2(x.float())

  def recurrent_rwkv6(r, k, v, w, u, scale=1.0, initial_state=None,
                      output_final_state=False, **kwargs):
    b, t, h, dk = r.shape
    s = state_of(initial_state, (b, h, dk, v.shape[-1]), torch.float32)
    out = []
    for i in range(t):
      kv = k[:, i].float()[..., None] * v[:, i].float()[..., None, :]
      out.append(torch.einsum("bhk,bhkv->bhv", r[:, i].float() * scale,
                              s + u.float()[None, ..., None] * kv))
      s = s * w[:, i].float().exp()[..., None] + kv
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)

  fla_rwkv6.chunk_rwkv6 = fla_rwkv6.fused_recurrent_rwkv6 = recurrent_rwkv6

  def recurrent_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None,
                      output_final_state=False, **kwargs):
    # S [B, H, V, K]: S_t = S_{t-1} (diag(exp(w_t)) + a_t^T b_t) + v_t^T k_t.
    bsz, t, h, dk = r.shape
    s = state_of(initial_state, (bsz, h, v.shape[-1], dk), torch.float32)
    out = []
    for i in range(t):
      w_i, a_i, b_i = w[:, i].float(), a[:, i].float(), b[:, i].float()
      sa = torch.einsum("bhvk,bhk->bhv", s, a_i)
      s = (s * w_i.exp()[:, :, None, :] + sa[..., None] * b_i[:, :, None, :]
           + v[:, i].float()[..., None] * k[:, i].float()[:, :, None, :])
      out.append(torch.einsum("bhvk,bhk->bhv", s, r[:, i].float() * scale))
    return torch.stack(out, 1).to(v.dtype), (s if output_final_state else None)

  def mul_recurrent_rwkv7(r, w, k, v, kk, a, scale=1.0, **kwargs):
    return recurrent_rwkv7(r, w, k, v, -kk, kk * a, scale=scale, **kwargs)

  def segments(cu_seqlens, total):
    """``(start, end)`` of each sequence of a flattened batch."""
    bounds = [0, total] if cu_seqlens is None else cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))

  def parallel_forgetting(q, k, v, g, scale=None, window_size=None,
                          cu_seqlens=None):
    # q: [B, T, HQ, D]; with cu_seqlens B = 1 and T the sequences' tokens.
    return torch.cat([naive_forgetting_attn(
        q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], scale=scale,
        window_size=window_size) for a, b in segments(cu_seqlens, q.shape[1])],
                     dim=1).to(v.dtype)

  def decoding_step(q, k, v, g=None, scale=None, cu_seqlens=None, **kwargs):
    # q: [1, N, HQ, D], one query after each sequence's cached keys.
    out = []
    for n, (a, b) in enumerate(segments(cu_seqlens, k.shape[1])):
      # The query is the sequence's last token (its key is cached): the
      # last row of a naive call with the query in that row.
      query = torch.zeros_like(q[:, :1]).expand(-1, b - a, -1, -1).clone()
      query[:, -1] = q[:, n]
      out.append(naive_forgetting_attn(query, k[:, a:b], v[:, a:b],
                                       g[:, a:b], scale=scale)[:, -1:])
    return torch.cat(out, dim=1).to(v.dtype)

  fla_forgetting.parallel_forgetting_attn = parallel_forgetting
  fla_forgetting.attn_decoding_one_step = decoding_step

  def sequences(x, cu_seqlens):
    """``[B, T, ...]`` rows, or the sequences of ``[1, total, ...]``."""
    if x is None:
      return None
    if cu_seqlens is None:
      return list(x.split(1, dim=0))
    bounds = cu_seqlens.tolist()
    return [x[:, a:b] for a, b in zip(bounds[:-1], bounds[1:])]

  def path_attn(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None,
                use_cache=False):
    # fla's naive reference (its UT transform in chunks; it needs a gate),
    # and the keys moved across every later reflection for the cache.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs, caches = [], []
    parts = [sequences(x, cu_seqlens) for x in (q, k, v, w, beta, g)]
    for q_s, k_s, v_s, w_s, beta_s, g_s in zip(*[
        p if p is not None else [None] * len(parts[0]) for p in parts]):
      if g_s is None:
        g_s = q_s.new_zeros(q_s.shape[:-1], dtype=torch.float32)
      outs.append(naive_path_attn(q_s, k_s, v_s, w_s, beta_s, g_s, scale))
      keys = k_s.float().clone()
      for t in range(1, keys.shape[1]):
        w_t = w_s[:, t].float()                                 # [1, H, K]
        along = (keys[:, :t] * w_t[:, None]).sum(-1, keepdim=True)
        keys[:, :t] = keys[:, :t] - beta_s[:, t, None, :, None].float() * (
            along * w_t[:, None])
      caches.append(keys.to(k.dtype))
    return torch.cat(outs, dim=1 if cu_seqlens is not None else 0), (
        torch.cat(caches, dim=1 if cu_seqlens is not None else 0)
        if use_cache else None)

  def attn_decoding(q, k, v, g=None, scale=None, cu_seqlens=None,
                    do_gate_scale=False, **kwargs):
    # One query [1, N, HQ, K] at the end of each of N sequences of k, v.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bounds = cu_seqlens.tolist()
    group = q.shape[2] // k.shape[2]
    out = []
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
      keys = k[0, a:b].float().repeat_interleave(group, dim=1)  # [S, HQ, K]
      values = v[0, a:b].float().repeat_interleave(group, dim=1)
      s = torch.einsum("hk,shk->hs", q[0, n].float(), keys) * scale
      if g is not None:
        c = g[0, a:b].float().cumsum(0)                         # [S, HQ]
        bias = (c[-1][None] - c).T                              # [HQ, S]
        s = s + (bias * scale if do_gate_scale else bias)
      out.append(torch.einsum("hs,shv->hv", s.softmax(-1), values))
    return torch.stack(out)[None].to(v.dtype)

  fla_path_attn.parallel_path_attn = path_attn
  fla_path_attn.attn_decoding_one_step = attn_decoding
  fla_path_attn.l2_norm = lambda x, output_dtype=None, **kw: l2(
      x.float()).to(output_dtype or x.dtype)
  fla_rwkv7.chunk_rwkv7 = recurrent_rwkv7
  fla_rwkv7.fused_mul_recurrent_rwkv7 = mul_recurrent_rwkv7
  fla_rwkv7.fused_addcmul_rwkv7 = torch_addcmul_rwkv7
  fla_rwkv7.fused_k_rwkv7 = lambda k, a, ka, **kw: k_update_ref(k, a, ka)
  fla_rwkv7.gate_output_correction = gate_output_correction_ref
  fla_rwkv7.l2_norm = l2

  def stickbreaking(self, hidden_states, attention_mask=None,
                    past_key_values=None, output_attentions=False,
                    use_cache=False, **kwargs):
    # fla's forward without its GPU, half-precision and padding guards (no
    # mask here), the Triton op swapped for its naive torch code.
    b, t, _ = hidden_states.shape
    q = self.q_proj(hidden_states).reshape(b, t, -1, self.head_dim)
    k = self.k_proj(hidden_states).reshape(b, t, -1, self.head_dim)
    v = self.v_proj(hidden_states).reshape(b, t, -1, self.head_dim)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    o, _ = naive_stickbreaking_attn(q, k, v,
                                    attend_current=self.attend_current)
    return self.o_proj(o.flatten(-2)), None, None

  fla_stickbreaking.StickBreakingAttention.forward = stickbreaking

  def rotary(x, cos, sin, interleaved=False, seqlen_offsets=0,
             cu_seqlens=None, **kwargs):
    # Positions seqlen_offsets + t; channel i pairs with i + D/2.
    assert not interleaved and cu_seqlens is None
    t, half = x.shape[1], cos.shape[-1]
    cos, sin = (c[seqlen_offsets:seqlen_offsets + t][None, :, None]
                for c in (cos, sin))
    x1, x2 = x[..., :half].float(), x[..., half:2 * half].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin,
                      x[..., 2 * half:].float()], -1).to(x.dtype)

  fla_rotary.rotary_embedding = rotary
  fla_nsa.parallel_nsa = parallel_nsa_on_cpu()

  import fla.layers.mamba3 as fla_mamba3
  from fla.layers.utils import get_layer_cache, update_layer_cache
  from fla.modules.layernorm_gated import RMSNormGated, rms_norm_ref
  from experiments.mamba3_reference import (mamba3_mimo_step_ref,
                                            mamba3_siso_step_ref)

  RMSNormGated.forward = lambda self, x, z=None: rms_norm_ref(
      x, self.weight, self.bias, z=z, eps=self.eps,
      group_size=self.group_size, norm_before_gate=self.norm_before_gate)

  def mamba3(self, hidden_states, attention_mask=None, past_key_values=None,
             use_cache=False, **kwargs):
    # fla's forward and cuda_kernels_forward (SISO, no padding) with
    # mamba_ssm's kernels swapped for the reference's token-by-token code
    # (mamba3_siso_step_ref of state-spaces/mamba, as make_op_fixtures
    # copies it) and the skip D x and the gate z that its kernels apply.
    # The cache holds the reference's (Angle, SSM, K, V) states.
    if self.is_mimo:
      return mamba3_mimo(self, hidden_states, attention_mask, past_key_values,
                         use_cache)
    assert attention_mask is None
    b, t, _ = hidden_states.shape
    h, p = self.num_heads, self.head_dim
    last = get_layer_cache(self, past_key_values)
    z, x, B, C, dd_dt, dd_A, trap, angles = self._project_and_split(
        hidden_states)
    z, x = z.reshape(b, t, h, p), x.reshape(b, t, h, p)
    B = self.B_norm(B.reshape(b, t, self.n_groups, -1))
    C = self.C_norm(C.reshape(b, t, self.n_groups, -1))
    B, C = (y.repeat_interleave(h // self.n_groups, dim=2) for y in (B, C))
    DT = F.softplus(dd_dt + self.dt_bias)
    ADT = self._compute_a(dd_A) * DT
    angles = angles.unsqueeze(-2).expand(-1, -1, h, -1).float()
    states = (last["recurrent_state"] if last is not None else (
        x.new_zeros(b, h, self.num_rope_angles),
        x.new_zeros(b, h, p, self.ssm_state_size),
        x.new_zeros(b, h, self.ssm_state_size), x.new_zeros(b, h, p)))
    y, states = mamba3_siso_step_ref(
        C, B, x, ADT.transpose(1, 2), DT.transpose(1, 2),
        trap.transpose(1, 2), self.C_bias.squeeze(1), self.B_bias.squeeze(1),
        angles, states)
    y = y + self.D[None, None, :, None] * x
    if self.is_outproj_norm:
      y = self.norm(y.reshape(b, t, -1), z.reshape(b, t, -1))
    else:
      y = (y * z * torch.sigmoid(z)).reshape(b, t, -1)
    if use_cache or last is not None:
      update_layer_cache(self, past_key_values, recurrent_state=states,
                         offset=t)
    return self.out_proj(y.to(x.dtype)), None, past_key_values

  def mamba3_mimo(self, hidden_states, attention_mask, past_key_values,
                  use_cache):
    # The same with MIMO: mamba3_MIMO_step_ref of state-spaces/mamba, which
    # applies D, the gate and the rank projections, with the (i, i + N / 2)
    # rotation of its TileLang kernels and decoding step.
    assert attention_mask is None and not self.is_outproj_norm
    b, t, _ = hidden_states.shape
    h, p, r = self.num_heads, self.head_dim, self.mimo_rank
    n = self.ssm_state_size
    last = get_layer_cache(self, past_key_values)
    z, x, B, C, dd_dt, dd_A, trap, angles = self._project_and_split(
        hidden_states)
    z, x = z.reshape(b, t, h, p), x.reshape(b, t, h, p)
    B = self.B_norm(B.reshape(b, t, r, self.n_groups, n))
    C = self.C_norm(C.reshape(b, t, r, self.n_groups, n))
    B, C = (y.repeat_interleave(h // self.n_groups, dim=3) for y in (B, C))
    DT = F.softplus(dd_dt + self.dt_bias)
    ADT = self._compute_a(dd_A) * DT
    angles = angles.unsqueeze(-2).expand(-1, -1, h, -1).float()
    states = (last["recurrent_state"] if last is not None else (
        x.new_zeros(b, h, self.num_rope_angles), x.new_zeros(b, h, p, n),
        x.new_zeros(b, h, r, n), x.new_zeros(b, h, r, p)))
    y, states = mamba3_mimo_step_ref(
        C, B, x, ADT.transpose(1, 2), DT.transpose(1, 2),
        trap.transpose(1, 2), self.C_bias, self.B_bias, angles, self.mimo_x,
        self.mimo_o, D=self.D, Z=z, MIMO_Z=self.mimo_z, Input_States=states,
        rotate_pairwise=False)
    if use_cache or last is not None:
      update_layer_cache(self, past_key_values, recurrent_state=states,
                         offset=t)
    return self.out_proj(y.reshape(b, t, -1).to(x.dtype)), None, \
        past_key_values

  fla_mamba3.Mamba3.forward = mamba3
  def log_linear_mamba2(self, hidden_states, attention_mask=None,
                        past_key_values=None, use_cache=False, **kwargs):
    # fla's forward without a cache (its decoding state is the Triton
    # kernel's; the fixture re-runs the prefix instead), its chunk kernel
    # swapped for fla's naive_log_linear_attn.
    assert attention_mask is None and past_key_values is None
    assert self.rmsnorm and not self.norm_before_gate and not self.D_has_hdim
    b, t, _ = hidden_states.shape
    e, h, p = self.intermediate_size, self.num_heads, self.head_dim
    g, n, levels = self.n_groups, self.ssm_state_size, self.num_lambda_dims
    gate, xbc, dt, dl = torch.split(self.in_proj(hidden_states),
                                    [e, self.conv_dim, h, h * levels], dim=-1)
    width = self.conv_kernel_size
    xbc = F.conv1d(xbc.transpose(1, 2), self.conv1d.weight, self.conv1d.bias,
                   padding=width - 1, groups=self.conv_dim)[..., :t]
    xbc = F.silu(xbc.transpose(1, 2))                       # [B, T, E + 2GN]
    x, B, C = torch.split(xbc, [e, g * n, g * n], dim=-1)
    x = x.reshape(b, t, h, p)
    B, C = B.reshape(b, t, g, n), C.reshape(b, t, g, n)
    dt = F.softplus(dt + self.dt_bias)                          # [B, T, H]
    A = -torch.exp(self.A_log.float())                          # [H]
    lam = F.softplus(self.L * dl.reshape(b, t, h, levels))      # [B, T, H, L]
    y = naive_log_linear_attn(C, B, x * dt[..., None], A * dt, lam,
                              scale=1.0)
    y = y + x * self.D[:, None]                                 # [B, T, H, P]
    y = y.reshape(b, t, e) * F.silu(gate)
    y = y.reshape(b, t, g, e // g)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm.eps)
    y = y.reshape(b, t, e) * self.norm.weight
    return self.out_proj(y), None, past_key_values

  fla_log_linear_mamba2.LogLinearMamba2.forward = log_linear_mamba2


def _mamba(transformers):
  return transformers.MambaForCausalLM(transformers.MambaConfig(
      vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
      expand=2, conv_kernel=4, time_step_rank=6, use_bias=True,
      use_conv_bias=True, layer_norm_epsilon=1e-5, tie_word_embeddings=True))


def _mamba2(transformers):
  return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
      vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
      expand=2, num_heads=4, head_dim=16, n_groups=2, conv_kernel=4,
      chunk_size=4, use_conv_bias=True, use_bias=False,
      time_step_limit=(0.0, 0.08), layer_norm_epsilon=1e-5,
      tie_word_embeddings=False))


def _recurrent_gemma(transformers):
  return transformers.RecurrentGemmaForCausalLM(
      transformers.RecurrentGemmaConfig(
          vocab_size=VOCAB, hidden_size=32, intermediate_size=96,
          num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
          lru_width=32, attention_window_size=6, conv1d_width=4,
          logits_soft_cap=30.0, rms_norm_eps=1e-6,
          block_types=("recurrent", "recurrent", "attention"),
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                           "partial_rotary_factor": 0.5}))


def _qwen3_next(transformers):
  return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
      linear_num_key_heads=2, linear_num_value_heads=4,
      linear_key_head_dim=8, linear_value_head_dim=6,
      linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 2,
      num_experts=0, mlp_only_layers=[0, 1], rms_norm_eps=1e-6,
      tie_word_embeddings=False))


def _falcon_h1(transformers):
  """Every muP multiplier away from 1, grouped KV heads, Mamba-2's gated
  RMSNorm on (gate first) over two groups, an inner width of its own."""
  return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      mamba_d_ssm=32, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8,
      mamba_d_conv=4, mamba_chunk_size=4, mamba_rms_norm=True,
      mamba_norm_before_gate=False, lm_head_multiplier=0.7,
      embedding_multiplier=1.3, mlp_multipliers=[0.8, 1.2],
      key_multiplier=0.9, attention_out_multiplier=1.1,
      attention_in_multiplier=0.95, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
      ssm_in_multiplier=1.15, ssm_out_multiplier=0.85, rms_norm_eps=1e-5,
      tie_word_embeddings=False))


def _nemotron_h(transformers):
  """A Mamba-2 (8 heads), an attention (4 heads), an MLP and a
  mixture-of-experts layer (sigmoid router in two groups with its
  selection bias, a shared expert, top-2 of 4, scaled weights)."""
  return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
      vocab_size=VOCAB, hidden_size=32, hybrid_override_pattern="M*-E",
      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      intermediate_size=48, ssm_state_size=8, mamba_num_heads=8,
      mamba_head_dim=8, n_groups=2, conv_kernel=4, expand=2, chunk_size=4,
      n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
      moe_intermediate_size=16, moe_shared_expert_intermediate_size=24,
      n_group=2, topk_group=1, routed_scaling_factor=1.5,
      layer_norm_epsilon=1e-5, tie_word_embeddings=False))


def _granitemoehybrid(transformers):
  """Granite 4.0-H: Mamba-2 (8 heads) and attention (4 heads, RoPE)
  layers, top-2 of 4 experts beside the shared MLP in every layer, its four
  multipliers."""
  return transformers.GraniteMoeHybridForCausalLM(
      transformers.GraniteMoeHybridConfig(
          vocab_size=VOCAB, hidden_size=32, intermediate_size=16,
          num_hidden_layers=3,
          layer_types=["mamba", "attention", "mamba"],
          num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
          num_experts_per_tok=2, shared_intermediate_size=24,
          mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
          mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
          mamba_chunk_size=4, position_embedding_type="rope",
          embedding_multiplier=1.3, residual_multiplier=0.7,
          attention_multiplier=0.3, logits_scaling=2.0, rms_norm_eps=1e-6,
          tie_word_embeddings=False))


def _jamba(transformers):
  """Mamba-1 (with its dt, B and C norms) and attention layers, experts
  (top-2 of 4) every other layer: 0 Mamba + MoE, 1 attention + MLP, 2
  Mamba + MoE, 3 attention + MLP."""
  return transformers.JambaForCausalLM(transformers.JambaConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
      num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
      attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
      mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
      rms_norm_eps=1e-6, tie_word_embeddings=False))


def _lfm2(transformers):
  """Gated short convolutions and attention (q/k norms, grouped KV heads),
  the feed-forward width adjusted as LFM2's ``block_auto_adjust_ff_dim``."""
  return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=72,
      num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
      num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
      block_multiple_of=16, block_ffn_dim_multiplier=1.0,
      block_auto_adjust_ff_dim=True, norm_eps=1e-5,
      tie_word_embeddings=True))


def _qwen3_next_hybrid(transformers):
  """Qwen3-Next with every kind of layer: Gated DeltaNet and gated softmax
  attention (grouped KV heads, partial RoPE), a dense MLP (layer 0) and
  mixture-of-experts MLPs (top-2 of 4, a gated shared expert)."""
  return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
      linear_key_head_dim=8, linear_value_head_dim=6,
      linear_conv_kernel_dim=4,
      layer_types=["linear_attention", "full_attention", "linear_attention",
                   "full_attention"],
      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
      shared_expert_intermediate_size=24, norm_topk_prob=True,
      decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.25},
      tie_word_embeddings=False))


def _kimi_linear(transformers):
  """Kimi Linear: KDA and MLA layers (no RoPE, no query low rank, as the
  published model), a dense first layer and mixture-of-experts MLPs
  (sigmoid router with a selection bias, 2 groups of 4 experts, one kept,
  top-2, a shared expert, the routed scale)."""
  return transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=None,
      qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
      num_experts=8, num_experts_per_token=2, num_expert_group=2,
      topk_group=1, num_shared_experts=1, routed_scaling_factor=2.446,
      moe_renormalize=True, linear_head_dim=8, linear_num_heads=2,
      linear_conv_kernel_dim=4, rms_norm_eps=1e-5,
      layer_types=["linear_attention", "full_attention", "linear_attention",
                   "full_attention"],
      mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
      pad_token_id=0, bos_token_id=1, eos_token_id=2,
      tie_word_embeddings=False))


def _minimax(transformers):
  """MiniMax: lightning attention and softmax attention (grouped KV heads),
  mixture-of-experts MLPs (top-2 of 4), blocks of 4 tokens (the fixture's
  12 tokens span full and partial blocks), residual factors away from 1."""
  return transformers.MiniMaxForCausalLM(transformers.MiniMaxConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=16,
      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
      head_dim=8, num_local_experts=4, num_experts_per_tok=2,
      block_size=4, rms_norm_eps=1e-5,
      layer_types=["linear_attention", "full_attention", "linear_attention",
                   "linear_attention"],
      full_attn_alpha_factor=1.3, full_attn_beta_factor=0.9,
      linear_attn_alpha_factor=1.7, linear_attn_beta_factor=1.1,
      mlp_alpha_factor=1.2, mlp_beta_factor=0.8,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
      tie_word_embeddings=False))


def _xlstm(weight_mode):
  """xLSTM-7B's architecture at a small size: its native torch kernels
  (chunkwise for whole chunks of 4, the recurrent sequence kernel for the
  rest, the step kernel when decoding) in float32, with K = 32 != V = 64
  per head. The query/key and value widths are multiples of 64, so that
  the cache's rounded head widths are those of the layer's weights."""
  def make(transformers):
    import transformers.models.xlstm.modeling_xlstm as xlstm
    init = xlstm.xLSTMPreTrainedModel._init_weights

    def init_as_single(self, module):
      # transformers' fused-mode gate init subtracts a [2H] tensor from an
      # [H] slice and fails; the fused weights are initialised as in the
      # single mode instead (_perturb then moves every one of them).
      mode = self.config.weight_mode
      self.config.weight_mode = "single"
      try:
        init(self, module)
      finally:
        self.config.weight_mode = mode

    if weight_mode == "fused":
      xlstm.xLSTMPreTrainedModel._init_weights = init_as_single
    try:
      return make_model(transformers)
    finally:
      xlstm.xLSTMPreTrainedModel._init_weights = init

  def make_model(transformers):
    return transformers.xLSTMForCausalLM(transformers.xLSTMConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=2,
        qk_dim_factor=1.0, v_dim_factor=2.0, ffn_proj_factor=2.667,
        ffn_round_up_to_multiple_of=64, gate_soft_cap=15.0,
        output_logit_soft_cap=30.0, norm_eps=1e-6, eps=1e-6, chunk_size=4,
        mode="inference", chunkwise_kernel="chunkwise--native_autograd",
        sequence_kernel="native_sequence__native", step_kernel="native",
        autocast_kernel_dtype="float32", inference_state_dtype="float32",
        weight_mode=weight_mode, tie_word_embeddings=False))
  return make


def _fla(name, **kw):
  def make(transformers):
    import fla.models as fla_models
    config_cls = getattr(fla_models, name + "Config")
    model_cls = getattr(fla_models, name + "ForCausalLM")
    return model_cls(config_cls(vocab_size=VOCAB, num_hidden_layers=2,
                                fuse_cross_entropy=False, **kw))
  return make


FIXTURES = {
    "mamba": _mamba,
    "mamba2": _mamba2,
    "recurrent_gemma": _recurrent_gemma,
    "qwen3_next": _qwen3_next,
    "falcon_h1": _falcon_h1,
    "nemotron_h": _nemotron_h,
    "granitemoehybrid": _granitemoehybrid,
    "jamba": _jamba,
    "lfm2": _lfm2,
    "qwen3_next_hybrid": _qwen3_next_hybrid,
    "kimi_linear": _kimi_linear,
    "minimax": _minimax,
    "xlstm": _xlstm("single"),
    "xlstm_fused": _xlstm("fused"),
    "gla": _fla("GLA", hidden_size=32, num_heads=2, expand_k=0.5,
                norm_eps=1e-6, hidden_ratio=2),
    "gla_short_conv": _fla("GLA", hidden_size=32, num_heads=2, expand_k=0.5,
                           norm_eps=1e-6, hidden_ratio=2, use_short_conv=True,
                           conv_size=3, conv_bias=True),
    "delta_net": _fla("DeltaNet", hidden_size=32, num_heads=2, use_gate=True,
                      norm_eps=1e-5, hidden_ratio=2),
    "gated_deltanet": _fla("GatedDeltaNet", hidden_size=32, num_heads=2,
                           num_v_heads=4, head_dim=8, expand_v=1.5,
                           norm_eps=1e-5, hidden_ratio=2),
    "gated_deltaproduct": _fla("GatedDeltaProduct", hidden_size=32,
                               num_heads=2, head_dim=8, expand_v=1.5,
                               num_householder=2, use_forget_gate=True,
                               allow_neg_eigval=True, norm_eps=1e-5,
                               hidden_ratio=2),
    "comba": _fla("Comba", hidden_size=32, num_heads=2, num_v_heads=4,
                  head_dim=8, expand_v=1.5, norm_eps=1e-5, hidden_ratio=2),
    "mesa_net": _fla("MesaNet", hidden_size=32, num_heads=2, head_dim=8,
                     norm_eps=1e-5, hidden_ratio=2),
    "rwkv6": _fla("RWKV6", hidden_size=32, num_heads=2, expand_k=0.5,
                  proj_low_rank_dim=8, gate_low_rank_dim=16, hidden_ratio=2),
    "rwkv7": _fla("RWKV7", hidden_size=32, head_dim=16,
                  decay_low_rank_dim=8, a_low_rank_dim=8,
                  gate_low_rank_dim=16, v_low_rank_dim=8, hidden_ratio=2),
    # fla's NSA wants groups of 16 or more query heads per key/value head;
    # blocks of 2 tokens, 4 selected (one ranked past the three forced).
    "nsa": _fla("NSA", hidden_size=32, num_heads=16, num_kv_heads=1,
                head_dim=8, block_size=2, block_counts=4, window_size=3,
                hidden_ratio=2),
    "stickbreaking_attn": _fla("StickBreakingAttention", hidden_size=32,
                               num_heads=4, num_kv_heads=2, qkv_bias=True,
                               qk_norm=True, attend_current=True,
                               hidden_ratio=2),
    "forgetting_transformer": _fla(
        "ForgettingTransformer", hidden_size=32, num_heads=4, num_kv_heads=2,
        qkv_bias=True, qk_norm=True, use_output_gate=True, norm_eps=1e-6,
        hidden_ratio=2),
    "path_attn": _fla("PaTHAttention", hidden_size=32, num_heads=2,
                      norm_eps=1e-6, hidden_ratio=2),
    "path_attn_forget_gate": _fla(
        "PaTHAttention", hidden_size=32, num_heads=4, num_kv_heads=2,
        use_forget_gate=True, use_low_rank_w=False, use_w_shortconv=False,
        norm_eps=1e-6, hidden_ratio=2),
    # Two groups of B and C over four heads, biases on the projections.
    "mamba3": _fla("Mamba3", hidden_size=32, state_size=16, head_dim=16,
                   expand=2, n_groups=2, use_bias=True, norm_eps=1e-5),
    # MIMO of rank 3 over two groups of B and C.
    "mamba3_mimo": _fla("Mamba3", hidden_size=32, state_size=16, head_dim=16,
                        expand=2, n_groups=2, is_mimo=True, mimo_rank=3,
                        norm_eps=1e-5),
    # Time steps drawn in [0.1, 1] (fla's: [1e-3, 0.1]), so that the
    # log-linear part, level weights included, moves the logits well past
    # the tests' tolerance next to the D x skip.
    "log_linear_mamba2": _fla("LogLinearMamba2", hidden_size=32, head_dim=16,
                              state_size=8, n_groups=2, expand=2,
                              conv_kernel=4, dt_min=0.1, dt_max=1.0,
                              norm_eps=1e-5),
}
# fla models without a cache on CPU: they generate by running the whole
# prefix (log-linear Mamba-2's decoding state is its Triton kernel's).
WITHOUT_CACHE = ("stickbreaking_attn", "log_linear_mamba2")


def _perturb(model, torch):
  """Moves every parameter off its init (zeros, ones, equal heads), so that
  no mapping error hides behind a symmetric value; and the routers'
  selection biases (buffers, zeros at init)."""
  generator = torch.Generator().manual_seed(SEED + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=generator) * 0.1
      if name.endswith("lm_head.weight") and model.config.tie_word_embeddings:
        continue
      p.add_(noise)
    # Routers' selection biases are buffers (no gradient), and loaded.
    for name, b in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        b.add_(torch.randn(b.shape, generator=generator) * 0.1)


def _decode(model, tokens, torch):
  """Logits of a prefill of PREFILL tokens, then one token at a time, with
  the reference's cache (RecurrentGemma keeps its state inside the model),
  or, for a model without a cache, with the whole prefix each time."""
  if model.config.model_type in WITHOUT_CACHE:
    logits = [model(tokens[:, :PREFILL], use_cache=False).logits]
    for i in range(PREFILL, tokens.shape[1]):
      logits.append(model(tokens[:, :i + 1], use_cache=False).logits[:, -1:])
    return torch.cat(logits, dim=1)
  from_fla = model.config.model_type in ("gla", "delta_net", "gated_deltanet",
                                         "rwkv6", "rwkv7",
                                         "forgetting_transformer", "nsa",
                                         "path_attn", "gated_deltaproduct",
                                         "comba", "mamba3", "mesa_net")
  # fla's ForgettingAttention decodes from its KV cache only through the
  # path of an attention mask (all ones here: no padding); fla's PaTH layer
  # prefills into its cache and decodes only when given one (without one it
  # runs its training path).
  masked = model.config.model_type in ("forgetting_transformer",
                                       "path_attn")
  key = "past_key_values" if from_fla else "cache"

  def cache_of(out):
    try:
      return getattr(out, key)
    except AttributeError:
      return None

  # Qwen3-Next without attention layers cannot count cached tokens itself.
  linear_only = (model.config.model_type == "qwen3_next" and all(
      kind == "linear_attention" for kind in model.config.layer_types))
  # MiniMax counts cached tokens in its first layer, a lightning layer here
  # (no count): positions are given.
  positions = linear_only or model.config.model_type == "minimax"
  kw = dict(use_cache=True)
  if model.config.model_type == "recurrent_gemma":
    # Its recurrent state lives in the model; the output returns no cache.
    import transformers
    positions = True
    kw["cache"] = transformers.DynamicCache(config=model.config)
    model._setup_cache(model.config, tokens.shape[0], tokens.device,
                       torch.float32)
  # xLSTM counts cached tokens in its own cache.
  counted = from_fla or model.config.model_type == "xlstm"
  if not counted:
    kw["cache_position"] = torch.arange(PREFILL)
  if positions:
    kw["position_ids"] = torch.arange(PREFILL)[None]
  if linear_only:
    kw["attention_mask"] = masks = {"full_attention": None,
                                    "linear_attention": None}
  if masked:
    kw["attention_mask"] = torch.ones((tokens.shape[0], PREFILL), dtype=int)
  out = model(tokens[:, :PREFILL], **kw)
  logits, cache = [out.logits], cache_of(out) or kw.get("cache")
  for i in range(PREFILL, tokens.shape[1]):
    kw = {key: cache, "use_cache": True}
    if masked:
      kw["attention_mask"] = torch.ones(tokens.shape[0], i + 1).long()
    if not counted:
      kw["cache_position"] = torch.tensor([i])
    if positions:
      kw["position_ids"] = torch.tensor([[i]])
    if linear_only:
      kw["attention_mask"] = masks
    if masked:
      kw["attention_mask"] = torch.ones((tokens.shape[0], i + 1), dtype=int)
    out = model(tokens[:, i:i + 1], **kw)
    logits.append(out.logits)
    cache = cache_of(out) or cache
  return torch.cat(logits, dim=1)


def make_fixture(name: str, out_dir: str,
                 tokenizer: bool = True) -> dict:
  import numpy as np
  import torch
  import transformers

  torch.manual_seed(SEED)
  model = FIXTURES[name](transformers).float().eval()
  _perturb(model, torch)
  tokens = torch.from_numpy(np.random.default_rng(SEED).integers(
      0, VOCAB, (BATCH, LENGTH))).long()
  with torch.no_grad():
    full = model(tokens, use_cache=False).logits
    decode = _decode(model, tokens, torch)
  path = os.path.join(out_dir, name)
  if os.path.exists(path):
    shutil.rmtree(path)
  model.save_pretrained(path, safe_serialization=True)
  for extra in ("generation_config.json",):
    if os.path.exists(os.path.join(path, extra)):
      os.remove(os.path.join(path, extra))
  if tokenizer:
    write_tokenizer(path, VOCAB)
  np.savez(os.path.join(path, "reference.npz"), tokens=tokens.numpy(),
           full=full.float().numpy(), decode=decode.float().numpy(),
           prefill=np.int64(PREFILL))
  gap = float((full - decode).pow(2).mean().sqrt() / full.pow(2).mean().sqrt())
  return {"name": name, "reference_full_vs_decode": gap,
          "versions": {"torch": torch.__version__,
                       "transformers": transformers.__version__}}


def main(argv):
  del argv
  names = FLAGS.only or list(FIXTURES)
  if FLAGS.tokenizer_only:
    for name in names:
      write_tokenizer(os.path.join(FLAGS.out, name), VOCAB)
      print(f"wrote {os.path.join(FLAGS.out, name, 'tokenizer.json')}")
    return
  warnings.filterwarnings("ignore")
  sys.setrecursionlimit(10000)
  # Qwen3-Next and Kimi Linear pick fla's Triton kernels at import when fla
  # is importable; import them while fla is hidden so that they keep their
  # torch references.
  sys.modules["fla"] = None
  import transformers.models.qwen3_next.modeling_qwen3_next  # noqa: F401
  import transformers.models.kimi_linear.modeling_kimi_linear  # noqa: F401
  del sys.modules["fla"]
  fla_cpu_reference()
  os.makedirs(FLAGS.out, exist_ok=True)
  for name in names:
    info = make_fixture(name, FLAGS.out, FLAGS.tokenizer)
    print(json.dumps(info))


if __name__ == "__main__":
  app.run(main)
