"""``benchmarks/acceptance.py``'s pieces (issue F): the trained pair it serves, what its result says about the
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


def load_pair(models: Path, default: Path) -> dict:
    """The pair's manifest; trains the pair only in the default folder, when missing or made with another recipe
    (a carried pair is used as it is).

    Raises:
        KimiError: ``models`` is not the default folder and is not a complete pair.
    """
    from kimi.train.pair import train_pair

    missing = [name for name in ("MANIFEST.json", "target/config.json", "drafter/config.json")
               if not (models / name).is_file()]
    if missing and models.resolve() != default.resolve():
        raise KimiError(f"{models} is not a trained pair (no {', '.join(missing)}): make one with "
                        "`kimi models train-pair DIR` and carry its target/, drafter/ and MANIFEST.json")
    if models.resolve() == default.resolve():
        return train_pair(models)  # kept when complete and made with the current recipe
    return json.loads((models / "MANIFEST.json").read_text())


def chart(result: dict, path: Path) -> Path | None:
    """``path``: per-position acceptance as trained and with the shifted ids; None without matplotlib."""
    series = {f"aux ids {result['aux_layer_ids']}: tau {result['tau']:.2f}": result["per_position"],
              f"shifted {result['shifted_ids']}: tau {result['tau_shifted_ids']:.2f}":
                  result["per_position_shifted_ids"]}
    return acceptance_chart(path, series, f"EAGLE-3 acceptance, k = {result['k']}, greedy ({result['device']})")


def markdown(result: dict, png: str | None = None) -> str:
    """``acceptance.md`` for ``result``: tau and per-position acceptance as trained and with the shifted ids
    (linking ``png`` when given)."""
    per = " | ".join(f"{p:.3f}" for p in result["per_position"])
    shifted = " | ".join(f"{p:.3f}" for p in result["per_position_shifted_ids"])
    return "\n".join([
        "# EAGLE-3 acceptance of the trained reference pair", "",
        (f"{result['date']} on {result['device']}; k = {result['k']}, greedy, {result['prompts']} held-out code "
         f"prompts x {result['tokens']} tokens; aux layer ids {result['aux_layer_ids']} (vLLM's convention)."), "",
        "| drafter | tau | " + " | ".join(f"pos {i}" for i in range(result["k"])) + " |",
        "|---|---|" + "---|" * result["k"],
        f"| as trained | {result['tau']:.3f} | {per} |",
        f"| aux ids shifted by one {result['shifted_ids']} | {result['tau_shifted_ids']:.3f} | {shifted} |", "",
        f"tau - tau_shifted_ids = {result['tau'] - result['tau_shifted_ids']:.3f}. Command: `{result['command']}`", "",
        *([f"![per-position acceptance]({png})", ""] if png else [])])
