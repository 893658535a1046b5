"""vLLM's Ray executor on its CPU backend: one placement-group bundle per CPU worker, sized and bound as vLLM's
multiprocessing executor binds that worker (patch ``0021-cpu-ray-executor``, through ``kimi.hooks.cpu_ray_executor``;
on both lines: vLLM's own CPU platform on the v0.32 line, the torch-only one on the mainline).

Upstream (the v0.32 line's vLLM) refuses Ray on CPU right after ``ray.init`` ("current platform cpu does not
support ray": ``CpuPlatform`` keeps the empty ``ray_device_key`` of ``Platform``; vllm#21602, closed as stale). The
patch names Ray's ``CPU`` resource as the CPU platform's device and calls this module where a CPU worker differs from
a GPU one:

* **How many CPUs a worker's bundle holds** (:func:`cpus_per_worker`). A GPU worker's bundle is one GPU. A CPU
  worker runs its OpenMP threads on a group of cores, chosen by ``VLLM_CPU_OMP_THREADS_BIND`` (``vllm/envs.py``):
  an explicit list per local rank (``"0-31|32-63"``), ``auto`` (one NUMA node per worker,
  ``OMPProcessManager._get_autobind_cpu_ids``) or ``nobind``. The bundle asks Ray for as many CPUs as that group
  has (the largest explicit group; the logical CPUs of one NUMA node for ``auto``; one for ``nobind``), so that
  Ray's ``PACK`` placement puts no more workers on a node than it has cores for, as GPUs per node do for GPU
  workers. A bundle of one CPU per worker would put every worker of a multi-node layout on the head node.
* **What the actor takes** (:func:`actor_resources`): those CPUs, as ``num_cpus`` (Ray refuses ``CPU`` in
  ``resources``).
* **Which accelerator ids Ray assigned** (:func:`accelerator_ids`): Ray lists none for ``CPU``; a CPU worker has
  no device to select.
* **Which cores the worker runs on** (:func:`bind_worker`): once the executor knows where Ray placed each actor,
  each worker binds itself to its local rank's group, computed by vLLM's own ``OMPProcessManager`` for the number
  of workers on *its* node (the multiprocessing executor sets the same group as OpenMP environment variables of
  the process it spawns; a Ray actor's process exists already, so the worker sets its CPU affinity and torch's
  thread count instead).

Only the default Ray executor, ``RayExecutorV2`` (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1``), is taken to CPU; the
compiled-graph ``RayDistributedExecutor`` is refused there before Ray starts (:func:`refuse_compiled_graph_executor`).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

#: Ray's resource name for CPUs, used as the CPU platform's ``ray_device_key``.
CPU = "CPU"


def cpus_per_worker(bind: str | None = None) -> int:
    """The CPUs one CPU worker's placement-group bundle holds, from ``VLLM_CPU_OMP_THREADS_BIND`` (``bind``, default
    vLLM's reading of the environment): the largest ``|``-separated group of an explicit list (``"0,1|2-3"``: 2),
    the allowed logical CPUs of the first NUMA node this process may use for ``auto``, 1 for ``nobind``.

    Raises:
        ValueError: an explicit list that names no CPU, with the variable's value.
    """
    from vllm import envs
    from vllm.utils import cpu_resource_utils

    bind = envs.VLLM_CPU_OMP_THREADS_BIND if bind is None else bind
    if bind == "nobind":
        return 1
    if bind == "auto":
        cpus = cpu_resource_utils.get_allowed_cpu_list()
        first = min(cpu.numa_node for cpu in cpus)
        return sum(1 for cpu in cpus if cpu.numa_node == first)
    groups = [cpu_resource_utils.parse_id_list(group) for group in bind.split("|")]
    if not all(groups):
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND={bind!r} has a group without CPU ids; give one group of CPU "
                         "ids per local worker, joined by '|' (e.g. '0-15|16-31'), or 'auto'.")
    return max(len(group) for group in groups)


def bundle() -> dict[str, float]:
    """One CPU worker's placement-group bundle: ``{"CPU": cpus_per_worker()}``."""
    return {CPU: float(cpus_per_worker())}


