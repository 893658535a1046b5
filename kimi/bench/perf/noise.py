"""How noisy a perf_vs_upstream call's rounds are (``benchmarks/perf_vs_upstream.py --noise``): per model and
concurrency the spread of log(fork / upstream) over the rounds, whether the fork's and upstream's rates move
together, each engine's coefficient of variation and the correlation of its rates with the CPU time the
hypervisor took from it (``steal_s_rounds``, recorded since c95dd9e)."""

from __future__ import annotations

import math
import statistics


def correlation(xs: list[float | None], ys: list[float | None]) -> float | None:
    """Pearson's r over the pairs where both are known, rounded to 0.01; None with fewer than 3 such pairs or a
    constant side."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    try:
        return round(statistics.correlation(*zip(*pairs, strict=True)), 2)
    except statistics.StatisticsError:  # a constant side
        return None


def cv(rates: list[float]) -> float | None:
    """Standard deviation over mean of ``rates``, rounded to 0.001; None with fewer than 2."""
    return round(statistics.stdev(rates) / statistics.mean(rates), 3) if len(rates) > 1 else None


def noise(part: dict) -> dict:
    """The spread of one call's rounds (``part``: a ``perf_vs_upstream.json``): a row per model and concurrency
    where ``<model>/fork_k{k}`` and ``<model>/upstream_k{k}`` are both done, and ``log_ratio_sd`` over every
    row's rounds of the call. ``engines`` in a row: per engine of that model its ``cv`` and ``r_steal`` (rates
    against stolen seconds; None where not recorded)."""
    runs = {n: r for n, r in part["runs"].items() if r.get("status") == "done"}
    rows, logs = [], []
    for name, fork in runs.items():
        model, engine = name.split("/", 1)
        upstream = runs.get(f"{model}/upstream_{engine.removeprefix('fork_')}")
        if not engine.startswith("fork_k") or upstream is None:
            continue
        peers = {n.split("/", 1)[1]: r for n, r in runs.items() if n.startswith(f"{model}/")}
        for c, f in fork["by_concurrency"].items():
            u = upstream["by_concurrency"].get(c, {})
            ratios = [math.log(a / b) for a, b in zip(f["tok_s_rounds"], u.get("tok_s_rounds", []), strict=False)
                      if a and b]
            logs += ratios
            rows.append({
                "model": model, "k": int(engine.removeprefix("fork_k")), "concurrency": int(c), "rounds": len(ratios),
                "log_ratio_sd": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else None,
                "r_fork_upstream": correlation(f["tok_s_rounds"], u.get("tok_s_rounds", [])),
                "engines": {e: {"cv": cv(at["tok_s_rounds"]),
                                "r_steal": correlation(at["tok_s_rounds"], at.get("steal_s_rounds", []))}
                            for e, r in peers.items() if (at := r["by_concurrency"].get(c))},
            })
    return {"command": part.get("command"), "date": part.get("date"), "device": part.get("device"), "rows": rows,
            "log_ratio_sd": round(statistics.stdev(logs), 3) if len(logs) > 1 else None}


def markdown(calls: list[tuple[str, dict]]) -> list[str]:
    """A table of :func:`noise` results, one line per call, model and concurrency; ``calls``: (label, result)."""
    lines = ["# How noisy the rounds are (perf_vs_upstream.py --noise)", "",
             ("SD: standard deviation of log(fork/upstream) over the rounds; r: Pearson's r; CV: an engine's rate's "
              "standard deviation over its mean; r(steal): an engine's rates against the CPU seconds the hypervisor "
              "took from its CPUs in the same measurement (- where not recorded)."), "",
             "| call | model | k | c | rounds | SD | r(fork, upstream) | CV per engine | r(steal) per engine |",
             "|---|---|---|---|---|---|---|---|---|"]
    def per_engine(engines: dict, key: str) -> str:
        return ", ".join(f"{name} {'-' if values[key] is None else values[key]}" for name, values in engines.items())

    for label, result in calls:
        for row in result["rows"]:
            lines.append(f"| {label} | {row['model']} | {row['k']} | {row['concurrency']} | {row['rounds']} "
                         f"| {row['log_ratio_sd']} | {row['r_fork_upstream']} | {per_engine(row['engines'], 'cv')} "
                         f"| {per_engine(row['engines'], 'r_steal')} |")
        lines.append(f"| {label} | all | | | | {result['log_ratio_sd']} | | | |")
    return lines
