"""An adaptive-verification call's result files: ``adaptive.json`` and ``adaptive.md`` (the table, the goal, the
off-domain candidates, what the numbers do not show), and the candidates' own pair of files."""

from __future__ import annotations

from pathlib import Path

from kimi_lab.bench.adaptive.plan import ENGINES, OTHERS
from kimi_lab.bench.perf.render import per_round
from kimi_lab.bench.results import header, write_json, write_lines

#: Column names of the engines.
LABELS = {"nospec": "none", "upstream_k3": "upstream k3", "upstream_table": "upstream table", "fork_k3": "fork k3",
          "adaptive": "adaptive"}

NOT_SHOWN = [
    ("serving overheads (the engines run in-process through `LLM.generate`, every request of a batch submitted at "
    "once and held to its length; no arrivals over time, no HTTP, no streaming);"),
    "start-up: the adaptive engine also profiles its cost curves (`start_s` per engine in the JSON);",
    ("a round's rates are a turn apart (engines in turns, the order reversed every other turn and round): drift of "
    "the machine between turns lands in the per-round ratios, whose spread the table gives;"),
    ("tau is vLLM's (1 + accepted / drafting steps): under adaptive verification a step whose drafts the budget "
    "drops still counts as a drafting step, so its tau is output tokens per request step, not accepted per "
    "verified draft; `verified` counts the drafts actually verified (adaptive verification's counter; for the "
    "other engines every scheduled draft);"),
    ("the c = 1 mixed point is left out (one request cannot be half of each set); at any c a mixed batch is "
    "half code, half off-domain, the two sets' prompt lengths differ (see the prompts line);"),
    ("`vllm bench serve` no longer sends temperature 0 unless told (`--temperature=0`), so its `--dataset-name "
    "random` runs sample at the server's default temperature; these runs are greedy unless `--temperature` says "
    "otherwise (then request i is seeded with i; fork engines keep seeded tokens independent of the drafts, "
    "upstream's do not, so `identical` counts differ for upstream by design)."),
]


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if isinstance(x, float) and x >= 10 else (f"{x:.3g}" if isinstance(x, float) else f"{x}")


def engine_words(engines: dict) -> str:
    """``label = vLLM, its speculative config additions`` per engine of a call's settings."""
    return "; ".join(f"{LABELS[e]} = {variant}" + (f" {extra}" if extra else "")
                     for e, (variant, extra) in engines.items())


def table(rows: list[dict]) -> list[str]:
    """The markdown table: a row per model, prompt set and concurrency."""
    engines = list(ENGINES)
    lines = [("| model | set | c | " + " | ".join(f"{LABELS[e]} tok/s" for e in engines)
              + " | " + " | ".join(f"adaptive / {LABELS[o]} per round [95% CI] (min-max) rounds" for o in OTHERS)
              + " | upstream k3 / none | tau " + " / ".join(LABELS[e] for e in engines if e != "nospec")
              + " | drafts verified " + " / ".join(LABELS[e] for e in engines if e != "nospec")
              + " | identical to none | goal |"),
             "|---" * (3 + len(engines) + len(OTHERS) + 5) + "|"]
    for r in rows:
        ratios = [per_round({f"x_{k}": v for k, v in r["ratios"].get(f"adaptive_vs_{o}", {}).items()}, "x")
                  if r["ratios"].get(f"adaptive_vs_{o}") else "-" for o in OTHERS]
        up = r["ratios"].get("upstream_k3_vs_nospec", {}).get("median")
        spec = [e for e in engines if e != "nospec"]
        same = " / ".join("-" if not r["identical"].get(e) else f"{r['identical'][e][0]}/{r['identical'][e][1]}"
                          for e in spec)
        g = r["goal"]
        verdict = ("not judged" if g["met"] is None else
                   f"{'met' if g['met'] else 'NOT met'} (vs best {g['vs_best']} of {LABELS[g['best_other']]}"
                   + (f"; upstream k3 loses: vs it {g['vs_upstream']}" if g["upstream_loses"] else "") + ")")
        lines.append(f"| {r['model']} | {r['set']} | {r['concurrency']} | "
                     + " | ".join(_num(r["tok_s"].get(e)) for e in engines) + " | " + " | ".join(ratios)
                     + f" | {_num(up)} | " + " / ".join(_num(r["tau"].get(e)) for e in spec)
                     + " | " + " / ".join(_num(r["verified"].get(e)) for e in spec) + f" | {same} | {verdict} |")
    return lines


