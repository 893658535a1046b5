"""perf_vs_upstream's result files: ``perf_vs_upstream.json``, ``perf_vs_upstream.md`` (the table, notes, the
projection, the check counts) and ``perf_vs_upstream.png`` (tokens/s against concurrency, with matplotlib)."""

from __future__ import annotations

from pathlib import Path

from kimi.train.charts import pyplot, save_png
from kimi_lab.bench.perf import log
from kimi_lab.bench.perf.analysis import GOAL_FLOOR, GOAL_MEDIAN, GOAL_PAIR_K3
from kimi_lab.bench.perf.plan import HELD_RUNNERS
from kimi_lab.bench.results import header, write_json, write_lines

#: The settings line's words for each ``--pin`` (``pinned``: None or False unpinned; True in calls before the modes,
#: which gave each engine its own share of the CPUs, split in CPU order).
PINNED = {None: "", False: "", True: "; each engine pinned to its own CPUs",
          "shares": "; each engine pinned to its own cores",
          "cores": "; every engine pinned to one thread of each core (they measure in turns)"}


def pinned_words(pinned) -> str:
    """:data:`PINNED`'s words for a call's ``pinned`` setting; for pooled calls that differ (a list, one per call,
    ``unrecorded`` where a call predates the setting) each call's in order."""
    if isinstance(pinned, list):
        return "; pinned per call: " + ", ".join(str(p) for p in pinned)
    return PINNED.get(pinned, f"; pinned: {pinned}")


def write_outputs(out: Path, summary: dict, chart: bool = True) -> None:
    """Write ``summary``'s JSON and markdown to ``out`` (atomically), and with ``chart`` its PNG."""
    write_json(out / "perf_vs_upstream.json", summary)
    # the held-runner columns (fork_v1, fork_v2) that some row has
    held = [h for h in HELD_RUNNERS if any(r.get(f"fork_{h}_tok_s") for r in summary["rows"])]
    hookoff = any(r.get("fork_hookoff_tok_s") for r in summary["rows"])
    settings, versions = summary["settings"], summary["versions"]
    lines = [*header("Fork versus upstream vLLM on one GPU", summary["command"], summary["date"]),
             f"- hardware: {summary['device']}",
             (f"- vLLM: fork {versions.get('fork')}, upstream {versions.get('upstream')}; "
              f"fork greedy drafts: KIMI_DRAFT_GREEDY={settings['fork_greedy']}"),
             (f"- output tokens per request: {settings['tokens']} (pair), {settings.get('slice_tokens')} "
              f"(Kimi slice); greedy, c requests at once; best of {settings['reps']}"
              + pinned_words(settings.get("pinned"))),
             (f"- goals: fork/upstream >= {GOAL_PAIR_K3} on the pair at k = 3, c <= 16 (set on the v0.26 line); "
              f"median of the per-round fork/upstream >= {GOAL_MEDIAN} at every c on the pair at k = 3 and no round "
              f"below {GOAL_FLOOR}: {summary['goal']}"), "",
             ("| model | c | k | fork tok/s (runner) | upstream tok/s | no-spec tok/s | fork/upstream "
              "| median per round [95% CI] (min-max) rounds | fork/no-spec "
              "| tau | t_target ms | t_verify ms | t_draft ms (steps from / upstream) | ideal "
              + "".join(f"| fork on {r.upper()} tok/s (/ upstream) | tau on {r.upper()} " for r in held)
              + ("| fork, hook off, tok/s | hook off/upstream per round [95% CI] (min-max) rounds "
                 "| fork/hook off per round [95% CI] (min-max) rounds " if hookoff else "")
              + "|"),
             "|---" * (14 + 2 * len(held) + 3 * hookoff) + "|"]
    for r in summary["rows"]:
        ratio = f"{r['fork_vs_upstream']}{' (not counted)' if r.get('invalid') else ''}"
        rounds = per_round(r, "fork_vs_upstream")
        lines.append(f"| {r['model']} | {r['concurrency']} | {r['k']} | {r['fork_tok_s']} ({r.get('fork_runner')}) "
                     f"| {r['upstream_tok_s']} | {r['nospec_tok_s']} | {ratio} | {rounds} | {r['fork_vs_nospec']} "
                     f"| {r['tau']} | {r['t_target_ms']} | {r['t_verify_ms']} "
                     f"| {r['t_draft_ms']} ({r.get('steps_from')}) / {r['t_draft_ms_upstream']} | {r['ideal_speedup']} "
                     + "".join(f"| {r.get(f'fork_{h}_tok_s')} ({r.get(f'fork_{h}_vs_upstream')}) | {r.get(f'tau_{h}')} "
                               for h in held)
                     + (f"| {r.get('fork_hookoff_tok_s')} | {per_round(r, 'hookoff_vs_upstream')} "
                        f"| {per_round(r, 'fork_vs_hookoff')} " if hookoff else "") + "|")
    invalid = {f"{r['model']}/fork_k{r['k']}": r["invalid"] for r in summary["rows"] if r.get("invalid")}
    if invalid or summary.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {engine}: not counted: {why}" for engine, why in invalid.items()]
        lines += [f"- {note}" for note in summary.get("notes", [])]
    if summary.get("projection"):
        lines += ["", "Kimi slice projected to 61 layers at TP 8 (module docstring of benchmarks/perf_vs_upstream.py):",
                  "", ("| c, k | t_moe/layer ms | 61 layers 1 GPU ms | 61 layers TP8 ms | verify TP8 ms | draft ms "
                       "| break-even tau | ideal at tau 3 |"), "|---|---|---|---|---|---|---|---|"]
        for key, p in summary["projection"].items():
            lines.append(f"| {key} | {p['t_moe_layer_ms']} | {p['t_target_61_1gpu_ms']} | {p['t_target_61_tp8_ms']} "
                         f"| {p['t_verify_61_tp8_ms']} | {p['t_draft_ms']} | {p['break_even_tau']} "
                         f"| {p['ideal_speedup_at_tau_3']} |")
    if summary.get("greedy_check"):
        lines += ["", ("Patch 0009 check (KIMI_DRAFT_GREEDY=check: upstream's draft ids used, the hook's compared "
                       f"at every draft step): {summary['greedy_check']}")]
    if summary.get("same_as_nospec"):
        lines += ["", "Greedy output identical to the same model without speculation (sequences, per concurrency): "
                  + "; ".join(f"{n}: " + ", ".join(f"c{c} {a}/{b}" for c, (a, b) in v.items())
                              for n, v in summary["same_as_nospec"].items())]
    failed = {n: r.get("status") for n, r in summary["runs"].items() if r.get("status") != "done"}
    if failed:
        lines += ["", f"Engines that did not finish: {failed}"]
    write_lines(out / "perf_vs_upstream.md", lines)
    if chart:
        draw_chart(summary, out / "perf_vs_upstream.png")


