"""What a gpu_e2e call runs: the reference models, the profiles (``--small``, ``--cpu-smoke``) and the jobs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kimi.errors import KimiError
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench.gpu_e2e import log
from kimi_lab.bench.gpu_e2e.lanes import Job, Run
from kimi_lab.bench.workers import checkout, tail

#: Image requests of the Kimi-K2.5 runs: the wrapper's placeholder token (kimi.models.kimi_k25.MEDIA_TOKEN) in
#: a text prompt, one plain 224 x 224 image per color (16 x 16 patches of 14 pixels, merged 2 x 2: 64 tokens).
K25_IMAGE_PROMPT = "# an image: <|media_pad|>\ndef describe(image):\n"
IMAGE_COLORS = ("red", "blue", "green", "white", "black", "yellow", "cyan", "magenta")

#: The settings each profile changes, unless given on the command line.
PROFILES = {
    "small": (("prompts", 8), ("tokens", 16), ("ks", [3]), ("lanes", 2), ("k25_styles", [])),
    "cpu_smoke": (("prompts", 4), ("tokens", 8), ("ks", [1]), ("lanes", 1), ("k25_k", 1), ("serve_k", 1),
                  ("clients", 4), ("budget_s", 3000), ("job_timeout_s", 900), ("min_job_s", 10)),
}


def prompt_max_len(engine: dict, tokens: int) -> int:
    """The longest prompt (tokens) that leaves room for ``tokens`` generated ones in ``engine``'s context."""
    return min(96, engine["max_model_len"] - tokens - 8)


def apply_profiles(args: argparse.Namespace, argv: list[str]) -> None:
    """Set the settings of ``--small`` and ``--cpu-smoke`` on ``args`` where ``argv`` does not give them."""
    explicit = {a.split("=")[0] for a in argv if a.startswith("--")}
    for profile, settings in PROFILES.items():
        if getattr(args, profile):
            for key, value in settings:
                if "--" + key.replace("_", "-") not in explicit:
                    setattr(args, key, value)


def ensure_models(run: Run, models: Path, make: bool) -> None:
    """Make the reference models with ``python -m kimi models make`` unless ``models`` has them (or ``make``);
    note what they are in ``run.models``.

    Raises:
        KimiError: ``kimi models make`` failed (the end of its log in the message).
    """
    if (models / "MANIFEST.json").is_file() and not make:
        log(f"models: using {models}")
    else:
        log(f"models: python -m kimi models make {models}")
        t0 = time.monotonic()
        with open(run.logs / "models.log", "wb") as out:
            proc = subprocess.run([sys.executable, "-m", "kimi", "models", "make", str(models), "--force"],
                                  cwd=checkout(), stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(checkout())})
        if proc.returncode != 0:
            raise KimiError(f"kimi models make failed:\n{tail(run.logs / 'models.log')}")
        log(f"models: made in {time.monotonic() - t0:.0f} s")
    manifest = json.loads((models / "MANIFEST.json").read_text())
    run.models = {"dir": str(models), "aux_layer_ids": manifest.get("aux_layer_ids"),
                  "python": manifest.get("corpus", {}).get("python"),
                  "kimi_k25": (models / "kimi-k25" / "config.json").is_file(),
                  "files": sorted(manifest.get("files", {}))}


def plan(run: Run, models: Path) -> tuple[list[Job], dict[str, list[Job]], list[Job]]:
    """(phase-1 jobs, phase-2 jobs per drafter style, Kimi-K2.5 jobs); sets ``run.spec_names`` and ``run.planned``."""
    a = run.args
    timeout = a.job_timeout_s

    def job(name: str, target: str | Path, style: str | Path | None, k: int | None, group: str = "target") -> Job:
        """``style`` names a reference drafter (``drafter-<style>``) or is a drafter folder."""
        drafter = style if isinstance(style, Path) else models / f"drafter-{style}"
        spec = None if style is None else {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}
        engine = {**run.engine, "max_num_seqs": max(8, len(run.prompts))}
        return Job(name, str(models / target), spec, engine, group, timeout)

    base = job("base", "target", None, None)
    styles = {style: [job(f"{style}_k{k}", "target", style, k) for k in a.ks] for style in a.styles}
    k25 = []
    if run.models["kimi_k25"] and a.k25:
        k25 = [job("k25_base", "kimi-k25", None, None, "k25"),
               *[job(f"k25_{style}_k{a.k25_k}", "kimi-k25", style, a.k25_k, "k25") for style in a.k25_styles]]
        if a.k25_images:
            for j in k25:
                j.images = {"prompt": K25_IMAGE_PROMPT, "colors": IMAGE_COLORS[:a.k25_images]}
    if a.pair:
        # the shipped pair: its own tokenizer, so its own prompts, cut as the reference target's are
        prompts = code_prompt_ids(a.pair / "target" / "tokenizer.json", len(run.prompts),
                                  prompt_max_len(run.engine, a.tokens))
        styles["pair"] = [job("pair_base", a.pair / "target", None, None, "pair"),
                          *[job(f"pair_k{k}", a.pair / "target", a.pair / "drafter", k, "pair") for k in a.ks]]
        for j in styles["pair"]:
            j.prompts = prompts
    run.spec_names = {j.name for jobs in styles.values() for j in jobs if j.spec} | {j.name for j in k25 if j.spec}
    run.planned = {base.name} | {j.name for jobs in styles.values() for j in jobs} | {j.name for j in k25}
    return [base], styles, k25
