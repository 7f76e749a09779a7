"""Context parallelism: one sequence split over the devices of a mesh axis.

With ``P`` devices on the mesh axis ``"sequence"``, device ``p`` holds the
``L = T / P`` consecutive tokens ``[p L, (p + 1) L)`` of every ``[B, T, ...]``
array (``jax.shard_map``, manual over that axis only; batch and head axes
stay under the compiler's automatic sharding). A recurrent core is affine
in its state: the state after device ``p``'s tokens is ``M_p S + R_p``,
with ``S`` the state entering the device, ``R_p`` the device's own final
state from a zero state, and ``M_p`` the transition (the product of its
decays, a ``K x K`` matrix for the delta rule). So, per device:

1. the device's chunk form from a zero state gives ``R_p`` (and ``M_p``);
2. one all-gather of those pairs (``P`` small summaries, independent of
   ``T``) and a prefix combine over the devices, ``S_{p+1} = M_p S_p +
   R_p`` from ``S_0 = initial_state``, gives every device its entering
   state ``S_p`` (and every device the final state ``S_P``);
3. the outputs get the entering state's contribution, which is linear in
   ``S_p``: the gated-linear and delta-rule cores add it to the outputs of
   step 1 (that run also gives how each output reads the entering state);
   the diagonal and selective scans run their chunk form from ``S_p``, step
   1 being a state-only pass for them.

Packed documents: a device's own summary already drops what a document
start inside it cuts off; a document that starts exactly at a device's
first token zeroes the entering state of that device (``document_starts``,
from the first and last segment id of every device). Short convolutions,
token shift and sliding-window attention need only the last few tokens of
the previous device instead (``previous_tokens``, one ``ppermute``).

The chunk forms switch to these paths by themselves when the current mesh
(``jax.set_mesh``) has a ``"sequence"`` axis of size > 1 that is not already
manual (``sequence_parallel_size``); inside the ``shard_map`` the axis is
manual, so the same forms then run on the device's tokens.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lin_attn_jax.ops.common import mesh_axes

SEQUENCE_AXIS = mesh_axes.SEQUENCE_AXIS


def _mesh(mesh):
  return jax.sharding.get_abstract_mesh() if mesh is None else mesh


def sequence_parallel_size(axis_name: str = SEQUENCE_AXIS, mesh=None) -> int:
  """How many devices the chunk forms split a sequence over (1: none).

  The size of ``axis_name`` in ``mesh`` (the current mesh, from
  ``jax.set_mesh``, when None), or 1 where there is no mesh, no such axis,
  or the axis is already manual (inside a ``shard_map`` over it).
  """
  mesh = _mesh(mesh)
  if mesh.empty or axis_name not in mesh.axis_names:
    return 1
  if axis_name in getattr(mesh, "manual_axes", ()):
    return 1
  return int(mesh.shape[axis_name])


def splits_sequence(split_form: Callable[[], Callable]):
  """Decorates a chunk form so that it splits the sequence when it should.

  Under a mesh with a ``"sequence"`` axis of size > 1 (not manual) the
  decorated form calls ``split_form()`` (a function, looked up at call
  time) with the same arguments instead of itself.
  """

  def wrap(form):
    @functools.wraps(form)
    def dispatch(*args, **kwargs):
      if sequence_parallel_size() > 1:
        return split_form()(*args, **kwargs)
      return form(*args, **kwargs)

    return dispatch

  return wrap


def axis_size(axis_name: str, mesh=None) -> int:
  """The size of ``axis_name`` in ``mesh`` (or the current mesh); raises
  ``ValueError`` if there is no such axis."""
  mesh = _mesh(mesh)
  if mesh.empty or axis_name not in mesh.axis_names:
    names = () if mesh.empty else tuple(mesh.axis_names)
    raise ValueError(f"context parallelism needs a mesh with the axis "
                     f"{axis_name!r} (give mesh= or call under jax.set_mesh); "
                     f"the mesh has axes {names}")
  return int(mesh.shape[axis_name])


def local_length(length: int, parts: int, axis_name: str,
                 name: str = "T") -> int:
  """``T / P`` tokens per device; ``ValueError`` unless ``P`` divides ``T``."""
  if length % parts:
    raise ValueError(f"context parallelism splits the sequence evenly over the "
                     f"{parts} devices of mesh axis {axis_name!r}, so {name} "
                     f"must be a multiple of {parts}; got {name} = {length}")
  return length // parts


def map_sequence(fn: Callable, split, whole, *, axis_name: str, mesh=None):
  """``fn(split, whole) -> (split_out, whole_out)`` on every device.

  ``split``: a pytree of ``[B, T, ...]`` arrays, each device getting its
  ``[B, T / P, ...]`` block; ``whole``: a pytree every device gets whole
  (states, parameters). Of the results, ``split_out`` (``[B, T / P, ...]``
  per device) is reassembled along T, and ``whole_out`` must be the same on
  every device. Manual over ``axis_name`` only. ``check_vma`` is off: the
  chunk forms start their scans from fresh zeros, which would not type
  check against varying values.
  """
  along = PartitionSpec(None, axis_name)
  return jax.shard_map(fn, mesh=mesh, in_specs=(along, PartitionSpec()),
                       out_specs=(along, PartitionSpec()),
                       axis_names={axis_name}, check_vma=False)(split, whole)


def device_index(axis_name: str):
  return jax.lax.axis_index(axis_name)


def document_starts(segment_ids, axis_name: str):
  """``[P, B]`` bool: True where device q's first token starts a document.

  ``segment_ids: [B, L]`` of this device, or None (then None). Device 0
  never starts one (the initial state belongs to its first document). One
  all-gather of two ids per row and device.
  """
  if segment_ids is None:
    return None
  ends = jnp.stack([segment_ids[:, 0], segment_ids[:, -1]], axis=-1)
  ends = jax.lax.all_gather(ends, axis_name)                    # [P, B, 2]
  first, last = ends[..., 0], ends[..., 1]
  starts = first[1:] != last[:-1]                               # [P-1, B]
  return jnp.concatenate([jnp.zeros_like(starts[:1]), starts], axis=0)


def _zero_rows(mask, state):
  """``state`` (leading axis B) set to 0 where ``mask [B]``."""
  return jnp.where(mask.reshape((-1,) + (1,) * (state.ndim - 1)), 0.0, state)


def carry_states(own, transition, apply: Callable, initial_state, starts, *,
                 axis_name: str):
  """Step 2: the state entering this device, and the final state.

  Args:
    own: this device's final state from a zero state (``R_p``).
    transition: this device's transition (``M_p``), any pytree.
    apply: ``(transition, state) -> state``, the linear map ``M S``.
    initial_state: the state before the first token, or None for zeros.
    starts: ``document_starts`` or None.
  Returns:
    ``(entering, final)``: ``S_p`` for this device and ``S_P``, the state
    after the last token (the same on every device).
  """
  owns, transitions = jax.lax.all_gather((own, transition), axis_name)
  state0 = (jnp.zeros_like(own) if initial_state is None
            else jnp.asarray(initial_state, own.dtype))
  if starts is None:
    starts = jnp.zeros((owns.shape[0], own.shape[0]), bool)

  def combine(state, xs):
    own_q, transition_q, start_q = xs
    entering = _zero_rows(start_q, state)
    return apply(transition_q, entering) + own_q, entering

  final, entering = jax.lax.scan(combine, state0, (owns, transitions, starts))
  return entering[device_index(axis_name)], final


def run_with_state_read(run: Callable, v, key_dim: int):
  """One chunk-form run that also yields how the entering state is read.

  For a recurrence ``S_t = A_t S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t``
  whose transitions ``A_t [K, K]`` come from the keys and gates only (the
  delta rule, RWKV-7), everything is linear in the values and the initial
  state: a run on values ``[v | 0]`` (``K`` extra columns) from the state
  ``[0 | I]`` gives, in its first ``V`` columns, the outputs and final state
  from a zero state and, in the extra ones, ``M_{<=t}^T q_t`` (the read of
  the entering state by token t) and ``M_p`` (the product of every
  ``A_t``). So the device's true outputs are ``o + reads . S_p``, for the
  ``S_p`` that the combine gives later.

  Args:
    run: ``(values [B, L, H, V + K], initial_state [B, H, K, V + K]) ->
      (o, final state)``.
    v: ``[B, L, H, V]``.
  Returns:
    ``(o [B, L, H, V], reads [B, L, H, K], R_p [B, H, K, V], M_p [B, H, K,
    K])``, float32 (the values are float32, so the reads are not rounded
    to v's dtype).
  """
  b, length, h, dv = v.shape
  values = jnp.concatenate(
      [jnp.asarray(v, jnp.float32),
       jnp.zeros((b, length, h, key_dim), jnp.float32)],
      axis=-1)                                                  # [B,L,H,V+K]
  eye = jnp.broadcast_to(jnp.eye(key_dim, dtype=jnp.float32),
                         (b, h, key_dim, key_dim))
  state0 = jnp.concatenate(
      [jnp.zeros((b, h, key_dim, dv), jnp.float32), eye], axis=-1)
  o, final = run(values, state0)                                # [..., V+K]
  return o[..., :dv], o[..., dv:], final[..., :dv], final[..., dv:]


def add_state_read(o, reads, entering):
  """``o + reads . S``: ``o [B, L, H, V]``, ``reads [B, L, H, K]``,
  ``entering [B, H, K, V]``."""
  return o + jnp.einsum("blhk,bhkv->blhv", reads, entering,
                        preferred_element_type=jnp.float32)


def split_with_state_read(run: Callable, v, key_dim: int, initial_state,
                          segment_ids, *, axis_name: str):
  """Steps 1-3 for a core whose transitions ignore the values, on one
  device: ``run_with_state_read``, the all-gather and combine of its
  ``(R_p, M_p)``, and the entering state's contribution.

  Returns ``(o [B, L, H, V] in v's dtype, final state)``.
  """
  o, reads, own, transition = run_with_state_read(run, v, key_dim)
  entering, final = carry_states(own, transition, apply_matrix,
                                 initial_state,
                                 document_starts(segment_ids, axis_name),
                                 axis_name=axis_name)
  return add_state_read(o, reads, entering).astype(v.dtype), final



def split_state_read_form(chunk_form: Callable, inputs: tuple, *,
                          value_index: int, length: int, key_dim: int,
                          initial_state, output_final_state: bool,
                          segment_ids, axis_name: str, mesh=None,
                          widen: Callable | None = None, **options):
  """A chunk form whose transitions ignore the values, with T split over
  the devices of ``axis_name`` (``split_with_state_read`` on every device).

  Args:
    chunk_form: ``chunk_form(*inputs, initial_state=, output_final_state=,
      segment_ids=, **options) -> (o, final state)``.
    inputs: the form's leading ``[B, T, ...]`` arguments, validated;
      ``inputs[value_index]`` is ``v [B, T, H, V]``.
    length: ``T``; key_dim: ``K``, the state's key width.
    widen: ``(device_inputs, key_dim) -> device_inputs`` for the run with
      ``K`` extra value columns (a value-width gate gets ``K`` columns of
      its own), or None.
    options: passed to ``chunk_form`` on every device.
  Returns:
    ``(o [B, T, H, V] in v's dtype, final state [B, H, K, V] or None)``.
  """
  local_length(length, axis_size(axis_name, mesh), axis_name)

  def device(split, whole):
    *local, ids = split
    (initial,) = whole
    if widen is not None:
      local = list(widen(tuple(local), key_dim))

    def run(values, state0):
      args = list(local)
      args[value_index] = values
      return chunk_form(*args, initial_state=state0, output_final_state=True,
                        segment_ids=ids, **options)

    o, final = split_with_state_read(run, local[value_index], key_dim,
                                     initial, ids, axis_name=axis_name)
    return o, (final if output_final_state else None)

  return map_sequence(device, tuple(inputs) + (segment_ids,),
                      (initial_state,), axis_name=axis_name, mesh=mesh)

def apply_matrix(transition, state):
  """``M S`` for ``M [B, H, K, K]`` and ``S [B, H, K, V]``."""
  return jnp.einsum("bhkl,bhlv->bhkv", transition, state,
                    preferred_element_type=jnp.float32)


def previous_tokens(x, width: int, axis_name: str):
  """The last ``width`` entries along axis 1 of the previous device.

  ``x: [B, L, ...]`` with ``L >= width``; zeros on device 0. One
  ``ppermute`` of ``[B, width, ...]``.
  """
  parts = jax.lax.axis_size(axis_name)
  tail = x[:, x.shape[1] - width:]
  return jax.lax.ppermute(tail, axis_name,
                          [(i, i + 1) for i in range(parts - 1)])


def first_device(axis_name: str):
  """True on device 0 of ``axis_name`` (a traced scalar)."""
  return device_index(axis_name) == 0


def from_last_device(x, axis_name: str):
  """``x`` of the last device, on every device (one all-reduce)."""
  last = device_index(axis_name) == jax.lax.axis_size(axis_name) - 1
  return jax.lax.psum(jnp.where(last, x, jnp.zeros_like(x)), axis_name)
