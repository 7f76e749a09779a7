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
