"""perf_vs_upstream's numbers from the engines' results: one row per (model, concurrency, k) with the ratios and
the ideal bound, the Kimi slice's projection to 61 layers at TP 8, greedy output against no speculation,
the speed goal, a call's summary, and the results of several calls joined."""

from __future__ import annotations

import argparse
import math
import statistics
import time

from kimi.models.kimi_slice import FULL_LAYERS, SPEC_LAYERS
from kimi_lab.bench.hardware import describe
from kimi_lab.bench.perf.plan import HELD_RUNNERS

#: The speed goal: fork / upstream on the pair at k = 3 and c <= 16, and the floor everywhere.
GOAL_PAIR_K3 = 1.10
GOAL_FLOOR = 0.98
#: The goal against upstream's current release: on the pair at k = 3, the median of the per-round ratios at
#: least this at every concurrency, and no single round's ratio below GOAL_FLOOR.
GOAL_MEDIAN = 1.00


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a and b else None


#: The per-round ratios a row may carry (:func:`round_ratios`); :func:`pool` joins them over calls.
ROUND_RATIOS = ("fork_vs_upstream", "hookoff_vs_upstream", "fork_vs_hookoff")


def round_ratios(fork_c: dict, up_c: dict, name: str = "fork_vs_upstream") -> dict:
    """fork/upstream per interleaved round (round i of the fork against round i of upstream, measured in the same
    round), their median, its 95 % interval and their spread (min, max) (:func:`ratio_stats`); empty where either
    side has no rounds."""
    pairs = list(zip(fork_c.get("tok_s_rounds", []), up_c.get("tok_s_rounds", []), strict=False))
    return ratio_stats(name, [round(f / u, 4) for f, u in pairs if f and u])


def ratio_stats(name: str, ratios: list[float]) -> dict:
    """``{name}_rounds``, ``{name}_median``, ``{name}_ci95`` (:func:`median_ci95`) and ``{name}_spread`` ([min,
    max]) of ``ratios``; empty without any."""
    if not ratios:
        return {}
    return {f"{name}_rounds": ratios, f"{name}_median": round(statistics.median(ratios), 4),
            f"{name}_ci95": median_ci95(ratios), f"{name}_spread": [min(ratios), max(ratios)]}


def median_ci95(values: list[float]) -> list[float] | None:
    """A distribution-free 95 % confidence interval of the median of ``values`` (the sign test's: order statistics
    ``x_(l)`` and ``x_(n+1-l)``, ``l`` the largest count with ``P(Binomial(n, 1/2) < l) <= 0.025``; coverage at
    least 95 % for independent values of any one distribution). None with fewer than 6 values (no such interval
    exists)."""
    xs, n = sorted(values), len(values)
    cut, tail = 0, 1 / 2 ** n
    while tail <= 0.025:  # tail: P(Binomial(n, 1/2) <= cut)
        cut += 1
        tail += math.comb(n, cut) / 2 ** n
    return [xs[cut - 1], xs[n - cut]] if cut else None