def actor_resources() -> dict[str, Any]:
    """The Ray actor options of one CPU worker: the CPUs of its bundle, no GPU."""
    return {"num_cpus": cpus_per_worker(), "num_gpus": 0}


def accelerator_ids(assigned: dict[str, list[Any]]) -> list[Any]:
    """The ids in ``ray.get_runtime_context().get_accelerator_ids()`` (``assigned``) for the CPU platform: none
    (Ray lists accelerators only)."""
    return list(assigned.get(CPU, []))


def assigned_nodes(assigned: list[int] | None) -> list[int] | None:
    """What the CPU platform's ``parallel_config.assigned_physical_gpu_ids`` (the NUMA nodes a CPU worker may use,
    ``vllm/utils/cpu_resource_utils.py:get_visible_memory_node``) holds once Ray placed the workers: the executor
    gathers it from the accelerator ids Ray assigned, none for ``CPU`` (:func:`accelerator_ids`), and an empty list
    leaves the worker no memory node ("Node 0 is not in available memory nodes []", then an ``IndexError`` in
    ``CPUWorker.__init__``); None instead, every node this process may use (``CPU_VISIBLE_MEMORY_NODES``), as
    without Ray. A non-empty list is kept."""
    return list(assigned) if assigned else None


def worker_cpus(vllm_config: Any, local_rank: int, local_world_size: int) -> list[int]:
    """The CPU ids worker ``local_rank`` of the ``local_world_size`` workers Ray placed on this node runs on, as
    vLLM's ``OMPProcessManager`` chooses them for a node with that many workers (``VLLM_CPU_OMP_THREADS_BIND``);
    ``[]`` with ``nobind``."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    parallel = vllm_config.parallel_config
    # the mainline's vLLM: its manager also reads the NUMA nodes assigned to the worker (see assigned_nodes)
    nodes = assigned_nodes(getattr(parallel, "assigned_physical_gpu_ids", None))
    node = SimpleNamespace(  # the config as OMPProcessManager reads it, with this node's worker count
        parallel_config=SimpleNamespace(local_world_size=local_world_size,
                                        data_parallel_rank_local=parallel.data_parallel_rank_local,
                                        _api_process_count=parallel._api_process_count,
                                        assigned_physical_gpu_ids=nodes),
        kv_transfer_config=vllm_config.kv_transfer_config)
    lists = OMPProcessManager(node).cpu_lists
    return list(lists[local_rank]) if lists else []


def bind_worker(vllm_config: Any, local_rank: int, local_world_size: int) -> list[int]:
    """Bind this Ray actor's process (CPU affinity, ``OMP_NUM_THREADS``, torch's intra-op threads) to its group
    (:func:`worker_cpus`) before the CPU worker is built; returns the CPU ids (``[]``: left as Ray started it)."""
    import torch

    cpus = worker_cpus(vllm_config, local_rank, local_world_size)
    if cpus:
        os.sched_setaffinity(0, cpus)
        os.environ["OMP_NUM_THREADS"] = str(len(cpus))
        torch.set_num_threads(len(cpus))
    return cpus


def refuse_compiled_graph_executor() -> None:
    """Refuse vLLM's compiled-graph Ray executor (``RayDistributedExecutor``) on the CPU backend, before Ray starts.

    Raises:
        ValueError: naming the fix, ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1`` (vLLM's default).
    """
    raise ValueError("vLLM's compiled-graph Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) does not run on the "
                     "CPU backend. Fix: unset VLLM_USE_RAY_V2_EXECUTOR_BACKEND (or set it to 1) to use RayExecutorV2, "
                     "which does, or --distributed-executor-backend mp on one host.")