def per_round(row: dict, name: str) -> str:
    """``median [95 % CI] (min-max) n`` of a row's per-round ratios ``name``
    (:func:`kimi_lab.bench.perf.analysis.round_ratios`; the interval where there are enough rounds, the count where
    there is more than one), ``-`` without rounds."""
    spread = row.get(f"{name}_spread")
    if not spread:
        return "-"
    ci, n = row.get(f"{name}_ci95"), len(row.get(f"{name}_rounds", []))
    return (f"{row[f'{name}_median']}" + (f" [{ci[0]}-{ci[1]}]" if ci else "") + f" ({spread[0]}-{spread[1]})"
            + (f" n={n}" if n > 1 else ""))


def draw_chart(summary: dict, path: Path) -> bool:
    """Output tokens/s against concurrency for fork, upstream, no speculation and the ideal bound
    (``ideal_speedup x`` no-spec tokens/s), one panel per model at k = 3. False without matplotlib."""
    plt = pyplot()
    if plt is None:
        log("matplotlib is not importable here: no PNG (redraw with --chart-only where it is)")
        return False
    models = sorted({r["model"] for r in summary["rows"]})
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(max(6 * len(models), 8), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rows = sorted((r for r in summary["rows"] if r["model"] == model and r["k"] == 3),
                      key=lambda r: r["concurrency"])
        c = [r["concurrency"] for r in rows]
        # fixed colours: a series missing from one panel does not shift the others
        upstream = f"upstream {summary['versions'].get('upstream')}"
        for key, label, style in (("fork_tok_s", "fork", "C0o-"), ("upstream_tok_s", upstream, "C1s--"),
                                  ("nospec_tok_s", "no speculation", "C2^:"),
                                  ("fork_hookoff_tok_s", "fork with patch 0009's hook off", "C5x-."),
                                  ("fork_v1_tok_s", "fork held on vLLM's V1 model runner", "C4v-."),
                                  ("fork_v2_tok_s", "fork held on vLLM's V2 model runner", "C3d-.")):
            points = [(r["concurrency"], r.get(key)) for r in rows
                      if r.get(key) and not (key.startswith("fork") and r.get("invalid"))]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ideal = [(r["concurrency"], r["ideal_speedup"] * r["nospec_tok_s"]) for r in rows
                 if r["ideal_speedup"] and r["nospec_tok_s"] and not r.get("invalid")]
        if ideal:
            ax.plot(*zip(*ideal, strict=True), "k-", alpha=0.35, label="ideal bound (tau, step times)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(c, [str(x) for x in c])
        ax.set_xlabel("concurrency (requests at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{model}, EAGLE-3 k = 3")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['device']} - {summary['date'][:10]}")
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    return True
