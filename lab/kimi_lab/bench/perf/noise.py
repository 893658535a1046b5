"""How noisy a perf_vs_upstream call's rounds are (``benchmarks/perf_vs_upstream.py --noise``): per model, k and
concurrency the spread of log(fork / upstream) over the rounds, whether the fork's and upstream's rates move
together, each engine's coefficient of variation, how much of its CPU time the hypervisor took
(``steal_share_rounds``) and whether its busy threads shared a physical core (``shared_core_rounds``; both absent
from older calls), and whether its rates follow those."""

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


def engine_noise(entry: dict) -> dict:
    """One engine at one concurrency: ``cv`` of its rates, ``steal_max`` (the largest share of its CPU time the
    hypervisor took in a round; None where not recorded), ``r_steal`` (its rates against those shares),
    ``shared`` (``"k/n"``: in k of the n rounds that recorded it, two of its busy threads ended on one physical
    core; None where no round recorded it) and ``r_shared`` (its rates against that, as 0 or 1)."""
    shares = [x for x in entry.get("steal_share_rounds", []) if x is not None]
    shared = [None if x is None else int(x) for x in entry.get("shared_core_rounds", [])]
    known = [x for x in shared if x is not None]
    return {"cv": cv(entry["tok_s_rounds"]), "steal_max": max(shares) if shares else None,
            "r_steal": correlation(entry["tok_s_rounds"], entry.get("steal_share_rounds", [])),
            "shared": f"{sum(known)}/{len(known)}" if known else None,
            "r_shared": correlation(entry["tok_s_rounds"], shared)}


def noise(part: dict) -> dict:
    """The spread of one call's rounds (``part``: a call's own ``perf_vs_upstream.json``): a row per model, k and
    concurrency where ``<model>/fork_k{k}`` and ``<model>/upstream_k{k}`` are both done (``engines``: every done
    engine of that model, :func:`engine_noise`), and ``log_ratio_sd``, the rows' standard deviations pooled
    (``sqrt(sum((n - 1) s^2) / sum(n - 1))``: the spread within rows, not between them).

    Raises:
        ValueError: ``part`` holds no engine results (not a perf_vs_upstream result, or a ``--pool`` /
            ``--combine`` one, which keeps no rounds per engine), or rates without rounds (before rounds were
            recorded).
    """
    if not isinstance(part, dict) or not part.get("runs") or not all("/" in n for n in part["runs"]):
        raise ValueError("no engine results (runs) of a perf_vs_upstream call: pass the calls' own JSONs, not a "
                         "--pool or --combine result")
    runs = {n: r for n, r in part["runs"].items() if r.get("status") == "done"}
    if any("tok_s_rounds" not in e for r in runs.values() for e in r.get("by_concurrency", {}).values()):
        raise ValueError("rates without tok_s_rounds: the call predates interleaved rounds")
    rows, squares, dof = [], 0.0, 0  # the pooled SD's sums: (n - 1) s^2 and n - 1 over the rows
    for name, fork in runs.items():
        model, engine = name.split("/", 1)
        upstream = runs.get(f"{model}/upstream_{engine.removeprefix('fork_')}")
        if not engine.startswith("fork_k") or upstream is None:
            continue
        peers = {n.split("/", 1)[1]: r for n, r in runs.items() if n.startswith(f"{model}/")}
        for c, f in fork["by_concurrency"].items():
            up_rates = upstream["by_concurrency"].get(c, {}).get("tok_s_rounds", [])
            logs = [math.log(a / b) for a, b in zip(f["tok_s_rounds"], up_rates, strict=False) if a and b]
            variance = statistics.variance(logs) if len(logs) > 1 else None
            if variance is not None:
                squares, dof = squares + variance * (len(logs) - 1), dof + len(logs) - 1
            rows.append({
                "model": model, "k": int(engine.removeprefix("fork_k")), "concurrency": int(c), "rounds": len(logs),
                "log_ratio_sd": None if variance is None else round(math.sqrt(variance), 3),
                "r_fork_upstream": correlation(f["tok_s_rounds"], up_rates),
                "engines": {e: engine_noise(at) for e, r in peers.items() if (at := r["by_concurrency"].get(c))},
            })
    pooled = round(math.sqrt(squares / dof), 3) if dof else None
    return {"command": part.get("command"), "date": part.get("date"), "device": part.get("device"), "rows": rows,
            "log_ratio_sd": pooled}


def markdown(calls: list[tuple[str, dict]]) -> list[str]:
    """A table of :func:`noise` results, one line per call, model, k and concurrency and one per call (``all``: the
    pooled SD); ``calls``: (label, result)."""
    def shown(value) -> str:
        return "-" if value is None else str(value)

    def per_engine(engines: dict, key: str) -> str:
        return ", ".join(f"{name} {shown(values[key])}" for name, values in engines.items())

    lines = ["# How noisy the rounds are (perf_vs_upstream.py --noise)", "",
             ("SD: standard deviation of log(fork/upstream) over the rounds (the call's line: pooled within rows); "
              "r: Pearson's r; CV: an engine's rate's standard deviation over its mean; steal: the largest share of "
              "an engine's CPU time the hypervisor took in one round, r(steal): its rates against those shares; "
              "shared core: in how many rounds two of an engine's busy threads (a fifth of a CPU or more) ended on "
              "one physical core, r(shared): its rates against that (0 or 1); "
              "-: not known (not recorded, too few rounds, or a constant side)."), "",
             ("| call | model | k | c | rounds | SD | r(fork, upstream) | CV per engine | steal per engine "
              "| r(steal) per engine | shared core per engine | r(shared) per engine |"),
             "|---" * 12 + "|"]
    for label, result in calls:
        for row in result["rows"]:
            engines = row["engines"]
            lines.append(f"| {label} | {row['model']} | {row['k']} | {row['concurrency']} | {row['rounds']} "
                         f"| {shown(row['log_ratio_sd'])} | {shown(row['r_fork_upstream'])} "
                         f"| {per_engine(engines, 'cv')} | {per_engine(engines, 'steal_max')} "
                         f"| {per_engine(engines, 'r_steal')} | {per_engine(engines, 'shared')} "
                         f"| {per_engine(engines, 'r_shared')} |")
        lines.append(f"| {label} | all | | | | {shown(result['log_ratio_sd'])} |" + " |" * 6)
    return lines
