"""Replay the fork's patch series over real upstream history and record what happens.

Each step runs in a fresh temporary copy of this checkout (the working
checkout is not touched): ``kimi sync`` of the line, then
``kimi rebase --to NEXT --dry-run``.  The per-step reports (applied,
absorbed with the release, conflicts with files and marker lines) are
collected into ``benchmarks/results/rebase.json`` and ``rebase.md``, with the
command, the date and the machine.

Steps run: the lines present in ``kimi/lines`` among ``STEPS``.

    python benchmarks/rebase_history.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# (line, target release) in history order; the origin line's steps run once that line exists.
STEPS = [("origin", "0.17.0"), ("origin", "0.18.0"), ("mainline", "0.33.0")]

sys.path.insert(0, str(ROOT))
from kimi.fork.checkout import fresh_copy  # noqa: E402
from kimi.fork.fsutil import write_atomic, write_json_atomic  # noqa: E402
from kimi.fork.layout import Layout  # noqa: E402


def _kimi(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KIMI_CACHE_DIR": str(Layout.of(ROOT).cache), "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-m", "kimi", *args], cwd=cwd, env=env, capture_output=True, text=True)


def run_step(line: str, target: str) -> dict:
    """Sync ``line`` in a fresh copy and dry-run its rebase onto ``target``; returns the step's record."""
    with tempfile.TemporaryDirectory(prefix="kimi-rebase-") as tmp:
        copy = Path(tmp) / "fork"
        fresh_copy(ROOT, copy)
        synced = _kimi(copy, "sync", "--line", line)
        if synced.returncode != 0:
            raise SystemExit(f"kimi sync --line {line} failed:\n{synced.stderr}")
        started = time.monotonic()
        rebased = _kimi(copy, "rebase", "--to", target, "--dry-run")
        if rebased.returncode != 0:
            raise SystemExit(f"kimi rebase --to {target} --dry-run failed:\n{rebased.stderr}")
        report = json.loads((copy / ".kimi" / "rebase" / "report.json").read_text())
        markdown = (copy / ".kimi" / "rebase" / "report.md").read_text()
    step = {key: report[key] for key in ("line", "from", "to", "applied", "absorbed", "conflicts")}
    step["seconds"] = round(time.monotonic() - started, 1)
    step["report_md"] = f"rebase-{line}-{report['from']}-{report['to']}.md"
    write_atomic(RESULTS / step["report_md"], markdown)
    return step


def machine() -> str:
    """CPU model and core count (``/proc/cpuinfo`` where there is one)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def main() -> None:
    lines = {p.name for p in (ROOT / "kimi" / "lines").iterdir() if (p / "pin.json").is_file()}
    steps = [run_step(line, target) for line, target in STEPS if line in lines]
    skipped = [f"{line} -> {target}" for line, target in STEPS if line not in lines]
    result = {
        "command": "python benchmarks/rebase_history.py", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "steps": steps, "not_run": [f"{s} (line not in kimi/lines yet)" for s in skipped],
    }
    write_json_atomic(RESULTS / "rebase.json", result)
    rows = ["# Rebase history (dry runs)", "", f"`{result['command']}` on {result['date']}, {result['machine']}.", "",
            "| line | from | to | applied | absorbed | conflicts | report |", "|---|---|---|---|---|---|---|"]
    for s in steps:
        absorbed = ", ".join(f"{a['name']} (in {a['in']})" for a in s["absorbed"]) or "-"
        conflicts = ", ".join(f"{c['name']} ({', '.join(c['files'])})" for c in s["conflicts"]) or "-"
        rows.append(f"| {s['line']} | {s['from']} | {s['to']} | {', '.join(s['applied']) or '-'} | {absorbed} | "
                    f"{conflicts} | [{s['report_md']}]({s['report_md']}) |")
    rows += [f"\nNot run: {', '.join(result['not_run'])}." if skipped else ""]
    write_atomic(RESULTS / "rebase.md", "\n".join(rows).rstrip() + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
