"""Replay the fork's patch series over real upstream history and record what happens.

Everything runs in fresh temporary copies of this checkout (the working
checkout is not touched).

* The origin line is taken 0.16.0 -> 0.17.0 -> 0.18.0, each step starting from
  the previous step's result: ``kimi sync``, then a real ``kimi rebase --to``
  (not a dry run: the next step needs the rebased series).  Conflicts are
  resolved by ``kimi rebase --ports`` with the ports kept in
  ``benchmarks/rebase_ports/<line>-<release>/`` (the patch as a maintainer
  rewrote it for that release); a conflict without a port stops the script.
* The v0.26 line (the mainline before it moved) is replayed onto 0.32.0 as a
  dry run with the resolutions the mainline's rebase kept
  (``kimi/lines/v0.32/ports/0.32.0``): the move repeated without a hand.
  With ``--verify-installed`` the patches it drops as declared absorbed have
  their ``Absorbed-check`` tests run against the mainline installed in this
  checkout's ``.venv`` (vLLM 0.32.0 without them).
  With ``--verify-venv VENV`` the step that drops patches declared absorbed
  also installs the rebased line into VENV (``kimi test --line origin
  --venv VENV``) and runs each dropped patch's ``Absorbed-check`` tests
  against the new release - the evidence that upstream's own fix covers the
  symptom - and then the line's other tests, whose failures name what the
  fork did that upstream does not.
* The v0.32 line (the mainline before it moved to 0.34.0) is replayed onto
  0.34.0 as a dry run with the resolutions kept in ``kimi/lines/v0.32/ports/0.34.0``.

The per-step reports are collected into ``benchmarks/results/rebase.json`` and
``rebase.md`` (plus each step's own report), with the command, the date and
the machine.

    python benchmarks/rebase_history.py [--verify-venv .kimi/envs/origin/.venv]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.fork.checkout import fresh_copy
from kimi.fork.fsutil import write_atomic, write_json_atomic
from kimi.fork.layout import Layout
from kimi.fork.probe import pytest_counts
from kimi_lab.bench.hardware import cpu_name

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PORTS = ROOT / "benchmarks" / "rebase_ports"
# Chains of (line, target releases, dry run) in history order; a chain's steps start from the previous step's result.
CHAINS = [("origin", ["0.17.0", "0.18.0"], False), ("v0.26", ["0.32.0"], True), ("v0.32", ["0.34.0"], True)]


def ports_for(line: str, target: str) -> Path | None:
    """The kept resolutions a step replays: ``benchmarks/rebase_ports/<line>-<target>`` (the origin history), else
    ``kimi/lines/<line or the mainline>/ports/<target>`` (what ``kimi rebase --continue`` kept), if there."""
    for folder in (PORTS / f"{line}-{target}", ROOT / "kimi" / "lines" / line / "ports" / target,
                   ROOT / "kimi" / "lines" / "mainline" / "ports" / target):
        if folder.is_dir():
            return folder
    return None



def _kimi(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KIMI_CACHE_DIR": str(Layout.of(ROOT).cache), "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-m", "kimi", *args], cwd=cwd, env=env, capture_output=True, text=True)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-4000:]}")


def _pytest_counts(output: str) -> dict:
    """pytest's closing counts (``3 passed, 1 failed``), the failed test ids and each failure's last error
    lines (``E ...``, at most 6 per test)."""
    closing = output.strip().splitlines()[-1] if output.strip() else ""
    counts: dict = pytest_counts(closing)
    counts["failed_tests"] = sorted(set(re.findall(r"^FAILED (\S+)", output, re.M)))
    sections = re.split(r"^_{3,} (test_\w+) _{3,}$", output, flags=re.M)
    counts["errors"] = {name: [line[1:].strip() for line in body.splitlines() if line.startswith("E ")][-6:]
                        for name, body in zip(sections[1::2], sections[2::2], strict=False)}
    return counts


def _verify(copy: Path, venv: Path, absorbed: list[dict]) -> dict:
    """Install the rebased line into ``venv`` and run the dropped patches' checks, then the rest."""
    checks = sorted({t for a in absorbed for t in a.get("verify", [])})
    started = time.monotonic()
    run = _kimi(copy, "test", "--line", "origin", "--venv", str(venv), "--", "-q", "-rf", "-p", "no:cacheprovider",
                *checks)
    result = {"command": f"kimi test --line origin --venv VENV -- {' '.join(checks)}", "checks": checks,
              "absorbed_checks": _pytest_counts(run.stdout)}
    rest = _kimi(copy, "test", "--line", "origin", "--venv", str(venv), "--", "-q", "-rf", "-p", "no:cacheprovider",
                 *[f"--deselect={t}" for t in checks])
    result["other_tests"] = _pytest_counts(rest.stdout)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _verify_installed(absorbed: list[dict], target: str) -> dict:
    """The dropped patches' checks against the line installed in this checkout's ``.venv`` (the mainline on
    ``target``, which does not carry them)."""
    python = ROOT / ".venv" / "bin" / "python"
    checks = sorted({t for a in absorbed for t in a.get("verify", [])})
    started = time.monotonic()
    env = {**os.environ, "KIMI_TEST_INSTALLED": "1", "KIMI_CACHE_DIR": str(Layout.of(ROOT).cache)}
    run = subprocess.run([str(python), "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *checks], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    return {"command": f".venv/bin/python -m pytest {' '.join(checks)} (the mainline on {target})", "checks": checks,
            "absorbed_checks": _pytest_counts(run.stdout), "other_tests": None,
            "seconds": round(time.monotonic() - started, 1)}


def run_chain(line: str, targets: list[str], dry_run: bool, verify_venv: Path | None,
              keep: Path | None = None, verify_installed: bool = False) -> list[dict]:
    """Take ``line`` through ``targets`` in one fresh copy (kept at ``keep/<line>`` if given); returns one
    record per step."""
    steps = []
    with tempfile.TemporaryDirectory(prefix="kimi-rebase-") as tmp:
        copy = keep / line if keep else Path(tmp) / "fork"
        fresh_copy(ROOT, copy)
        for target in targets:
            _check(_kimi(copy, "sync", "--line", line), f"kimi sync --line {line}")
            started = time.monotonic()
            ports = ports_for(line, target)
            args = ["rebase", "--to", target] + (["--dry-run"] if dry_run else []) + \
                (["--ports", str(ports)] if ports else [])
            _check(_kimi(copy, *args), f"kimi {' '.join(args)}")
            report = json.loads((copy / ".kimi" / "rebase" / "report.json").read_text())
            markdown = (copy / ".kimi" / "rebase" / "report.md").read_text()
            step = {key: report[key] for key in ("line", "from", "to", "dry_run", "applied", "absorbed", "conflicts")}
            step["conflicts"] = step["conflicts"] + [
                {"name": p["name"], "files": next(o["conflicts"] for o in report["patches"] if o["name"] == p["name"]),
                 "resolved_by": str(Path(p["port"]).relative_to(ROOT))} for p in report["ported"]]
            step["seconds"] = round(time.monotonic() - started, 1)
            step["report_md"] = f"rebase-{line}-{report['from']}-{report['to']}.md"
            if not dry_run:
                _git(copy, "add", "-A")
                _git(copy, "-c", "user.name=kimi", "-c", "user.email=kimi@localhost", "commit", "-q", "-m",
                     f"{line} rebased onto {target}")
            declared = [a for a in report["absorbed"] if a.get("how") == "declared"]
            if declared and line != "origin" and verify_installed:
                step["verification"] = _verify_installed(declared, target)
                markdown += _verification_md(step["verification"])
            elif declared and line == "origin" and verify_venv is not None:
                _check(_kimi(copy, "sync", "--line", line), f"kimi sync --line {line}")
                step["verification"] = _verify(copy, verify_venv, declared)
                markdown += _verification_md(step["verification"])
            elif declared:
                step["verification"] = "not run (give --verify-venv / --verify-installed)"
            write_atomic(RESULTS / step["report_md"], markdown)
            steps.append(step)
    return steps


def _verification_md(v: dict) -> str:
    a, o = v["absorbed_checks"], v["other_tests"]
    rows = ["", "## Verification against the new release", "", f"`{v['command']}` ({v['seconds']} s):", "",
            f"- Absorbed-check tests: {a.get('passed', 0)} passed, {a.get('failed', 0)} failed"]
    rows += [f"  - failed: `{t}`" for t in a["failed_tests"]]
    if o is not None:
        rows += [(f"- the line's other tests: {o.get('passed', 0)} passed, {o.get('failed', 0)} failed "
                  "(a failure names fork behaviour upstream does not have)")]
        rows += [f"  - failed: `{t}`" for t in o["failed_tests"]]
    return "\n".join(rows) + "\n"


def _cell(items: list[str]) -> str:
    return ", ".join(items) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verify-venv", type=Path, default=None,
                        help="venv (torch of the origin line) to install the rebased origin line into and run "
                             "the absorbed patches' checks against the new release")
    parser.add_argument("--verify-installed", action="store_true",
                        help="run the Absorbed-check tests of the patches a mainline-family replay drops against "
                             "the line installed in this checkout's .venv")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep each line's scratch copy in DIR/<line> (must not exist) for inspection")
    args = parser.parse_args()
    lines = {p.name for p in (ROOT / "kimi" / "lines").iterdir() if (p / "pin.json").is_file()}
    venv = args.verify_venv.resolve() if args.verify_venv else None
    keep = args.keep.resolve() if args.keep else None
    steps = [s for line, targets, dry in CHAINS if line in lines
             for s in run_chain(line, targets, dry, venv, keep, args.verify_installed)]
    skipped = [f"{line} -> {', '.join(targets)}" for line, targets, _ in CHAINS if line not in lines]
    command = ("python benchmarks/rebase_history.py" + (" --verify-venv VENV" if venv else "")
               + (" --verify-installed" if args.verify_installed else ""))
    result = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": cpu_name(),
              "steps": steps, "not_run": [f"{s} (line not in kimi/lines)" for s in skipped]}
    write_json_atomic(RESULTS / "rebase.json", result)
    rows = ["# Rebase history", "",
            (f"`{command}` on {result['date']}, {result['machine']}. Each line's steps start from the previous "
             "step's result; origin steps are real rebases, the v0.26 and mainline steps dry runs; conflicts are "
             "resolved with kept ports (`kimi rebase --ports`)."), "",
            "| line | from | to | applied | absorbed | conflicts | report |", "|---|---|---|---|---|---|---|"]
    for s in steps:
        absorbed = _cell([f"{a['name']} (in {a['in']}" + (f", declared absorbed in {a['declared']}, replay: "
                                                          f"{a['replay']}" if a.get("how") == "declared" else "")
                          + ")" for a in s["absorbed"]])
        conflicts = _cell([f"{c['name']} ({', '.join(c['files'])}"
                           + (f"; resolved with {Path(c['resolved_by']).parent.name} port" if c.get("resolved_by")
                              else "") + ")" for c in s["conflicts"]])
        rows.append(f"| {s['line']} | {s['from']} | {s['to']}{' (dry run)' if s['dry_run'] else ''} | "
                    f"{_cell(s['applied'])} | {absorbed} | {conflicts} | [{s['report_md']}]({s['report_md']}) |")
    for s in steps:
        v = s.get("verification")
        if isinstance(v, dict):
            a, o = v["absorbed_checks"], v["other_tests"]
            others = "" if o is None else (
                f"; the line's other tests: {o.get('passed', 0)} passed, {o.get('failed', 0)} failed"
                + (f" ({', '.join(t.split('::')[-1] for t in o['failed_tests'])})" if o["failed_tests"] else ""))
            rows += ["", (f"{s['line']} {s['to']}: the dropped patches' Absorbed-check tests on upstream {s['to']}: "
                          f"{a.get('passed', 0)} passed, {a.get('failed', 0)} failed{others}.")]
        elif v:
            rows += ["", f"{s['line']} {s['to']}: verification {v}."]
    rows += [f"\nNot run: {', '.join(result['not_run'])}." if skipped else ""]
    write_atomic(RESULTS / "rebase.md", "\n".join(rows).rstrip() + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
