"""The drafter-training pipeline end to end through the fork's vLLM on CPU, and the trained pair's acceptance.

* a tiny pair (minutes): every ``kimi train`` stage, the exported drafter passes ``kimi drafter inspect``,
  the stages resume (a second run does nothing), and ``--init`` warm starts;
* the shipped reference pair (``models/pair``, the session fixture ``trained_pair``): served on CPU with k = 3,
  greedy, held-out prompts, tau > :data:`MIN_TAU`, and the same drafter with its aux ids shifted by one gets
  clearly less (by :data:`GUARD_MARGIN`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.drafter.conventions import default_ids

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.install

#: How much lower tau must be with every aux id shifted by one (the wiring guard). Measured here with the shipped
#: pair (the unlikelihood-trained target of 2026-12-04 and its 24576-answer H200 drafter; CPU, float32,
#: deterministic; this test's 8 prompts x 48 tokens): 2.159 vs 1.840 with ids (1, 3, 4), gap 0.319 (the memorising
#: target's drafter before it: 1.819 vs 1.696, gap 0.123); the benchmark's 16 x 64 gives 2.228 vs 1.925 on CPU
#: (benchmarks/results/cpu/acceptance.md). The margin is under half the gap measured here: a drafter served with
#: its neighbours' states fails it.
GUARD_MARGIN = 0.15

#: The served tau the shipped pair must reach here (measured 2.159; the memorising target's drafter: 1.819, the
#: CPU-trained one before that: 1.477).
MIN_TAU = 1.9


def _kimi(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kimi", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_tiny_pipeline_end_to_end(tmp_path: Path):
    pair = tmp_path / "pair"
    made = _kimi("models", "train-pair", str(pair), "--tiny")
    assert made.returncode == 0, made.stderr[-3000:]
    manifest = json.loads((pair / "MANIFEST.json").read_text())
    drafter = json.loads((pair / "drafter" / "config.json").read_text())
    # no ids in the tiny recipe: vLLM's default for the 6-layer target, (2, 3, 3), repeats one, so distinct ones
    assert drafter["eagle_aux_hidden_state_layer_ids"] == manifest["aux_layer_ids"] == list(default_ids(6)) == [1, 3, 5]
    assert drafter["eagle_aux_hidden_state_layer_ids_convention"] == "layer_input"
    assert manifest["served"]["counters"]["num_drafts"] > 0 and len(manifest["served"]["per_position"]) == 3
    work = pair / "work"
    index = json.loads((work / "capture" / "index.json").read_text())
    assert index["sequences"] == 12 and index["aux_layer_ids"] == [1, 3, 5]
    assert (work / "report" / "report.md").is_file() and (work / "report" / "curves.csv").is_file()
    inspected = _kimi("drafter", "inspect", str(pair / "drafter"), "--target", str(pair / "target"), "--json")
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    again = _kimi("train", "regenerate", "--work", str(work), "--target", str(pair / "target"),
                  "--num-prompts", "12", "--max-tokens", "16")
    assert again.returncode == 0 and "answered already" in again.stderr
    again = _kimi("train", "capture", "--work", str(work), "--target", str(pair / "target"))
    assert again.returncode == 0 and "captured already" in again.stderr
    refused = _kimi("train", "train", "--work", str(work), "--target", str(pair / "target"))
    assert refused.returncode == 1 and "--resume" in refused.stderr
    warm = tmp_path / "warm"
    for name in ("samples.jsonl", "capture", "vocab.safetensors"):
        (warm / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(work / name, warm / name)
    started = _kimi("train", "train", "--work", str(warm), "--target", str(pair / "target"), "--epochs", "1",
                    "--batch", "4", "--init", str(pair / "drafter"))
    assert started.returncode == 0 and "warm start" in started.stderr, started.stderr[-2000:]


def test_trained_pair_acceptance_and_wiring_guard(tmp_path: Path, trained_pair: Path):
    from kimi.e2e.engine import tokenize
    from kimi.models.prompts import code_prompts
    from kimi.train.acceptance import served_acceptance
    from kimi.train.export import shifted_ids, with_ids

    models = trained_pair
    target, drafter = str(models / "target"), models / "drafter"
    ids = json.loads((drafter / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    layers = json.loads((models / "target" / "config.json").read_text())["num_hidden_layers"]
    wrong = shifted_ids(ids, layers)
    assert wrong != ids and len(wrong) == len(ids)
    prompts = tokenize(target, code_prompts(8))
    ours = served_acceptance(target, str(drafter), prompts, k=3, max_tokens=48)
    shifted = served_acceptance(target, str(with_ids(drafter, wrong, tmp_path / "shifted")), prompts,
                                k=3, max_tokens=48)
    assert ours["tau"] > MIN_TAU, ours
    assert shifted["tau"] < ours["tau"] - GUARD_MARGIN, (ids, ours["tau"], wrong, shifted["tau"])
    assert ours["tokens"] == shifted["tokens"]  # greedy output does not depend on the drafter
