"""What a result file says about the machine: the device (GPU or CPU), torch, CUDA and Python versions; the CPUs' cores,
stolen time and where a process's threads run."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
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


def cpu_list(text: str) -> list[int]:
    """The CPUs of a kernel CPU list (``"0-3,8,10-11"``, cpuset(7)'s list format), in order."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus += range(int(low), int(high or low) + 1)
    return cpus


def cpu_cores(cpus: list[int] | None = None, sysfs: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cpus`` (default: the CPUs this process may use) grouped by physical core: per CPU, the ones of its
    ``cpuN/topology/thread_siblings_list`` among ``cpus`` (SMT siblings), cores ordered by their lowest CPU, every
    CPU in exactly one. A CPU whose list cannot be read is a core of its own (no SMT known)."""
    wanted = sorted(set(cpus if cpus is not None else os.sched_getaffinity(0)))
    placed: set[int] = set()
    cores = []
    for cpu in wanted:  # each CPU in one core, the first list that names it (lists that disagree lose no CPU)
        if cpu in placed:
            continue
        try:
            siblings = cpu_list((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = [cpu]
        core = sorted((set(siblings) & set(wanted) | {cpu}) - placed)
        placed |= set(core)
        cores.append(core)
    return cores


def cpu_groups(workers: int, cores: list[list[int]] | None = None, mode: str = "shares") -> list[list[int]]:
    """CPUs for ``workers`` processes from ``cores`` (the CPUs grouped by physical core; default
    :func:`cpu_cores`), cores in order of their lowest CPU. ``mode`` ``shares``: each worker its own contiguous run
    of whole cores, as many cores each (the remainder left out; the CPU counts differ where some cores have more
    threads than others), so no two workers share a core; with fewer cores than workers the CPUs are split
    instead (siblings may then go to different workers), and with fewer CPUs than workers each gets one CPU,
    shared in turn. ``cores``: every worker the same CPUs, the first thread of every core -- for workers that run
    one at a time, whose busy threads then never share a core.

    Raises:
        ValueError: ``workers`` < 1, no CPU, or an unknown ``mode``.
    """
    cores = sorted(sorted(core) for core in (cores if cores is not None else cpu_cores()) if core)
    cpus = sorted(cpu for core in cores for cpu in core)
    if workers < 1 or not cpus or mode not in ("shares", "cores"):
        raise ValueError(f"cpu_groups: {workers} workers over cores {cores}, mode {mode!r}")
    if mode == "cores":
        return [[core[0] for core in cores] for _ in range(workers)]
    if len(cores) >= workers:
        size = len(cores) // workers
        return [sorted(cpu for core in cores[i * size:(i + 1) * size] for cpu in core) for i in range(workers)]
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


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a proc(5) ``stat`` file after the command name (any bytes, spaces and parentheses too, cut to
    15 bytes, perhaps inside a UTF-8 character): ``[0]`` is field 3 (state); None where it cannot be read (the task
    ended)."""
    try:
        return path.read_bytes().rsplit(b")", 1)[1].decode("ascii").split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def thread_cpu(root: int | None = None, proc: Path = Path("/proc")) -> dict[int, tuple[float, int]]:
    """Every thread of process ``root`` (default: this one) and of its descendants: thread id -> (CPU seconds it
    has used, user and system; the CPU it last ran on), from ``/proc/<pid>/task/<tid>/stat`` (proc(5): fields 14
    utime, 15 stime in ``USER_HZ`` ticks, 39 processor). Threads and processes that end while it reads are left out;
    {} without ``proc``."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in proc.glob("[0-9]*"):
        fields = _stat_fields(entry / "stat")
        if fields and entry.name.isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tick = os.sysconf("SC_CLK_TCK")
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        for task in (proc / str(pid) / "task").glob("[0-9]*"):
            fields = _stat_fields(task / "stat")
            if fields and len(fields) > 36 and task.name.isdigit():
                out[int(task.name)] = ((int(fields[11]) + int(fields[12])) / tick, int(fields[36]))
    return out


#: What :func:`gpu_clocks` samples every second (``nvidia-smi --help-query-gpu`` names them).
GPU_CLOCK_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"


@contextmanager
def gpu_clocks(path: Path | None, tool: str = "nvidia-smi") -> Iterator[None]:
    """While the block runs, ``tool`` writes :data:`GPU_CLOCK_FIELDS` of every GPU once a second to ``path`` (CSV
    with a header); it is stopped when the block ends, however it ends (the process is this one's child: nothing
    matches command lines). Nothing with ``path`` None.

    Raises:
        FileNotFoundError: ``tool`` is not on ``PATH`` (from starting it, before the block runs).
    """
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([tool, f"--query-gpu={GPU_CLOCK_FIELDS}", "--format=csv", "-l", "1", "-f", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
