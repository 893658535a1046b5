"""benchmarks/cpu_paths.py's summary: ratios and the lossless check per model, never across models."""

from __future__ import annotations

import argparse

import pytest

from conftest import load_benchmark
from kimi_lab.bench.cpu_paths import summarize


def _run(step_ms: float, tokens: list[list[int]], tau: float | None = None) -> dict:
    return {"vllm": "v", "step_ms": step_ms, "seconds": step_ms / 10, "steps": 10, "tau": tau, "start_s": 1.0,
            "tokens": tokens}


def test_each_model_is_compared_with_its_own_baseline_path_and_its_own_tokens() -> None:
    runs = {
        ("pair", "compiled", "nospec"): [_run(20.0, [[1, 2]])],
        ("pair", "compiled", "eagle3"): [_run(40.0, [[1, 2]], 2.0)],
        ("pair", "torch", "nospec"): [_run(22.0, [[1, 2]])],
        ("pair", "torch", "eagle3"): [_run(50.0, [[1, 2]], 2.0)],
        ("mla", "compiled", "nospec"): [_run(10.0, [[7, 8]])],
        ("mla", "compiled", "eagle3"): [_run(30.0, [[7, 8]], 1.0)],
        ("mla", "torch", "nospec"): [_run(15.0, [[7, 8]])],
        ("mla", "torch", "eagle3"): [_run(30.0, [[7, 9]], 1.0)],
    }
    rows = {(r["model"], r["path"], r["setting"]): r for r in summarize(runs, "compiled")}
    assert rows["pair", "torch", "nospec"]["step_ratio"] == 1.1
    assert rows["pair", "torch", "eagle3"]["step_ratio"] == 1.25
    assert rows["mla", "torch", "nospec"]["step_ratio"] == 1.5  # against the mla model's compiled run, not pair's
    assert rows["mla", "torch", "eagle3"]["step_ratio"] == 1.0
    assert rows["pair", "torch", "eagle3"]["lossless"] is True
    assert rows["mla", "compiled", "eagle3"]["lossless"] is True  # [[7, 8]]: its own model's tokens
    assert rows["mla", "torch", "eagle3"]["lossless"] is False
    assert rows["mla", "torch", "eagle3"]["same_as_baseline"] is False
    assert rows["pair", "torch", "nospec"]["same_as_baseline"] is True


def _model_folder(path) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return str(path)


def test_model_folders_may_hold_a_colon(tmp_path) -> None:
    parse_model = load_benchmark("cpu_paths").parse_model
    target = _model_folder(tmp_path / "run:1" / "target")
    drafter = _model_folder(tmp_path / "run:1" / "drafter")
    assert parse_model(f"m={target}:{drafter}") == ("m", target, drafter)
    with pytest.raises(argparse.ArgumentTypeError, match=f"no config.json in {tmp_path / 'none'}$"):
        parse_model(f"m={target}:{tmp_path / 'none'}")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=TARGET:DRAFTER"):
        parse_model(f"m={tmp_path / 'plain'}")