def candidates_lines(candidates: dict | None) -> list[str]:
    """The off-domain candidates' section: τ of the fork's fixed k = 3 on each candidate kind (and the in-domain
    set for scale), the kind the call's off-domain set uses marked."""
    if not candidates or not candidates.get("rows"):
        return []
    lines = ["", (f"Off-domain candidates: tau of the fork's EAGLE-3 k = 3 (greedy, {candidates['tokens']} tokens, "
                  f"c = {candidates['concurrency']}, one batch each, one engine; `kimi.models.offdomain`); the lowest "
                  f"greedy one is the off-domain set's default; this call's set: `{candidates.get('chosen')}`"), "",
             "| prompts | lengths (tokens) | tau | accepted / drafting steps |", "|---|---|---|---|"]
    for row in candidates["rows"]:
        lines.append(f"| {row['kind']} | {row['lengths']} | {row['tau']} | {row['accepted']} / {row['drafts']} |")
    return lines


def markdown(summary: dict) -> list[str]:
    """``adaptive.md``'s lines from a call's summary (the keys of ``adaptive.json``)."""
    s = summary["settings"]
    lines = [*header("Adaptive verification (EAGLE-3) against fixed k, upstream's batch-size table and no speculation",
                     summary["command"], summary["date"]),
             f"- hardware: {summary['device']}",
             f"- vLLM: {summary['versions']}; {summary['upstream'].get('note', '')}",
             (f"- upstream patches kept: {summary['upstream'].get('kept', [])}; taken out: "
             f"{summary['upstream'].get('removed', [])}"),
             f"- engines ({s['device']}, EAGLE-3 with the pair's drafter): {engine_words(s['engines'])}",
             (f"- prompts: in = held-out code ({s['lengths']['in']} tokens), off = `{s['off_kind']}` "
              f"({s['lengths']['off']} tokens), mixed = the two interleaved; {s['tokens']} output tokens per request, "
              f"{'greedy' if not s.get('temperature') else 'temperature ' + str(s['temperature']) + ', seeded'}, "
              f"EOS ignored; c requests at once; best of {s['reps']} per turn; {s['rounds']} rounds, turns per "
              f"{'point' if s['turns'] == 'concurrency' else 'engine'}; models: {', '.join(s['models'])}"),
             f"- goal: {summary['goal']['rule']}: **{summary['goal']['met']}**"
             + (f" (failing: {', '.join(summary['goal']['failing'])})" if summary["goal"]["failing"] else "")
             + (f" (not judged: {', '.join(summary['goal']['unjudged'])})" if summary["goal"]["unjudged"] else ""),
             "", *table(summary["rows"])]
    failed = {n: r.get("error", "")[-300:] for n, r in summary["runs"].items() if r.get("status") != "done"}
    if failed:
        lines += ["", "Engines that did not finish:", ""] + [f"- {n}: {e.strip()}" for n, e in failed.items()]
    lines += candidates_lines(summary.get("candidates"))
    lines += ["", "Not shown:", ""] + [f"- {item}" for item in NOT_SHOWN]
    lines += [f"- {note}" for note in summary.get("notes", [])]
    return lines


def write_outputs(out: Path, summary: dict, name: str = "adaptive") -> None:
    """``<name>.json`` and ``<name>.md`` under ``out`` (atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", summary)
    write_lines(out / f"{name}.md", markdown(summary))


def write_candidates(out: Path, summary: dict) -> None:
    """``adaptive-candidates.json`` and ``.md``: a call that measured only the off-domain candidates."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "adaptive-candidates.json", summary)
    lines = [*header("Off-domain prompt candidates for the shipped pair: tau of EAGLE-3 k = 3", summary["command"],
                     summary["date"]),
             f"- hardware: {summary['device']}", f"- vLLM: {summary['versions']}",
             *candidates_lines(summary["candidates"])]
    write_lines(out / "adaptive-candidates.md", lines)
