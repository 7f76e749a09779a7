"""The Mamba-3 reference of state-spaces/mamba, in torch on CPU, for the
fixtures (``make_op_fixtures``' ``mamba3`` and the fla ``mamba3`` model of
``make_hf_fixtures``). Needs the ``hf`` extra."""

from __future__ import annotations

import math


def mamba3_siso_step_ref(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles,
                         Input_States):
  """``mamba3_siso_step_ref`` of state-spaces/mamba
  (``tests/ops/triton/test_mamba3_siso.py``, commit e9594ce), copied
  because that test module imports the Triton kernels: the reference's
  token-by-token Mamba-3 (SISO), here without its optional ``D``, ``Z``
  and grouped ``Q``/``K`` (the op leaves those to the layer). Layouts as
  the reference's: ``Q, K [B, T, H, N]``, ``V [B, T, H, P]``, ``ADT, DT,
  Trap [B, H, T]``, ``Angles [B, T, H, A]``, the states ``(Angle [B, H,
  A], SSM [B, H, P, N], K [B, H, N], V [B, H, P])``."""
  import torch
  import torch.nn.functional as F

  seqlen = Q.shape[1]
  Angles = torch.tanh(Angles) * math.pi

  def apply_rotary_emb(tensor, cos, sin):
    tensor_reshaped = tensor.view(*tensor.shape[:-1], -1, 2)
    tensor_0 = tensor_reshaped[..., 0]
    tensor_1 = tensor_reshaped[..., 1]
    if cos.shape[-1] < tensor_0.shape[-1]:
      pad_size = tensor_0.shape[-1] - cos.shape[-1]
      cos = F.pad(cos, (0, pad_size), value=1.0)
      sin = F.pad(sin, (0, pad_size), value=0.0)
    rotated_0 = tensor_0 * cos - tensor_1 * sin
    rotated_1 = tensor_0 * sin + tensor_1 * cos
    return torch.stack([rotated_0, rotated_1], dim=-1).view_as(tensor)

  Angle_State, SSM_State, K_State, V_State = (x.clone()
                                              for x in Input_States)
  TWO_PI = 2 * math.pi
  out_arr = []
  for idx in range(seqlen):
    q = Q[:, idx, :, :] + Q_bias.unsqueeze(0)
    k = K[:, idx, :, :] + K_bias.unsqueeze(0)
    v = V[:, idx, :, :]
    adt = ADT[:, :, idx]
    dt = DT[:, :, idx]
    trap = Trap[:, :, idx]
    angles = Angles[:, idx, :, :]
    Angle_State = Angle_State + angles * dt.unsqueeze(-1)
    Angle_State = Angle_State - TWO_PI * torch.floor(Angle_State / TWO_PI)
    cos_angles = torch.cos(Angle_State)
    sin_angles = torch.sin(Angle_State)
    q_rot = apply_rotary_emb(q, cos_angles, sin_angles)
    k_rot = apply_rotary_emb(k, cos_angles, sin_angles)
    trap = torch.sigmoid(trap)
    alpha = torch.exp(adt)
    beta = (1 - trap) * dt * alpha
    gamma = trap * dt
    SSM_State = alpha.unsqueeze(-1).unsqueeze(-1) * SSM_State
    SSM_State = SSM_State + beta.unsqueeze(-1).unsqueeze(-1) * (
        K_State.unsqueeze(-2) * V_State.unsqueeze(-1))
    SSM_State = SSM_State + gamma.unsqueeze(-1).unsqueeze(-1) * (
        k_rot.unsqueeze(-2) * v.unsqueeze(-1))
    out = torch.einsum("bhdD, bhD -> bhd", SSM_State,
                       q_rot.to(SSM_State.dtype))
    out_arr.append(out)
    K_State = k_rot
    V_State = v
  out = torch.stack(out_arr, dim=1)
  return out, (Angle_State, SSM_State, K_State, V_State)


