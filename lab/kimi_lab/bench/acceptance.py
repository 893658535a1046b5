"""``benchmarks/acceptance.py``'s pieces: the trained pair it serves, what its result says about the
device, and its chart and markdown. The serving itself is :func:`kimi.train.acceptance.served_acceptance`."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from kimi.errors import KimiError
from kimi.train.charts import acceptance_chart
from kimi.train.engine import on_cuda


def device_name() -> str:
    """``"NVIDIA H200 (CUDA 13.0)"``, or ``"CPU x86_64 (N cores)"`` without CUDA. Imports torch."""
    import torch

    if on_cuda():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def folder_mb(path: Path) -> float:
    """Size of the regular files under ``path`` in MB (links not followed)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


#: What the reference pair must show: plausible completions, and a τ that real drafters reach.
GATES = {"loop_share_max": 0.2, "distinct_2_min": 0.5, "tau_min": 2.0, "tau_max": 3.6, "shifted_gap_min": 0.3}


def load_pair(models: Path) -> dict:
    """The pair's manifest (``MANIFEST.json``), after checking that ``models`` holds a complete pair.

    Raises:
        KimiError: ``models`` lacks ``MANIFEST.json``, ``target/config.json`` or ``drafter/config.json``.
    """
    missing = [name for name in ("MANIFEST.json", "target/config.json", "drafter/config.json")
               if not (models / name).is_file()]
    if missing:
        raise KimiError(f"{models} is not a trained pair (no {', '.join(missing)}): use the shipped one "
                        "(models/pair) or make one with `kimi models train-pair DIR`")
    return json.loads((models / "MANIFEST.json").read_text())


def gates(result: dict) -> dict:
    """Each of :data:`GATES` checked on an acceptance result: ``{name: {"value", "limit", "met"}}``, ``all_met``."""
    q, tau = result["quality"], result["tau"]
    gap = tau - result["tau_shifted_ids"]
    checks = {"loop_share": (q["loop_share"], GATES["loop_share_max"], q["loop_share"] <= GATES["loop_share_max"]),
              "distinct_2": (q["distinct_2"], GATES["distinct_2_min"], q["distinct_2"] >= GATES["distinct_2_min"]),
              "tau": (tau, [GATES["tau_min"], GATES["tau_max"]], GATES["tau_min"] <= tau <= GATES["tau_max"]),
              "shifted_gap": (gap, GATES["shifted_gap_min"], gap >= GATES["shifted_gap_min"])}
    out = {name: {"value": round(v, 4), "limit": limit, "met": bool(met)} for name, (v, limit, met) in checks.items()}
    return {**out, "all_met": all(c["met"] for c in out.values())}


def chart(result: dict, path: Path) -> Path | None:
    """``path``: per-position acceptance as trained and with the shifted ids; None without matplotlib."""
    series = {f"aux ids {result['aux_layer_ids']}: tau {result['tau']:.2f}": result["per_position"],
              f"shifted {result['shifted_ids']}: tau {result['tau_shifted_ids']:.2f}":
                  result["per_position_shifted_ids"]}
    return acceptance_chart(path, series, f"EAGLE-3 acceptance, k = {result['k']}, greedy ({result['device']})")


def markdown(result: dict, png: str | None = None) -> str:
    """``acceptance.md`` for ``result``: τ at each k, per-position acceptance as trained and with the shifted ids,
    the completions' quality and the gates (linking ``png`` when given)."""
    k = result["k"]
    per = " | ".join(f"{p:.3f}" for p in result["per_position"])
    shifted = " | ".join(f"{p:.3f}" for p in result["per_position_shifted_ids"])
    q, g = result["quality"], result["gates"]
    lines = [
        "# EAGLE-3 acceptance of the reference pair", "",
        (f"{result['date']} on {result['device']}, vLLM {result.get('vllm_version', '?')}; greedy, "
         f"{result['prompts']} held-out code prompts x {result['tokens']} tokens; aux layer ids "
         f"{result['aux_layer_ids']} (vLLM's convention)."), "",
        "| k | tau | per position |", "|---|---|---|",
        *(f"| {r['k']} | {r['tau']:.3f} | {' / '.join(f'{p:.3f}' for p in r['per_position'])} |"
          for r in result["by_k"]), "",
        f"Wiring guard at k = {k}:", "",
        "| drafter | tau | " + " | ".join(f"pos {i}" for i in range(k)) + " |",
        "|---|---|" + "---|" * k,
        f"| as trained | {result['tau']:.3f} | {per} |",
        f"| aux ids shifted by one {result['shifted_ids']} | {result['tau_shifted_ids']:.3f} | {shifted} |", "",
        f"tau - tau_shifted_ids = {result['tau'] - result['tau_shifted_ids']:.3f}.", "",
        (f"Completions (the k = {k} run's): loop share {q['loop_share']:.3f} (tail repeating one n-gram to the end), "
         f"distinct-2 {q['distinct_2']:.3f}; the target's held-out loss {q['heldout_loss']} nats/token (training "
         f"corpus {q['train_loss']})."), "",
        "| gate | value | limit | met |", "|---|---|---|---|",
        *(f"| {name} | {g[name]['value']} | {g[name]['limit']} | {'yes' if g[name]['met'] else 'NO'} |"
          for name in ("loop_share", "distinct_2", "tau", "shifted_gap")), "",
        f"Command: `{result['command']}`", "",
        *([f"![per-position acceptance]({png})", ""] if png else [])]
    return "\n".join(lines)