def rows_of(runs: dict[str, dict], jobs: list[dict]) -> list[dict]:
    """One row per (model, concurrency, k) from the finished engines (see the module docstring for the fields).

    ``fork_*`` is the fork as it runs by default, ``fork_v1_*`` / ``fork_v2_*`` the fork held on vLLM's V1 / V2
    runner, ``fork_hookoff_*`` the fork with patch 0009's hook off (``--hook-off``) with its per-round ratios to
    upstream (``hookoff_vs_upstream_*``) and the fork's to it (``fork_vs_hookoff_*``). Step times
    (``t_verify_ms``, ``t_draft_ms``) come from the fork's engine, else the fork's on V1, else upstream's
    (``steps_from``); V2 engines have none.
    """
    out = []
    done = {j["name"]: (j, runs[j["name"]]) for j in jobs if runs.get(j["name"], {}).get("status") == "done"}

    def at(name: str, c: str) -> dict:
        return done.get(name, (None, {}))[1].get("by_concurrency", {}).get(c, {})

    def tok_s(entry: dict) -> float | None:
        return round(entry["tok_s"], 1) if entry else None

    for job, result in done.values():
        if job["variant"] != "fork" or job.get("greedy"):
            continue
        model, k = job["model"], job["k"]
        for c, fork_c in result["by_concurrency"].items():
            up_c, base_c = at(f"{model}/upstream_k{k}", c), at(f"{model}/nospec", c)
            held = {runner: at(f"{model}/fork_{runner}_k{k}", c) for runner in HELD_RUNNERS}
            steps_from, steps = next(((n, e["steps"]) for n, e in (("fork", fork_c), ("fork_v1", held["v1"]),
                                                                  ("upstream", up_c))
                                      if e.get("steps", {}).get("draft_per_token_ms")), (None, {}))
            t_target = base_c.get("steps", {}).get("target_ms")
            t_verify, t_draft, tau = steps.get("target_ms"), steps.get("draft_per_token_ms"), fork_c.get("tau")
            ideal = (tau * t_target / (t_verify + k * t_draft)
                     if None not in (tau, t_target, t_verify, t_draft) else None)
            out.append({
                "model": model, "concurrency": int(c), "k": k,
                "fork_tok_s": tok_s(fork_c), "upstream_tok_s": tok_s(up_c), "nospec_tok_s": tok_s(base_c),
                "fork_vs_upstream": _ratio(fork_c["tok_s"], up_c.get("tok_s")),
                "fork_vs_nospec": _ratio(fork_c["tok_s"], base_c.get("tok_s")),
                "upstream_vs_nospec": _ratio(up_c.get("tok_s"), base_c.get("tok_s")),
                "tau": round(tau, 3) if tau else None,
                "tau_upstream": round(up_c["tau"], 3) if up_c.get("tau") else None,
                "tpot_ms_fork": round(fork_c["tpot_ms"], 3),
                "tpot_ms_upstream": round(up_c["tpot_ms"], 3) if up_c else None,
                "tpot_ms_nospec": round(base_c["tpot_ms"], 3) if base_c else None,
                "t_target_ms": round(t_target, 4) if t_target else None,
                "t_verify_ms": round(t_verify, 4) if t_verify else None,
                "t_draft_ms": round(t_draft, 4) if t_draft else None,
                "steps_from": steps_from,
                "t_draft_ms_upstream": round(up_c["steps"]["draft_per_token_ms"], 4)
                if up_c.get("steps", {}).get("draft_per_token_ms") else None,
                "ideal_speedup": round(ideal, 3) if ideal else None,
                "fork_runner": result.get("runner"),
                "rounds": [len(e.get("tok_s_rounds", [None])) for e in (fork_c, up_c) if e],  # fork, upstream
                **round_ratios(fork_c, up_c),
            })
            hookoff = at(f"{model}/hookoff_k{k}", c)
            if hookoff:  # the fork with patch 0009's hook off: the hook's share and the rest of the fork's
                out[-1].update({"fork_hookoff_tok_s": tok_s(hookoff), "tau_hookoff": round(hookoff["tau"], 3)
                                if hookoff.get("tau") else None, **round_ratios(hookoff, up_c, "hookoff_vs_upstream"),
                                **round_ratios(fork_c, hookoff, "fork_vs_hookoff")})
            for runner, e in held.items():
                out[-1].update({f"fork_{runner}_tok_s": tok_s(e),
                                f"fork_{runner}_vs_upstream": _ratio(e.get("tok_s"), up_c.get("tok_s")),
                                f"tau_{runner}": round(e["tau"], 3) if e.get("tau") else None})
    return sorted(out, key=lambda r: (r["model"], r["k"], r["concurrency"]))


