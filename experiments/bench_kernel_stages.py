"""The GPU gated-linear kernels stage by stage, for a few tile settings.

Times each kernel of ``pallas_kernels.gated_linear.gpu`` on its own (the
forward state sweep, the outputs, the reverse sweep, ``dv``, ``dq``/``dk``)
and the whole forward+backward of ``chunk_gated_linear_attention``, for
every ``--variants`` setting of warps and pipelining stages, so that the
defaults of ``BlockSizes`` can be chosen by measurement. Needs a CUDA GPU.

  python -m experiments.bench_kernel_stages --gates=scalar,channel \
      --length=8192 --variants=4:1,4:2,8:2 --out=stages.md
"""

from __future__ import annotations

import dataclasses
import functools

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from experiments.bench_utils import median_time
from pallas_kernels.gated_linear import BlockSizes, gpu
from pallas_kernels.gated_linear import chunk_gated_linear_attention

FLAGS = flags.FLAGS
flags.DEFINE_list("gates", ["scalar", "channel"], "Gate kinds: none, "
                  "scalar (simple GLA) or channel (GLA).")
flags.DEFINE_integer("batch", 8, "B.")
flags.DEFINE_integer("length", 8192, "T.")
flags.DEFINE_integer("heads", 16, "H.")
flags.DEFINE_integer("dim", 128, "K = V.")
flags.DEFINE_list("variants", ["4:1", "4:2", "8:2"],
                  "num_warps:num_stages settings to time.")
flags.DEFINE_integer("iters", 10, "Timed runs (median reported).")
flags.DEFINE_integer("warmup", 2, "Untimed runs first.")
flags.DEFINE_string("out", "", "Also write the table here.")
flags.DEFINE_bool("interpret", False, "Run the kernels in interpret mode "
                  "(to check this script on a CPU at tiny sizes; the times "
                  "then mean nothing).")


def _inputs(gate, b, t, h, d):
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  q, k, v, do = (jax.random.normal(key, (b, t, h, d), jnp.bfloat16)
                 for key in keys[:4])
  shape = {"none": None, "scalar": (b, t, h, 1), "channel": (b, t, h, d)}
  g = None
  if shape[gate] is not None:
    g = jax.nn.log_sigmoid(jax.random.normal(keys[4], shape[gate])) / 16.0
  return q, k, v, g, do


def _stages(blocks, q, k, v, g, do):
  """``{stage: (jitted fn, args)}`` of every kernel on its own."""
  lay, spec = gpu.setup(q, k, v, g, None, blocks, q.shape[-1] ** -0.5)
  arrays = jax.jit(functools.partial(gpu.prepare, lay=lay, spec=spec))(
      q, k, v, g, None, do=do)
  common = dict(spec=spec, lay=lay, interpret=FLAGS.interpret)

  def states(arrays):
    return gpu.sweep(arrays, reverse=False, state_in=None, state_out=False,
                     states_dtype=jnp.bfloat16,
                     cost=gpu.cost(spec, lay, "sweep", arrays.values()),
                     **common)["states"]

  def state_grads(arrays):
    return gpu.sweep(arrays, reverse=True, state_in=None, state_out=False,
                     states_dtype=jnp.bfloat16,
                     cost=gpu.cost(spec, lay, "sweep", arrays.values()),
                     **common)["states"]

  h_ = jax.jit(states)(arrays)
  dh = jax.jit(state_grads)(arrays)

  def outputs(arrays, h_):
    return gpu.outputs(arrays, h_, out_dtype=jnp.bfloat16,
                       cost=gpu.cost(spec, lay, "outputs", arrays.values()),
                       **common)

  def grads(arrays, h_, dh):
    return gpu.grads(arrays, h_, dh, **common)

  return {"states": (jax.jit(states), (arrays,)),
          "outputs": (jax.jit(outputs), (arrays, h_)),
          "state_grads": (jax.jit(state_grads), (arrays,)),
          "dv + dqk": (jax.jit(grads), (arrays, h_, dh))}


def _whole(blocks, q, k, v, g, do):
  def forward(q, k, v, g):
    return chunk_gated_linear_attention(q, k, v, g, backend="gpu",
                                        block_sizes=blocks,
                                        interpret=FLAGS.interpret)[0]

  def forward_backward(q, k, v, g, do):
    o, vjp = jax.vjp(forward, q, k, v, g)
    return o, vjp(do)

  return ((jax.jit(forward), (q, k, v, g)),
          (jax.jit(forward_backward), (q, k, v, g, do)))


def main(argv):
  del argv
  b, t, h, d = FLAGS.batch, FLAGS.length, FLAGS.heads, FLAGS.dim
  lines = [f"{jax.devices()[0].device_kind}, jax {jax.__version__}, B={b}, "
           f"T={t}, H={h}, K=V={d}, bfloat16; median of {FLAGS.iters} runs "
           f"after {FLAGS.warmup}, ms.", "",
           "| gate | warps:stages | states | outputs | state_grads | "
           "dv + dqk | fwd | fwd+bwd |", "|---|---|---|---|---|---|---|---|"]
  for gate in FLAGS.gates:
    q, k, v, g, do = _inputs(gate, b, t, h, d)
    for variant in FLAGS.variants:
      warps, stages = (int(x) for x in variant.split(":"))
      blocks = dataclasses.replace(
          BlockSizes.default("gpu", per_channel=gate == "channel"),
          num_warps=warps, num_stages=stages)
      cells = [gate, variant]
      try:
        timed = _stages(blocks, q, k, v, g, do)
        fwd, fwd_bwd = _whole(blocks, q, k, v, g, do)
        timed["fwd"], timed["fwd+bwd"] = fwd, fwd_bwd
        for name, (fn, args) in timed.items():
          seconds = median_time(fn, args, FLAGS.iters, FLAGS.warmup)
          cells.append(f"{1e3 * seconds:.2f}")
      except Exception as error:  # noqa: BLE001 (reported in the table)
        cells.append(f"{type(error).__name__}: "
                     f"{str(error).splitlines()[0][:150]}")
      lines.append("| " + " | ".join(cells) + " |")
      print(lines[-1], flush=True)
      if FLAGS.out:
        with open(FLAGS.out, "w") as f:
          f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
