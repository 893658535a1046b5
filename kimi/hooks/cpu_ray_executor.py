"""Hook of patch ``cpu-ray-executor``: vLLM's Ray executor on its CPU backend, one placement-group bundle per CPU
worker; the logic is :mod:`kimi.cpu_platform.ray_workers`."""

from __future__ import annotations

from typing import Any


def bundle() -> dict[str, float]:
    """``initialize_ray_cluster``'s bundle for one CPU worker: :func:`kimi.cpu_platform.ray_workers.bundle`."""
    from kimi.cpu_platform.ray_workers import bundle as of_worker

    return of_worker()


def actor_resources() -> dict[str, Any]:
    """The Ray actor options of one CPU worker: :func:`kimi.cpu_platform.ray_workers.actor_resources`."""
    from kimi.cpu_platform.ray_workers import actor_resources as of_worker

    return of_worker()


def accelerator_ids(assigned: dict[str, list[Any]]) -> list[Any]:
    """The worker's accelerator ids among Ray's ``assigned``: :func:`kimi.cpu_platform.ray_workers.accelerator_ids`."""
    from kimi.cpu_platform.ray_workers import accelerator_ids as of_worker

    return of_worker(assigned)


def assigned_nodes(assigned: list[int] | None) -> list[int] | None:
    """Called where the Ray executor sets a CPU worker's ``assigned_physical_gpu_ids``:
    :func:`kimi.cpu_platform.ray_workers.assigned_nodes`."""
    from kimi.cpu_platform.ray_workers import assigned_nodes as nodes

    return nodes(assigned)


def bind_worker(vllm_config: Any, local_rank: int, local_world_size: int) -> list[int]:
    """Called by the Ray worker before the CPU worker is built: :func:`kimi.cpu_platform.ray_workers.bind_worker`."""
    from kimi.cpu_platform.ray_workers import bind_worker as bind

    return bind(vllm_config, local_rank, local_world_size)


def refuse_compiled_graph_executor() -> None:
    """Called where the compiled-graph Ray executor would start on CPU:
    :func:`kimi.cpu_platform.ray_workers.refuse_compiled_graph_executor`."""
    from kimi.cpu_platform.ray_workers import refuse_compiled_graph_executor as refuse

    refuse()