def projection(runs: dict[str, dict], rows: list[dict]) -> dict:
    """The 61-layer TP 8 projection of the Kimi slice (module docstring), per concurrency with a k = 3 row."""
    deep, shallow = runs.get("kimi_slice/nospec", {}), runs.get("kimi_slice/nospec_shallow", {})
    if deep.get("status") != "done" or shallow.get("status") != "done":
        return {}
    out = {}
    for row in rows:
        if row["model"] != "kimi_slice":
            continue
        c = str(row["concurrency"])
        t_deep = deep["by_concurrency"].get(c, {}).get("steps", {}).get("target_ms")
        t_shallow = shallow["by_concurrency"].get(c, {}).get("steps", {}).get("target_ms")
        # a fork engine marked invalid: upstream's verification and draft steps instead
        t_verify, t_draft = row["t_verify_ms"], row["t_draft_ms"]
        if row.get("invalid"):
            up = runs.get(f"kimi_slice/upstream_k{row['k']}", {}).get("by_concurrency", {}).get(c, {})
            t_verify, t_draft = up.get("steps", {}).get("target_ms"), row.get("t_draft_ms_upstream")
        if not (t_deep and t_shallow and t_verify and t_draft):
            continue
        t_moe = t_deep - t_shallow
        moe_here, moe_full = SPEC_LAYERS - 1, FULL_LAYERS - 1
        one_gpu = t_deep + (moe_full - moe_here) * t_moe
        tp8 = t_deep - moe_here * t_moe + moe_full * t_moe / 8
        verify_ratio = t_verify / t_deep
        k = row["k"]
        spent = verify_ratio * tp8 + k * t_draft
        out[f"c{c}_k{k}"] = {"t_moe_layer_ms": round(t_moe, 4), "t_target_61_1gpu_ms": round(one_gpu, 3),
                             "t_target_61_tp8_ms": round(tp8, 3), "t_verify_61_tp8_ms": round(verify_ratio * tp8, 3),
                             "t_draft_ms": t_draft, "break_even_tau": round(spent / tp8, 3),
                             "ideal_speedup_at_tau_3": round(3 * tp8 / spent, 3)}
    return out


def same_as_nospec(runs: dict[str, dict], jobs: list[dict]) -> dict:
    """``{engine: {c: [identical sequences, sequences]}}``: each speculative engine's greedy output against its
    model's ``nospec`` engine, batch by batch (bf16 numerics may flip near-tied tokens; the count says how often)."""
    out: dict = {}
    for job in jobs:
        result, base = runs.get(job["name"], {}), runs.get(f"{job['model']}/nospec", {})
        if not job["spec"] or result.get("status") != "done" or base.get("status") != "done":
            continue
        out[job["name"]] = {}
        for c, entry in result["by_concurrency"].items():
            ref = base["by_concurrency"].get(c, {}).get("tokens")
            if ref and entry.get("tokens"):
                out[job["name"]][c] = [sum(a == b for a, b in zip(entry["tokens"], ref, strict=True)), len(ref)]
    return out


def without_tokens(result: dict) -> dict:
    """``result`` without the generated tokens of its concurrencies (the JSON keeps the numbers)."""
    if "by_concurrency" not in result:
        return result
    return {**result, "by_concurrency": {c: {k: v for k, v in e.items() if k != "tokens"}
                                         for c, e in result["by_concurrency"].items()}}


