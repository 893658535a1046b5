"""Stage f, report: training curves and served per-position acceptance, as PNG charts and a markdown summary.

Reads ``work/train/log.jsonl`` (loss, per-step TTT acceptance, tau_ttt per optimiser step) and, when
given, a served-acceptance result (:func:`kimi.train.acceptance.served_acceptance` or
``benchmarks/results/acceptance.json``). Writes ``work/report/``: ``curves.csv`` (always),
``training.png`` (loss and per-step TTT acceptance, moving averages) and ``acceptance.png`` (served
per-position acceptance) where matplotlib is importable (``kimi setup`` installs it into the fork's venv;
without it the report says so and keeps the data), ``served.json`` and ``report.md``. Every file is written
atomically (temp file + rename).
"""

from __future__ import annotations

import json
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import write_atomic
from kimi.train.charts import acceptance_chart, pyplot, save_png
from kimi.train.engine import say
from kimi.train.store import read_json


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def read_log(work: Path) -> list[dict]:
    path = work / "train" / "log.jsonl"
    if not path.is_file():
        raise KimiError(f"no {path}: run `kimi train train` first")
    rows = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows[row["step"]] = row  # a resumed run rewrites steps after its checkpoint: the last one wins
    return [rows[s] for s in sorted(rows)]


def _charts(folder: Path, log: list[dict], served: dict | None, window: int) -> list[str]:
    """Write ``training.png`` (loss; TTT acceptance per step) and, with ``served``, ``acceptance.png`` (served
    per-position acceptance), atomically; returns their names, or [] without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    steps = [r["step"] for r in log]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(steps, smooth([r["loss"] for r in log], window))
    ax1.set(xlabel="step", ylabel="TTT loss (position-weighted CE)", title="loss")
    for j in range(len(log[0]["acc"])):
        ax2.plot(steps, smooth([r["acc"][j] for r in log], window), label=f"TTT step {j}")
    ax2.set(xlabel="step", ylabel="acceptance (argmax match)", title="training-time test acceptance")
    ax2.legend()
    fig.tight_layout()
    save_png(fig, folder / "training.png")
    names = ["training.png"]
    if served:
        acceptance_chart(folder / "acceptance.png", {"served": served["per_position"]},
                         f"served, greedy, k = {served['k']}, tau = {served['tau']:.2f}")
        names.append("acceptance.png")
    return names


def report(work: Path, served: dict | None = None, window: int = 20) -> Path:
    """Write ``work/report`` (see module docstring); returns the markdown file.

    Without ``served``, the served result an earlier report kept (``work/report/served.json``) is used.

    Raises:
        KimiError: no training log in ``work``.
    """
    log = read_log(work)
    folder = work / "report"
    served = served or read_json(folder / "served.json")
    folder.mkdir(parents=True, exist_ok=True)
    k = len(log[0]["acc"])
    csv = "step,loss,tau_ttt," + ",".join(f"acc_{j}" for j in range(k)) + "\n" + "".join(
        f"{r['step']},{r['loss']:.5f},{r['tau_ttt']:.4f}," + ",".join(f"{a:.4f}" for a in r["acc"]) + "\n" for r in log)
    write_atomic(folder / "curves.csv", csv)
    if served:
        write_atomic(folder / "served.json", json.dumps({k2: v for k2, v in served.items() if k2 != "tokens"},
                                                        indent=2) + "\n")
    charts = _charts(folder, log, served, window)
    tail = log[-min(window, len(log)):]
    lines = ["# EAGLE-3 drafter training report", "",
             f"{len(log)} optimiser steps; means over the last {len(tail)} steps:", "",
             "| loss | tau_ttt | " + " | ".join(f"TTT acc step {j}" for j in range(k)) + " |",
             "|---|---|" + "---|" * k,
             f"| {sum(r['loss'] for r in tail) / len(tail):.3f} | {sum(r['tau_ttt'] for r in tail) / len(tail):.2f} | "
             + " | ".join(f"{sum(r['acc'][j] for r in tail) / len(tail):.3f}" for j in range(k)) + " |", ""]
    if served:
        lines += [f"Served (vLLM, greedy, k = {served['k']}): tau = {served['tau']:.2f}; per-position acceptance "
                  + ", ".join(f"{p:.3f}" for p in served["per_position"]) + ".", ""]
    if charts:
        lines += [f"![{name}]({name})" for name in charts]
    else:
        lines += [("No PNG charts: matplotlib is not installed in this environment (`kimi setup` installs it into "
                  "the fork's venv). The curves are in `curves.csv` (and the served numbers in `served.json`); run "
                  "`kimi train report` where matplotlib is importable to draw them.")]
    write_atomic(folder / "report.md", "\n".join(lines) + "\n")
    say(f"report: {folder / 'report.md'}" + ("" if charts else " (no matplotlib: data only, no PNG)"))
    return folder / "report.md"
