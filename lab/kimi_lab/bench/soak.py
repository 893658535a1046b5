"""``benchmarks/soak.py``'s library: resident memory of a ``vllm serve`` process tree under rounds of kept and
aborted streams, and the verdict on its curve.

One round is ``kept`` streaming completions read to the end and ``aborted`` streaming completions whose HTTP
response is closed after ``abort_after`` chunks, all at once, through the official ``openai`` client
(``AsyncOpenAI``). After each round the resident memory of the server's process tree is read from ``/proc``:
``VmRSS`` of ``/proc/<pid>/status`` and ``Pss`` of ``/proc/<pid>/smaps_rollup`` (where readable), per process
(the API server, its engine core child and any other descendant), in MB (10^6 bytes).

The pure parts (:func:`tree_pids`, :func:`tree_memory`, :func:`growth`, :func:`verdict`) take a ``/proc`` folder
so that tests can give them a fake one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from kimi.models.prompts import code_prompts

#: Prompts in the pool the rounds draw from (the held-out code has 55).
PROMPT_POOL = 48
#: Second-half growth below this share of the first half's counts as a plateau.
PLATEAU_SHARE = 0.10
#: ... or below this many MB (10^6 bytes) for the whole second half (the size of RSS's own noise on this run).
PLATEAU_FLOOR_MB = 8.0


def _ppid(stat_text: str) -> int | None:
    """The parent pid in a ``/proc/<pid>/stat`` line (field 4, after the ``(comm)`` that may hold spaces)."""
    try:
        return int(stat_text[stat_text.rindex(")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def tree_pids(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and every descendant of it that is alive in ``proc``, root first, then by pid (from the parent
    pid of each ``/proc/<pid>/stat``)."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                ppid = _ppid((entry / "stat").read_text())
            except OSError:
                continue
            if ppid is not None:
                parents[int(entry.name)] = ppid
    found, frontier = [root], [root]
    while frontier:
        children = sorted(pid for pid, ppid in parents.items() if ppid in frontier and pid not in found)
        found += children
        frontier = children
    return found


def _kb_field(text: str, name: str) -> int | None:
    """The ``name:   N kB`` value of a ``/proc`` status or smaps text, in kB; None when absent."""
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return None


def process_memory(pid: int, proc: Path = Path("/proc")) -> dict | None:
    """``{"pid", "name", "rss_mb", "pss_mb"}`` of one process (MB = 10^6 bytes; ``pss_mb`` None where
    ``smaps_rollup`` is not readable); None if the process is gone."""
    base = proc / str(pid)
    try:
        status = (base / "status").read_text()
    except OSError:
        return None
    rss = _kb_field(status, "VmRSS")
    name = (_kb_name(status) or "?")
    try:
        pss = _kb_field((base / "smaps_rollup").read_text(), "Pss")
    except OSError:
        pss = None
    try:
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = ""
    return {"pid": pid, "name": name, "cmd": cmdline[:80], "rss_mb": (rss or 0) * 1024 / 1e6,
            "pss_mb": None if pss is None else pss * 1024 / 1e6}


def _kb_name(status: str) -> str | None:
    for line in status.splitlines():
        if line.startswith("Name:"):
            return line.split(None, 1)[1].strip() if len(line.split()) > 1 else None
    return None


def tree_memory(root: int, proc: Path = Path("/proc")) -> dict:
    """Resident memory of ``root``'s process tree: ``{"rss_mb", "pss_mb", "processes": [process_memory...]}``,
    the totals summed over the live processes (``pss_mb`` None unless every process had one). RSS counts pages
    shared between the processes once per process; PSS splits them."""
    procs = [m for m in (process_memory(pid, proc) for pid in tree_pids(root, proc)) if m is not None]
    pss = [m["pss_mb"] for m in procs]
    return {"rss_mb": sum(m["rss_mb"] for m in procs),
            "pss_mb": None if not procs or None in pss else sum(pss), "processes": procs}


def growth(curve: list[float]) -> dict:
    """Growth of a memory curve ``[after start-up, after round 1, ..., after round R]`` (MB): ``warmup`` (start-up
    to round 1), ``first`` (round 1 to round mid = 1 + (R - 1) // 2) and ``second`` (round mid to R), and
    ``total`` (round 1 to R), in MB; ``second_share``: second / first (None when first <= 0)."""
    if len(curve) < 3:
        raise ValueError("a curve needs start-up and at least two rounds")
    rounds = len(curve) - 1
    mid = 1 + (rounds - 1) // 2
    first, second = curve[mid] - curve[1], curve[rounds] - curve[mid]
    return {"warmup": curve[1] - curve[0], "first": first, "second": second, "total": curve[rounds] - curve[1],
            "mid_round": mid, "second_share": second / first if first > 0 else None}


def plateaus(g: dict, share: float = PLATEAU_SHARE, floor_mb: float = PLATEAU_FLOOR_MB) -> bool:
    """A :func:`growth` dict's curve has flattened: its second half grew less than ``share`` of its first half,
    or less than ``floor_mb`` MB."""
    return g["second"] < floor_mb or (g["first"] > 0 and g["second"] < share * g["first"])


def verdict(curves: dict[str, list[float]], spec: str = "eagle3", base: str = "nospec",
            share: float = PLATEAU_SHARE, floor_mb: float = PLATEAU_FLOOR_MB) -> dict:
    """The verdict on each engine's curve (MB per round, as :func:`growth` takes it) and whose growth it is:
    ``{"engines": {name: {**growth, "plateaus"}}, "eagle3_only": {first, second, total}`` (``spec`` minus ``base``,
    MB, when both are there), ``"text"``: one plain sentence per engine and one for the difference."""
    engines = {name: {**growth(c), "plateaus": plateaus(growth(c), share, floor_mb)} for name, c in curves.items()}
    lines = []
    for name, g in engines.items():
        state = "plateaus" if g["plateaus"] else "still growing"
        lines.append(f"{name}: {state} (rounds 1-{g['mid_round']}: {g['first']:+.1f} MB, rounds "
                     f"{g['mid_round']}-{len(curves[name]) - 1}: {g['second']:+.1f} MB)")
    out: dict = {"engines": engines, "share": share, "floor_mb": floor_mb}
    if spec in engines and base in engines:
        diff = {k: engines[spec][k] - engines[base][k] for k in ("first", "second", "total")}
        out["eagle3_only"] = diff
        lines.append(f"EAGLE-3's own share (difference): {diff['first']:+.1f} MB in the first half, "
                     f"{diff['second']:+.1f} MB in the second")
    out["text"] = lines
    return out


def round_prompts(round_index: int, count: int) -> list[str]:
    """``count`` prompts of round ``round_index``: held-out code (:func:`kimi.models.prompts.code_prompts`), rotated
    by 7 per round (a pool of :data:`PROMPT_POOL`) so that successive rounds send different sets; the same for
    every engine."""
    pool = code_prompts(PROMPT_POOL)
    start = (round_index * 7) % len(pool)
    return [(pool * 2)[start + i] for i in range(count)]


async def _kept(client, model: str, prompt: str, max_tokens: int) -> str:
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                             stream=True)
    text = []
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
    return "".join(text)


async def _aborted(client, model: str, prompt: str, max_tokens: int, after: int) -> int:
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                             stream=True)
    seen = 0
    try:
        async for _ in stream:
            seen += 1
            if seen >= after:
                break
    finally:
        await stream.close()  # closes the HTTP response: the server sees the client go
    return seen


async def one_round(base_url: str, model: str, round_index: int, kept: int, aborted: int, kept_tokens: int,
                    aborted_tokens: int, abort_after: int) -> dict:
    """One round against ``base_url``: ``kept`` streams of ``kept_tokens`` read to the end and ``aborted`` streams
    of up to ``aborted_tokens`` closed after ``abort_after`` chunks, all sent at once, greedy. Returns
    ``{"seconds", "kept_texts", "aborted_chunks"}``."""
    from openai import AsyncOpenAI

    prompts = round_prompts(round_index, kept + aborted)
    start = time.monotonic()
    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=180.0, max_retries=0) as client:
        results = await asyncio.gather(
            *(_kept(client, model, p, kept_tokens) for p in prompts[:kept]),
            *(_aborted(client, model, p, aborted_tokens, abort_after) for p in prompts[kept:]))
    return {"seconds": time.monotonic() - start, "kept_texts": list(results[:kept]),
            "aborted_chunks": list(results[kept:])}


def wait_idle(metrics_text, bound_s: float = 30.0) -> float:
    """Poll ``metrics_text()`` (a ``/metrics`` text) until no request is running or waiting; the seconds waited
    (``bound_s`` at most)."""
    from kimi.e2e.server import metric_sums

    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        sums = metric_sums(metrics_text(), ("vllm:num_requests_running", "vllm:num_requests_waiting"))
        if not any(sums.values()):
            break
        time.sleep(0.2)
    return time.monotonic() - start


def soak(server, rounds: int, kept: int = 8, aborted: int = 8, kept_tokens: int = 48, aborted_tokens: int = 256,
         abort_after: int = 3, log=print) -> dict:
    """Run ``rounds`` rounds (:func:`one_round`) against a started ``kimi.e2e.server.VllmServer`` and read its
    process tree's memory (:func:`tree_memory`) after start-up and after each round, once the server is idle.
    Returns ``{"rounds": [{"round", "seconds", "idle_s", "rss_mb", "pss_mb", "processes"}...], "kept_texts":
    [per round], "aborted_chunks": [per round]}``; round 0 is the reading after start-up."""
    from kimi.e2e.server import request

    def metrics() -> str:
        return request(f"{server.base}/metrics", timeout=30).body

    mem = tree_memory(server.proc.pid)
    rows = [{"round": 0, "seconds": 0.0, "idle_s": 0.0, **mem}]
    texts, chunks = [], []
    for r in range(1, rounds + 1):
        got = asyncio.run(one_round(server.base, server.model, r, kept, aborted, kept_tokens, aborted_tokens,
                                    abort_after))
        idle = wait_idle(metrics)
        mem = tree_memory(server.proc.pid)
        rows.append({"round": r, "seconds": got["seconds"], "idle_s": idle, **mem})
        texts.append(got["kept_texts"])
        chunks.append(got["aborted_chunks"])
        pss = f", PSS {mem['pss_mb']:.1f} MB" if mem["pss_mb"] is not None else ""
        log(f"round {r}/{rounds}: {got['seconds']:.1f} s, RSS {mem['rss_mb']:.1f} MB{pss}")
    return {"rounds": rows, "kept_texts": texts, "aborted_chunks": chunks}


def role_curves(rows: list[dict], root: int) -> dict[str, list[float]]:
    """RSS per round (MB) of each process of the tree, from :func:`soak`'s rows: ``api_server`` (``root``) and the
    others by their name in ``/proc/<pid>/status`` (``VLLM::EngineCor``, ``VLLM::Worker``, ``python`` for the
    multiprocessing resource tracker), those of one name summed; 0 in a round where none of that name was alive."""
    names = sorted({p["name"] for row in rows for p in row["processes"] if p["pid"] != root})
    curves = {"api_server": [sum(p["rss_mb"] for p in row["processes"] if p["pid"] == root) for row in rows]}
    for name in names:
        curves[name] = [sum(p["rss_mb"] for p in row["processes"] if p["pid"] != root and p["name"] == name)
                        for row in rows]
    return curves