def goal(rows: list[dict]) -> dict:
    """The speed goal (:data:`GOAL_PAIR_K3`, :data:`GOAL_FLOOR`) over the rows not marked ``invalid``."""
    rows = [r for r in rows if not r.get("invalid")]
    pair_k3 = [r["fork_vs_upstream"] for r in rows
               if r["model"] == "pair" and r["k"] == 3 and r["concurrency"] <= 16 and r["fork_vs_upstream"]]
    every = [r["fork_vs_upstream"] for r in rows if r["fork_vs_upstream"]]
    k3 = [r for r in rows if r["model"] == "pair" and r["k"] == 3 and r.get("fork_vs_upstream_median")]
    medians = [r["fork_vs_upstream_median"] for r in k3]
    lowest = [r["fork_vs_upstream_spread"][0] for r in k3]
    return {"pair_k3_c1_16_min": min(pair_k3) if pair_k3 else None,
            "pair_k3_c1_16_met": bool(pair_k3) and min(pair_k3) >= GOAL_PAIR_K3,
            "min_anywhere": min(every) if every else None,
            "floor_met": bool(every) and min(every) >= GOAL_FLOOR,
            "pair_k3_median_min": min(medians) if medians else None,
            "pair_k3_round_min": min(lowest) if lowest else None,
            "pair_k3_median_met": bool(medians) and min(medians) >= GOAL_MEDIAN and min(lowest) >= GOAL_FLOOR}



def versions_of(runs: dict[str, dict], jobs: list[dict]) -> dict[str, str]:
    """``{"fork": version, "upstream": version}`` as the finished engines report ``vllm.__version__`` (the first
    finished engine of each side)."""
    versions: dict[str, str] = {}
    for job in jobs:
        r = runs.get(job["name"], {})
        if r.get("status") == "done":
            versions.setdefault("upstream" if job["variant"] == "upstream" else "fork", r["vllm_version"])
    return versions


def summarize(args: argparse.Namespace, jobs: list[dict], runs: dict[str, dict], started: float) -> dict:
    """A call's summary (the keys of ``perf_vs_upstream.json``): device, date, command, versions, settings, rows,
    projection, goal, the greedy comparisons and check counts, and every planned engine's result."""
    done = [r for r in runs.values() if r.get("status") == "done"]
    device = done[0]["device"] if done else {}
    versions = versions_of(runs, jobs)
    rows = rows_of(runs, jobs)
    return {
        "device": describe(device, versions=True),
        "date": args.date, "command": args.command, "versions": versions,
        "settings": {"concurrency": args.concurrency, "tokens": args.tokens, "slice_tokens": args.slice_tokens,
                     "reps": args.reps, "ks": args.ks,
                     "slice_ks": args.slice_ks, "engine": args.engine, "fork_greedy": args.fork_greedy,
                     "profile": "cpu-smoke" if args.cpu_smoke else "gpu",
                     "pinned": args.pin, "turns": args.turns, "rewarm_tokens": args.rewarm_tokens},
        "rows": rows, "projection": projection(runs, rows), "goal": goal(rows),
        "same_as_nospec": same_as_nospec(runs, jobs),
        "greedy_check": {j["name"]: runs[j["name"]].get("greedy_check") for j in jobs
                         if j.get("greedy") == "check" and runs.get(j["name"], {}).get("status") == "done"},
        "runs": {j["name"]: without_tokens(runs.get(j["name"], {"status": "not run"})) for j in jobs},
        "seconds": round(time.monotonic() - started, 1),
    }


def check_same_setup(parts: list[dict]) -> None:
    """Raises ValueError unless every part ran on the first one's device and vLLM versions."""
    first = parts[0]
    for part in parts[1:]:
        if part["device"] != first["device"] or any(part["versions"].get(k, v) != v
                                                    for k, v in first["versions"].items()):
            raise ValueError(f"cannot combine results of {part['device']} {part['versions']} with "
                             f"{first['device']} {first['versions']}")


