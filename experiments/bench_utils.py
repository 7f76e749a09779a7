"""Timing and results-file helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import re
import statistics
import time

import jax
import jax.numpy as jnp


def interleaved_min_times(fns, repeats: int):
  """Minimum wall time of each ``fn()`` of ``fns`` (a dict) over ``repeats``
  rounds. A round gives every function one turn: an untimed call, then a
  timed one. On a shared machine a slow spell then hits every function of a
  round alike, and the minimum is the least disturbed run; the untimed call
  first keeps a function from paying for the memory that the one before it
  released (fresh pages fault in on first touch)."""
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      jax.block_until_ready(fn())
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return {name: min(ts) for name, ts in times.items()}


def compile_form(spec, form_name, inputs, chunk_size, options=None):
  """Returns (fwd run, fwd+bwd run, fwd temp bytes, fwd+bwd temp bytes);
  a run is a no-argument call of the compiled function. ``options``: more
  keyword arguments of the form (replacing the registry's own, such as
  MoBA's ``block_size``)."""
  form = spec.forms[form_name]
  kwargs = dict(options or {})
  if form_name in spec.chunked:
    kwargs["chunk_size"] = chunk_size
  diff_names = [n for n in spec.grad_args if inputs.get(n) is not None]
  fixed = {n: x for n, x in inputs.items() if n not in diff_names}

  def forward(*diff):
    o, state = form(**fixed, **dict(zip(diff_names, diff)),
                    output_final_state=True, **kwargs)
    return o, state

  def loss(*diff):
    o, state = forward(*diff)
    total = jnp.sum(o.astype(jnp.float32))
    # The softmax family's forms keep no state (None).
    return total if state is None else total + jnp.sum(state)

  grad = jax.grad(loss, argnums=tuple(range(len(diff_names))))
  args = [inputs[n] for n in diff_names]
  fwd = jax.jit(forward).lower(*args).compile()
  bwd = jax.jit(grad).lower(*args).compile()
  return (lambda: fwd(*args), lambda: bwd(*args),
          fwd.memory_analysis().temp_size_in_bytes,
          bwd.memory_analysis().temp_size_in_bytes)


def median_time(fn, args, repeats: int, warmup: int = 1) -> float:
  """Median wall time of ``fn(*args)`` over ``repeats`` runs, after
  ``warmup`` untimed runs (the first compiles)."""
  for _ in range(max(warmup, 1)):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def write_section(path: str, key: str, lines) -> None:
  """Puts ``lines`` between ``<!-- begin key -->`` and ``<!-- end key -->``
  in the markdown file ``path``, replacing an earlier section of that key."""
  begin, end = f"<!-- begin {key} -->", f"<!-- end {key} -->"
  section = "\n".join([begin, *lines, end])
  text = open(path).read() if os.path.exists(path) else "# Results\n"
  pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
  if pattern.search(text):
    text = pattern.sub(lambda _: section, text)
  else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
  with open(path, "w") as f:
    f.write(text)


def cpu_devices(count: int) -> None:
  """Gives the CPU backend ``count`` devices unless ``XLA_FLAGS`` already
  sets a number; call it before anything touches a device."""
  if "xla_force_host_platform_device_count" not in os.environ.get(
      "XLA_FLAGS", ""):
    jax.config.update("jax_num_cpu_devices", count)
