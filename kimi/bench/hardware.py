"""What a result file says about the machine: the device (GPU or CPU), torch, CUDA and Python versions."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """``model name`` from /proc/cpuinfo (else the machine type) and the cores this process may use:
    ``"Intel(R) Xeon(R) ..., 16 cores"``."""
    cores = len(os.sched_getaffinity(0))
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.machine()}, {cores} cores"


def cpu_groups(workers: int, cpus: list[int] | None = None) -> list[list[int]]:
    """``cpus`` (default the CPUs this process may use) split into ``workers`` contiguous groups of equal size,
    in CPU order (the remainder left out); with fewer CPUs than workers, one CPU each, shared in turn.

    Raises:
        ValueError: ``workers`` < 1 or no CPU.
    """
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if workers < 1 or not cpus:
        raise ValueError(f"cpu_groups: {workers} workers over CPUs {cpus}")
    if len(cpus) < workers:
        return [[cpus[i % len(cpus)]] for i in range(workers)]
    size = len(cpus) // workers
    return [cpus[i * size:(i + 1) * size] for i in range(workers)]


def steal_seconds(cpus: list[int] | None = None, stat: Path = Path("/proc/stat")) -> float | None:
    """Seconds the hypervisor has kept ``cpus`` (default: the CPUs this process may run on) from running while they
    had work, summed over them since boot: the ``steal`` column (8th value) of their ``cpuN`` lines in ``stat``,
    in ``USER_HZ`` ticks (proc(5)). None where ``stat`` is missing, lacks the column (not Linux, old kernels) or
    lists none of ``cpus``."""
    wanted = set(cpus if cpus is not None else os.sched_getaffinity(0))
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks, found = 0, 0
    for line in lines:
        name, *values = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in wanted:
            if len(values) < 8:
                return None
            ticks, found = ticks + int(values[7]), found + 1
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def device() -> dict:
    """``{"torch", "python", "name", "cuda", "count"}`` plus ``memory_gib`` and ``capability`` (``"90"``) on a
    GPU (device 0); on CPU ``name`` is ``"CPU: <cpu_name()>"`` and ``cuda`` None. Imports torch."""
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(name=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}{props.minor}", cuda=torch.version.cuda,
                   count=torch.cuda.device_count())
    else:
        out.update(name=f"CPU: {cpu_name()}", cuda=None, count=0)
    return out


def describe(dev: dict, versions: bool = False) -> str | None:
    """One line for a :func:`device` dict: ``"NVIDIA H200 (139.8 GiB, sm_90)"`` (with ``versions``: then
    ``", torch X, CUDA Y"``); the name alone on CPU; None for an empty dict."""
    if not dev.get("cuda"):
        return dev.get("name")
    line = f"{dev.get('name')} ({dev.get('memory_gib')} GiB, sm_{dev.get('capability')})"
    return f"{line}, torch {dev.get('torch')}, CUDA {dev.get('cuda')}" if versions else line