def pool(parts: list[dict], notes: list[str] | None = None) -> dict:
    """One result from several calls of the same plan (the same engines measured again): per (model, concurrency,
    k) the per-round ratios of every call (:data:`ROUND_RATIOS`) in one list, their median, interval and spread
    recomputed (the interval takes the rounds as independent draws: a shift between calls lowers its coverage),
    and the goal from those; the other columns (tok/s, tau) stay the first call's, which a note says. Rows that
    only some calls have are kept with those calls' rounds (``calls`` counts them). ``notes`` are printed under
    the table after it.

    Raises:
        ValueError: the parts come from different devices or vLLM versions, or measured other concurrencies,
            output lengths or k (``--reps``, ``--turns`` and ``--rewarm-tokens`` may differ: the timed batches are
            the same; ``settings`` then lists each call's, ``unrecorded`` for a call made before they were).
    """
    check_same_setup(parts)
    plan_keys = ("concurrency", "tokens", "ks")
    for part in parts[1:]:
        differ = [k for k in plan_keys if part["settings"].get(k) != parts[0]["settings"].get(k)]
        if differ:
            raise ValueError(f"cannot pool calls that measured different {', '.join(differ)}: "
                             f"{[p['settings'].get(differ[0]) for p in parts]}")
    grouped: dict[tuple, list[dict]] = {}
    for part in parts:
        for row in part["rows"]:
            grouped.setdefault((row["model"], row["k"], row["concurrency"]), []).append(row)
    rows = []
    for key in sorted(grouped):
        group = grouped[key]
        pooled = {f"{name}_{part}" for name in ROUND_RATIOS for part in ("rounds", "median", "ci95", "spread")}
        row = {k: v for k, v in group[0].items() if k not in pooled}
        for name in ROUND_RATIOS:
            row.update(ratio_stats(name, [x for r in group for x in r.get(f"{name}_rounds", [])]))
        rounds = len(row.get("fork_vs_upstream_rounds", []))
        rows.append({**row, "calls": len(group), "rounds": [rounds, rounds]})
    note = (f"pooled over {len(parts)} calls: the per-round ratios are every call's rounds; tok/s, tau and the other "
            "columns are the first call's")
    settings = dict(parts[0]["settings"])
    for key in ("reps", "turns", "rewarm_tokens", "pinned"):
        each = [part["settings"].get(key, "unrecorded") for part in parts]
        settings[key] = each if len(set(each)) > 1 else each[0]
    return {**parts[0], "settings": settings, "rows": rows, "goal": goal(rows), "projection": {},
            "same_as_nospec": {}, "greedy_check": {}, "runs": {},
            "notes": [*parts[0].get("notes", []), note, *(notes or [])],
            "command": " ; ".join(part["command"] for part in parts),
            "date": max(part["date"] for part in parts), "seconds": sum(part["seconds"] for part in parts)}


def combine(parts: list[dict], invalid: dict[str, str] | None = None, notes: list[str] | None = None) -> dict:
    """One result from the results of several calls (one GPU call per model fits the device's time limit):
    rows, runs, checks and projections are joined, the goal is recomputed, each call's command is kept.

    ``invalid`` maps a fork engine (``model/fork_k{k}``) to the reason its measurement does not count: its rows
    keep their numbers with ``invalid`` set and leave the goal. ``notes`` are printed under the table.

    Raises:
        ValueError: the parts come from different devices or vLLM versions, or an ``invalid`` engine has no rows.
    """
    check_same_setup(parts)
    first = parts[0]
    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: (r["model"], r["k"], r["concurrency"]))
    merged = {key: {k: v for part in parts for k, v in part.get(key, {}).items()}
              for key in ("versions", "projection", "same_as_nospec", "greedy_check", "runs")}
    for engine, why in (invalid or {}).items():
        hit = [r for r in rows if f"{r['model']}/fork_k{r['k']}" == engine]
        if not hit:
            raise ValueError(f"--invalid {engine}: no rows of that engine")
        for row in hit:
            row["invalid"] = why
    # the projection's two depths may come from different calls; recomputed, so an invalid engine's steps go
    merged["projection"] = projection(merged["runs"], rows)
    merged["notes"] = [n for part in parts for n in part.get("notes", [])] + list(notes or [])
    return {**first, **merged, "rows": rows, "goal": goal(rows),
            "command": " ; ".join(part["command"] for part in parts),
            "date": max(part["date"] for part in parts), "seconds": sum(part["seconds"] for part in parts)}

