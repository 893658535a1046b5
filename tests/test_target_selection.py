"""Choosing the reference target among candidates (``kimi models pick-target``): the bar, the choice, the errors,
and the greedy completions it is judged on (one padded batch must give what each prompt alone gives)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.errors import KimiError
from kimi.models.selection import SELECTION_PROMPTS, QualityBar, pick_target

ROOT = Path(__file__).resolve().parents[1]


def _candidate(root: Path, name: str, heldout: float, loops: float, distinct: float, site_mb: int = 0) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "MANIFEST.json").write_text(json.dumps({
        "spec": {}, "heldout_loss": heldout, "training": {"site_bytes": site_mb * 1_000_000},
        "quality": {"loop_share": loops, "distinct_2": distinct}}))
    (folder / "model.safetensors").write_bytes(b"weights of " + name.encode())
    return folder


def test_the_lowest_heldout_loss_among_those_clearing_the_bar_is_kept(tmp_path: Path):
    memorised = _candidate(tmp_path, "stdlib", 4.1, 0.0, 0.62)
    looping = _candidate(tmp_path, "site100", 2.3, 0.75, 0.28)  # lowest loss, but its code loops
    middle = _candidate(tmp_path, "site10", 3.0, 0.125, 0.55)  # exactly at the bar: kept
    chosen, rows = pick_target([memorised, looping, middle])
    assert chosen == middle
    assert [row["clears_bar"] for row in rows] == [True, False, True]
    assert rows[1]["heldout_loss"] == 2.3


def test_no_candidate_clearing_the_bar_gives_none(tmp_path: Path):
    chosen, rows = pick_target([_candidate(tmp_path, "a", 2.6, 0.44, 0.28), _candidate(tmp_path, "b", 2.7, 0.1, 0.3)])
    assert chosen is None and not any(row["clears_bar"] for row in rows)
    chosen, _ = pick_target([tmp_path / "b"], QualityBar(max_loop_share=0.2, min_distinct_2=0.25))
    assert chosen == tmp_path / "b"


def test_a_target_without_recorded_quality_is_named(tmp_path: Path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "MANIFEST.json").write_text(json.dumps({"heldout_loss": 4.1}))  # before train-target recorded quality
    with pytest.raises(KimiError, match="train it with `kimi models train-target`"):
        pick_target([old])
    with pytest.raises(KimiError, match="not a target"):
        pick_target([tmp_path / "missing"])
    partial = _candidate(tmp_path, "partial", 3.0, 0.0, 0.6)
    (partial / "MANIFEST.json").write_text(json.dumps({"heldout_loss": 3.0, "quality": {"loop_share": 0.0}}))
    with pytest.raises(KimiError, match="not a target"):
        pick_target([partial])


def _pick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kimi", "models", "pick-target", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_pick_target_command_copies_the_chosen_one_or_writes_nothing(tmp_path: Path):
    a = _candidate(tmp_path, "a", 2.6, 0.44, 0.28, site_mb=10)
    b = _candidate(tmp_path, "b", 3.5, 0.0, 0.6, site_mb=0)
    out = tmp_path / "picked"
    run = _pick(str(a), "--into", str(out))
    assert run.returncode == 3 and not out.exists(), run.stderr  # 3: none clears the bar (1: an error)
    assert "no candidate clears the bar" in run.stderr and "site 10 MB" in run.stderr
    run = _pick(str(a), str(b), "--into", str(out))
    assert run.returncode == 0, run.stderr
    assert (out / "model.safetensors").read_bytes() == b"weights of b"
    assert json.loads((out / "MANIFEST.json").read_text())["heldout_loss"] == 3.5
    run = _pick(str(b), "--into", str(out))  # an earlier pick is not replaced without --force
    assert run.returncode == 1 and "--force" in run.stderr
    for inside in (b, b / "picked", tmp_path):  # a candidate, a folder inside one or holding one: never the output
        run = _pick(str(b), "--into", str(inside), "--force")
        assert run.returncode == 1 and f"{b}" in run.stderr and "choose a" in run.stderr, run.stderr
    assert (b / "model.safetensors").read_bytes() == b"weights of b" and not (b / "picked").exists()
    run = _pick(str(b), "--into", str(out), "--force")  # an earlier pick (a trained target) is replaced
    assert run.returncode == 0 and json.loads((out / "MANIFEST.json").read_text())["heldout_loss"] == 3.5, run.stderr


def test_targets_never_replace_another_commands_folder(tmp_path: Path):
    """`kimi models pick-target ... --into models/pair-vision --force` and `kimi models train-target models/pair
    --force` used to replace any folder with a MANIFEST.json; the tower and the pair are another command's."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.trained import train_target

    b = _candidate(tmp_path, "b", 3.5, 0.0, 0.6)
    tower = tmp_path / "tower"
    shutil.copytree(SHIPPED_PAIR.parent / "pair-vision", tower)
    run = _pick(str(b), "--into", str(tower), "--force")
    assert run.returncode == 1 and "another command's output" in run.stderr, run.stderr
    pair = tmp_path / "pair"
    pair.mkdir()
    shutil.copy(SHIPPED_PAIR / "MANIFEST.json", pair)
    for folder in (tower, pair):
        with pytest.raises(KimiError, match="another command's output .* choose another folder"):
            train_target(folder, force=True)
    assert sorted(p.name for p in tower.iterdir()) == ["MANIFEST.json", "vision.safetensors"]
    assert [p.name for p in pair.iterdir()] == ["MANIFEST.json"]


def test_selection_prompts_are_not_the_benchmarks_prompts():
    from kimi.models.prompts import code_prompts

    measured = code_prompts(16)  # benchmarks/acceptance.py's default --prompts
    chosen_on = code_prompts(SELECTION_PROMPTS.stop)[SELECTION_PROMPTS]
    assert len(chosen_on) == 16 and not set(measured) & set(chosen_on)


def test_one_padded_batch_gives_each_prompts_own_greedy_completion():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kimi.models.selection import greedy_completions

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).train()
    prompts = [[5, 9, 11, 3, 7, 21, 8], [17, 4], [30, 31, 32, 33]]
    batched = greedy_completions(model, prompts, 12, pad_id=0)
    alone = [greedy_completions(model, [p], 12, pad_id=0)[0] for p in prompts]
    assert batched == alone
    assert all(len(c) == 12 for c in batched)
    assert model.training  # the mode it had is restored


def test_train_targets_runs_each_candidate_with_its_own_arguments_then_picks(tmp_path: Path):
    """``benchmarks/train_targets.sh``: a size N is ``--site-mb N`` into siteN, ``NAME=ARGS`` passes ARGS into NAME;
    pick-target then gets the candidates that ended well (a stub python3 records the calls)."""
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    calls = tmp_path / "calls.txt"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *bad*) exit 1;; esac\nexit 0\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "train_targets.sh"), str(tmp_path / "r"), "10",
                          "ul=--site-mb 25 --unlikelihood-seconds 5", "bad=--site-mb 1"],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    lines = calls.read_text().splitlines()
    root = tmp_path / "r"
    assert sorted(lines[:3]) == sorted([
        f"-m kimi models train-target {root}/site10 --recipe h200 --site-mb 10 --force",
        f"-m kimi models train-target {root}/ul --recipe h200 --site-mb 25 --unlikelihood-seconds 5 --force",
        f"-m kimi models train-target {root}/bad --recipe h200 --site-mb 1 --force"])
    assert lines[3] == f"-m kimi models pick-target {root}/site10 {root}/ul --into {root}/picked --force"
    assert run.returncode == 1 and "bad failed" in run.stderr  # one candidate failed: named, and exit 1