def mamba3_mimo_step_ref(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles,
                         MIMO_V, MIMO_O, D=None, Z=None, MIMO_Z=None,
                         Input_States=None, rotate_pairwise=True):
  """``mamba3_MIMO_step_ref`` of state-spaces/mamba
  (``tests/ops/tilelang/test_mamba3_mimo.py``, commit e9594ce), copied
  because that test module needs CUDA: the reference's token-by-token
  Mamba-3 MIMO, here without its ``fused_norm`` option, and with
  ``rotate_pairwise``: True rotates the pairs ``(2i, 2i + 1)`` as the
  step reference does, False the pairs ``(i, i + N / 2)`` as the
  reference's TileLang kernels and its decoding step do (its chunked
  reference ``mamba3_MIMO_chunk_ref``'s ``rotate_pairwise=False``).
  Layouts as the reference's: ``Q, K [B, T, R, H, N]``, ``V, Z [B, T, H,
  P]``, ``ADT, DT, Trap [B, H, T]``, ``Angles [B, T, H, A]``, ``Q_bias,
  K_bias [H, R, N]``, ``MIMO_V, MIMO_O, MIMO_Z [H, R, P]``, ``D [H]``, the
  states ``(Angle [B, H, A], SSM [B, H, P, N], K [B, H, R, N], V [B, H, R,
  P])``."""
  import torch
  import torch.nn.functional as F
  from einops import rearrange

  batch, seqlen, mimo_rank, _, headdim_qk = Q.shape
  _, _, nheads, headdim_v = V.shape
  headdim_angles = Angles.shape[-1]

  def apply_rotary_emb(tensor, cos, sin):
    if rotate_pairwise:
      tensor_reshaped = tensor.view(*tensor.shape[:-1], -1, 2)
      tensor_0 = tensor_reshaped[..., 0]
      tensor_1 = tensor_reshaped[..., 1]
    else:
      tensor_reshaped = tensor.view(*tensor.shape[:-1], 2, -1)
      tensor_0 = tensor_reshaped[..., 0, :]
      tensor_1 = tensor_reshaped[..., 1, :]
    if cos.shape[-1] < tensor_0.shape[-1]:
      pad_size = tensor_0.shape[-1] - cos.shape[-1]
      cos = F.pad(cos, (0, pad_size), value=1.0)
      sin = F.pad(sin, (0, pad_size), value=0.0)
    rotated_0 = tensor_0 * cos - tensor_1 * sin
    rotated_1 = tensor_0 * sin + tensor_1 * cos
    return torch.stack([rotated_0, rotated_1],
                       dim=-1 if rotate_pairwise else -2).view_as(tensor)

  q_bias = rearrange(Q_bias, "h r d -> r h d")
  k_bias = rearrange(K_bias, "h r d -> r h d")
  if Input_States is not None:
    Angle_State, SSM_State, K_State, V_State = (x.clone()
                                                for x in Input_States)
  else:
    Angle_State = torch.zeros((batch, nheads, headdim_angles),
                              dtype=torch.float32)
    SSM_State = torch.zeros((batch, nheads, headdim_v, headdim_qk),
                            dtype=torch.float32)
    K_State = torch.zeros((batch, nheads, mimo_rank, headdim_qk),
                          dtype=Q.dtype)
    V_State = torch.zeros((batch, nheads, mimo_rank, headdim_v),
                          dtype=V.dtype)

  v_proj = torch.einsum("bthd,hrd->btrhd", V, MIMO_V)
  z_proj = (torch.einsum("bthd,hrd->btrhd", Z, MIMO_Z) if Z is not None
            else None)
  out_arr = []
  for idx in range(seqlen):
    q = Q[:, idx, :, :, :] + q_bias.unsqueeze(0)
    k = K[:, idx, :, :, :] + k_bias.unsqueeze(0)
    v = v_proj[:, idx, :, :, :]
    adt = ADT[:, :, idx]
    dt = DT[:, :, idx]
    trap = torch.sigmoid(Trap[:, :, idx])
    z = z_proj[:, idx, :, :, :] if z_proj is not None else None
    angles = Angles[:, idx, :, :]
    q = q.permute(0, 2, 1, 3)
    k = k.permute(0, 2, 1, 3)
    v = v.permute(0, 2, 1, 3)
    if z is not None:
      z = z.permute(0, 2, 1, 3)
    Angle_State = (Angle_State
                   + torch.tanh(angles) * dt.unsqueeze(-1) * math.pi)
    cos_angles = torch.cos(Angle_State).unsqueeze(2)
    sin_angles = torch.sin(Angle_State).unsqueeze(2)
    q_rot = apply_rotary_emb(q, cos_angles, sin_angles)
    k_rot = apply_rotary_emb(k, cos_angles, sin_angles)
    alpha = torch.exp(adt)
    beta = (1 - trap) * dt * alpha
    gamma = trap * dt
    prev_kv = torch.einsum("bhrd,bhrp->bhpd", K_State, V_State)
    curr_kv = torch.einsum("bhrd,bhrp->bhpd", k_rot, v)
    SSM_State = alpha.unsqueeze(-1).unsqueeze(-1) * SSM_State
    SSM_State = SSM_State + beta.unsqueeze(-1).unsqueeze(-1) * prev_kv
    SSM_State = SSM_State + gamma.unsqueeze(-1).unsqueeze(-1) * curr_kv
    out = torch.einsum("bhpd,bhrd->bhrp", SSM_State,
                       q_rot.to(SSM_State.dtype))
    if D is not None:
      out = out + D[None, :, None, None] * v
    if z is not None:
      out = out * z * torch.sigmoid(z)
    out = torch.einsum("bhrp,hrp->bhp", out, MIMO_O)
    out_arr.append(out)
    K_State = k_rot
    V_State = v
  out = torch.stack(out_arr, dim=1)
  return out, (Angle_State, SSM_State, K_State, V_State)
