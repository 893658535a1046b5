"""An adaptive-verification call's numbers: one row per model, prompt set and concurrency with each engine's median
rate, the adaptive engine's ratios to the other four per interleaved round, τ and drafts verified per engine,
greedy output against no speculation, and the goal."""

from __future__ import annotations

import statistics

from kimi_lab.bench.adaptive.plan import ENGINES, OTHERS
from kimi_lab.bench.perf.analysis import round_ratios, same_as_nospec

#: The goal: adaptive at least this times the best of the other four engines at every point ...
GOAL_BEST = 0.98
#: ... and at least this times upstream's fixed k wherever that is slower than no speculation.
GOAL_OVER_UPSTREAM = 1.10


def median_of(values: list | None) -> float | None:
    """The median of the values that are not None, rounded to 1e-3; None without any."""
    kept = [v for v in values or [] if v is not None]
    return round(statistics.median(kept), 3) if kept else None


def verified_of(entry: dict) -> float | None:
    """Drafts verified per timed batch at a point (median over rounds): adaptive verification's own count where the
    engine has one, else the drafts scheduled (a fixed-k engine verifies every draft it schedules)."""
    own = median_of(entry.get("verified_rounds"))
    return own if own is not None else median_of(entry.get("draft_tokens_rounds"))


def ratio(row: dict, a: str, b: str) -> float | None:
    """Engine ``a`` over engine ``b`` in ``row``: the median of their per-round ratios (rounds measured side by
    side), else the ratio of their median rates; None where either lacks a rate."""
    per_round = row.get("ratios", {}).get(f"{a}_vs_{b}", {}).get("median")
    if per_round is not None:
        return per_round
    x, y = row["tok_s"].get(a), row["tok_s"].get(b)
    return round(x / y, 4) if x and y else None


def row_goal(row: dict) -> dict:
    """The goal at one point: ``vs_best``, adaptive over its closest rival (the smallest of its ratios to the other
    four, :func:`ratio`) against :data:`GOAL_BEST`; ``upstream_loses``, upstream's fixed k below no speculation
    (their ratio under 1), and then ``vs_upstream`` against :data:`GOAL_OVER_UPSTREAM`; ``met``: both hold, None
    where an engine's rate is missing (nothing to judge)."""
    ratios = {other: ratio(row, "adaptive", other) for other in OTHERS}
    up_vs_none = ratio(row, "upstream_k3", "nospec")
    if None in ratios.values() or up_vs_none is None:
        return {"met": None, "vs_best": None, "best_other": None, "upstream_loses": None,
                "missing": sorted(o for o, r in ratios.items() if r is None)}
    best_other = min(ratios, key=lambda o: ratios[o])
    loses = up_vs_none < 1.0
    met_best = ratios[best_other] >= GOAL_BEST
    met_upstream = not loses or ratios["upstream_k3"] >= GOAL_OVER_UPSTREAM
    return {"met": met_best and met_upstream, "vs_best": ratios[best_other], "best_other": best_other,
            "met_best": met_best, "upstream_loses": loses, "upstream_vs_nospec": up_vs_none,
            "vs_upstream": ratios["upstream_k3"], "met_upstream": met_upstream}


def goal(rows: list[dict]) -> dict:
    """The goal over every row: ``met`` only when every row's is (None when some row cannot be judged and none
    fails); the rows that fail and those that cannot be judged, by ``model/set/c``."""
    failing = [f"{r['model']}/{r['set']}/{r['concurrency']}" for r in rows if r["goal"]["met"] is False]
    unjudged = [f"{r['model']}/{r['set']}/{r['concurrency']}" for r in rows if r["goal"]["met"] is None]
    met = False if failing or not rows else (None if unjudged else True)
    return {"met": met, "failing": failing, "unjudged": unjudged,
            "rule": (f"adaptive >= {GOAL_BEST} x the best of the other four engines at every point, and >= "
                     f"{GOAL_OVER_UPSTREAM} x upstream's fixed k = 3 wherever that is slower than no speculation "
                     "(medians of per-round ratios)")}


def rows_of(runs: dict[str, dict], jobs: list[dict]) -> list[dict]:
    """One row per model and point measured by some engine (see the module docstring): ``tok_s`` (median over
    rounds), ``tau`` (vLLM's: 1 + accepted / drafting steps, median over rounds), ``draft_tokens`` (scheduled) and
    ``verified`` (verified: adaptive verification's own counter, else every scheduled draft) per timed batch,
    ``ratios`` (``adaptive_vs_<engine>`` and ``upstream_k3_vs_nospec``: per-round ratios, their median, interval
    and spread), ``identical`` (``[same, total]`` greedy sequences against no speculation per engine), ``lossless``
    and ``goal`` (:func:`row_goal`)."""
    done = {j["name"]: (j, runs[j["name"]]) for j in jobs if runs.get(j["name"], {}).get("status") == "done"}
    same = same_as_nospec(runs, jobs)
    keys: dict[tuple[str, str], None] = {}
    for job, result in done.values():
        for key in result.get("by_concurrency", {}):
            keys[(job["model"], key)] = None
    rows = []
    for model, key in keys:
        entries = {e: done.get(f"{model}/{e}", (None, {}))[1].get("by_concurrency", {}).get(key, {}) for e in ENGINES}
        name, c = key.rsplit("/", 1)
        row = {"model": model, "set": name, "concurrency": int(c), "key": key,
               "tok_s": {e: median_of(x.get("tok_s_rounds") or [x.get("tok_s")]) for e, x in entries.items() if x},
               "tau": {e: median_of(x.get("tau_rounds") or [x.get("tau")]) for e, x in entries.items() if x},
               "draft_tokens": {e: median_of(x.get("draft_tokens_rounds")) for e, x in entries.items() if x},
               "verified": {e: verified_of(x) for e, x in entries.items() if x},
               "rounds": {e: len(x.get("tok_s_rounds", [])) for e, x in entries.items() if x},
               "identical": {e: same.get(f"{model}/{e}", {}).get(key) for e in ENGINES if e != "nospec"}}
        row["ratios"] = {}
        for a, b in [*(("adaptive", o) for o in OTHERS), ("upstream_k3", "nospec")]:
            if entries[a] and entries[b]:
                stats = round_ratios(entries[a], entries[b], "r")
                if stats:
                    row["ratios"][f"{a}_vs_{b}"] = {"median": stats["r_median"], "ci95": stats["r_ci95"],
                                                    "spread": stats["r_spread"], "rounds": stats["r_rounds"]}
        counts = [v for v in row["identical"].values() if v]
        row["lossless"] = all(s == t for s, t in counts) if counts else None
        row["goal"] = row_goal(row)
        rows.append(row)
    order = {name: i for i, name in enumerate(("in", "off", "mixed"))}
    return sorted(rows, key=lambda r: (r["model"], r["concurrency"], order.get(r["set"], 9), r["set"]))
