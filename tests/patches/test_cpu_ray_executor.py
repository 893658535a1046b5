"""Patch 0021: vLLM's Ray executor on the CPU backend, one bundle of the worker's own CPUs per worker.

The decisions (bundle size, actor resources, accelerator ids, each worker's cores) are checked here against vLLM's
own reading of ``VLLM_CPU_OMP_THREADS_BIND``; a child process shows that a bound worker runs on its group only. The
engine runs through Ray (TP 2 lossless against TP 1, PP 2) are in ``tests/test_parallel.py`` (they need ``ray``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.install


def _config(tp: int = 2) -> SimpleNamespace:
    """What the CPU Ray workers read of a ``VllmConfig``."""
    parallel = SimpleNamespace(data_parallel_rank_local=None, _api_process_count=1, tensor_parallel_size=tp)
    return SimpleNamespace(parallel_config=parallel, kv_transfer_config=None)


def test_upstream_refused_ray_on_cpu_and_the_fork_names_rays_cpu_resource() -> None:
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import Platform

    assert Platform.ray_device_key == ""  # upstream's CpuPlatform inherits this: "does not support ray"
    assert CpuPlatform.ray_device_key == "CPU"


def test_a_cpu_worker_keeps_its_memory_nodes_where_ray_assigns_no_accelerator() -> None:
    """Ray lists no accelerator ids for CPU, so the executor gathers ``[]`` per node; handed to the worker as its
    assigned NUMA nodes, that left vLLM 0.34.0's CPUWorker none ("IndexError: list index out of range"). None keeps
    the nodes the process may use, as without Ray; nodes actually assigned are kept."""
    import inspect

    from vllm.utils.cpu_resource_utils import get_visible_memory_node

    from kimi.cpu_platform import ray_workers

    if not inspect.signature(get_visible_memory_node).parameters:
        pytest.skip("this vLLM's get_visible_memory_node() takes no assigned nodes (before 0.34.0): none to lose")
    assert get_visible_memory_node([]) == [], "vLLM reads an empty assignment as no node at all"
    assert ray_workers.assigned_nodes([]) is None and ray_workers.assigned_nodes(None) is None
    assert get_visible_memory_node(ray_workers.assigned_nodes([])) == get_visible_memory_node(None) != []
    assert ray_workers.assigned_nodes([1, 0]) == [1, 0]


@pytest.mark.parametrize(("bind", "cpus"), [("0,1|2-3", 2), ("0|1", 1), ("0-5|6,7", 6), ("nobind", 1)])
def test_a_bundle_holds_the_cpus_one_worker_binds(bind: str, cpus: int) -> None:
    from kimi.cpu_platform import ray_workers

    assert ray_workers.cpus_per_worker(bind) == cpus


def test_auto_binding_sizes_the_bundle_to_one_numa_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.utils import cpu_resource_utils
    from vllm.utils.cpu_resource_utils import LogicalCPUInfo

    from kimi.cpu_platform import ray_workers

    two_nodes = [LogicalCPUInfo(id=i, physical_core=i, numa_node=i // 4) for i in range(8)][1:]  # node 0 lost CPU 0
    monkeypatch.setattr(cpu_resource_utils, "get_allowed_cpu_list", lambda: two_nodes)
    assert ray_workers.cpus_per_worker("auto") == 3


def test_bundle_and_actor_take_the_same_cpus_and_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi.cpu_platform import ray_workers

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-2|3-5")
    assert ray_workers.bundle() == {"CPU": 3.0}
    assert ray_workers.actor_resources() == {"num_cpus": 3, "num_gpus": 0}
    assert ray_workers.accelerator_ids({}) == [] and ray_workers.accelerator_ids({"GPU": ["0"]}) == []


def test_rayexecutorv2_asks_ray_for_the_bundles_cpus_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream passed ``resources={"": n}`` here (no CPU key) after ``num_cpus=0``; Ray refuses ``CPU`` there."""
    pytest.importorskip("ray", reason="vLLM's RayExecutorV2 module needs Ray: .venv/bin/python -m pip install ray")
    from vllm.v1.executor.ray_executor_v2 import RayExecutorV2

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0,1|2,3")
    assert RayExecutorV2._get_actor_resource_kwargs() == {"num_cpus": 2, "num_gpus": 0}


def test_an_explicit_list_without_cpus_is_refused_with_the_fix() -> None:
    from kimi.cpu_platform import ray_workers

    with pytest.raises(ValueError, match=r"VLLM_CPU_OMP_THREADS_BIND='0\|'.*one group of CPU ids per local worker"):
        ray_workers.cpus_per_worker("0|")


def test_each_worker_gets_its_local_ranks_group_for_the_workers_on_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """The groups are vLLM's (OMPProcessManager) for the number of workers Ray put on this node, not the world."""
    from kimi.cpu_platform import ray_workers

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    assert [ray_workers.worker_cpus(_config(4), rank, 2) for rank in (0, 1)] == [[0], [1]]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert ray_workers.worker_cpus(_config(), 0, 2) == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs CPUs 0 and 1")
def test_a_bound_worker_process_runs_on_its_group_only() -> None:
    code = textwrap.dedent("""
        import os, torch
        from types import SimpleNamespace
        from kimi.cpu_platform.ray_workers import bind_worker
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        parallel = SimpleNamespace(data_parallel_rank_local=None, _api_process_count=1)
        cpus = bind_worker(SimpleNamespace(parallel_config=parallel, kv_transfer_config=None), 1, 2)
        print(cpus, sorted(os.sched_getaffinity(0)), os.environ["OMP_NUM_THREADS"], torch.get_num_threads())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[1] [1] 1 1"


# vLLM 0.34.0 deleted the compiled-graph RayDistributedExecutor (v1/executor/ray_executor.py) and its refusal
@pytest.mark.line("v0.32")
def test_the_compiled_graph_ray_executor_is_refused_on_cpu_before_ray_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.executor import ray_executor

    def started(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_executor, "initialize_ray_cluster", started)
    with pytest.raises(ValueError, match="compiled-graph Ray executor.*Fix: unset VLLM_USE_RAY_V2_EXECUTOR_BACKEND"):
        ray_executor.RayDistributedExecutor._init_executor(SimpleNamespace(uses_ray=True))
