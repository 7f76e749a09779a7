"""Joining a multi-process run (TPU pod slices, GPU clusters, local CPUs).

``initialize()`` calls ``jax.distributed.initialize`` when the process is
one of several, and does nothing in a single-process run, so the same
program runs on one CPU, on eight fake CPU devices, on several local CPU
processes and on a pod slice:

- explicit: ``coordinator_address``, ``num_processes`` and ``process_id``
  (arguments, or the environment variables ``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``); on CPU the processes talk
  through gloo collectives over TCP;
- managed clusters that JAX detects by itself: a Cloud TPU VM of a
  multi-host slice (``TPU_WORKER_HOSTNAMES`` lists several workers), SLURM
  with several tasks, Open MPI.
"""

from __future__ import annotations

import os

import jax


def _managed_cluster() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
    return True
  return "OMPI_MCA_orte_hnp_uri" in os.environ


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Joins the run's other processes; True when this is a multi-process
  run. Must be called before anything touches a JAX device."""
  if jax.distributed.is_initialized():
    return True
  env = os.environ
  coordinator_address = coordinator_address or env.get(
      "JAX_COORDINATOR_ADDRESS")
  if num_processes is None and env.get("JAX_NUM_PROCESSES"):
    num_processes = int(env["JAX_NUM_PROCESSES"])
  if process_id is None and env.get("JAX_PROCESS_ID"):
    process_id = int(env["JAX_PROCESS_ID"])
  given = (coordinator_address, num_processes, process_id)
  if all(v is not None for v in given):
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(f"process_id {process_id} is not in [0, "
                       f"{num_processes})")
    if num_processes == 1:
      return False
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes,
                               process_id=process_id)
    return True
  if any(v is not None for v in given[1:]):
    raise ValueError("a multi-process run needs coordinator_address, "
                     "num_processes and process_id together; got "
                     f"{dict(zip(('coordinator_address', 'num_processes', 'process_id'), given))}")
  if _managed_cluster():
    jax.distributed.initialize()
    return True
  return False
