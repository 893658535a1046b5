"""benchmarks/gpu_e2e.py without an engine: prompts, comparisons, counters, the summary and the lanes' recovery."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from kimi.e2e.engine import spec_metrics
from kimi.e2e.server import spec_counters

spec = importlib.util.spec_from_file_location("gpu_e2e", ROOT / "benchmarks" / "gpu_e2e.py")
gpu_e2e = importlib.util.module_from_spec(spec)
sys.modules["gpu_e2e"] = gpu_e2e
spec.loader.exec_module(gpu_e2e)


def test_compare_counts_identical_sequences_and_first_divergence() -> None:
    base = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    other = [[1, 2, 3], [4, 0, 6], [0, 8, 9]]
    assert gpu_e2e.compare(other, base) == {"identical": 1, "total": 3, "token_match": round(7 / 9, 4),
                                           "first_divergence": [1, 0]}
    margins = [[2.0, 1.5, 1.0], [3.0, 0.01, 2.0], [0.02, 1.0, 1.0]]
    assert gpu_e2e.compare(other, base, margins)["divergence_margins"] == [0.01, 0.02]


def test_prometheus_counters_sum_label_sets_and_accept_total_suffix() -> None:
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 36.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 5.0',
        'vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7e9',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0',
    ])
    assert spec_counters(text) == {"num_drafts": 15.0, "num_draft_tokens": 36.0,
                                   "num_accepted_tokens": 5.0}


class _Metric:
    def __init__(self, name: str, value: float | None = None, values: list | None = None) -> None:
        self.name, self.value = name, value
        if values is not None:
            self.values = values


def test_llm_metrics_counters_and_per_position_acceptance() -> None:
    metrics = [_Metric("vllm:spec_decode_num_drafts", 4), _Metric("vllm:spec_decode_num_draft_tokens", 12),
               _Metric("vllm:spec_decode_num_accepted_tokens", 3),
               _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[2, 1, 0]),
               _Metric("vllm:num_requests_running", 1)]
    assert spec_metrics(metrics) == {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 3.0,
                                    "accepted_per_pos": [2.0, 1.0, 0.0]}


def test_code_prompts_are_deterministic_real_code_of_bounded_length(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    first = gpu_e2e.code_prompts(tmp_path / "tokenizer.json", 8, 96)
    assert first == gpu_e2e.code_prompts(tmp_path / "tokenizer.json", 8, 96)
    assert len(first) == 8 and all(24 <= len(p) <= 96 for p in first)
    assert len({tuple(p) for p in first}) == 8


def _run(tmp_path: Path, **overrides) -> gpu_e2e.Run:
    args = argparse.Namespace(budget_s=100, min_job_s=1, grace_s=1, job_timeout_s=30, tokens=3, lanes=1,
                              fresh_process=False,
                              scratch=tmp_path, cpu_smoke=False, small=False, command="test", date="now", serve_k=3)
    for key, value in overrides.items():
        setattr(args, key, value)
    run = gpu_e2e.Run(args, tmp_path / "out", dict(gpu_e2e.GPU_ENGINE), [[1, 2], [3, 4]])
    run.logs.mkdir(parents=True)
    run.spec_names, run.planned = set(), set()
    return run


def _done(tokens: list[list[int]], drafts: float = 0, eager: bool = False) -> dict:
    return {"tokens": tokens, "counters": {"num_drafts": drafts, "num_draft_tokens": 3 * drafts,
                                           "num_accepted_tokens": 0, "accepted_per_pos": []},
            "engine": {"enforce_eager": eager, "cudagraph_mode": "FULL_AND_PIECEWISE"},
            "vllm_version": "0.26.0+kimi.1.cuda",
            "device": {"name": "NVIDIA H200", "memory_gib": 139.8, "capability": "90", "cuda": "13.0"},
            "start_s": 30, "generate_s": 1.0, "tokens_per_s": 6.0}


def test_summary_has_the_issue_keys_and_judges_the_runs(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.spec_names = {"llama_k3", "mla_k3"}
    run.planned = {"base", "llama_k3", "mla_k3"}
    run.record(gpu_e2e.Outcome("base", "done", result=_done([[1, 2, 3], [4, 5, 6]])))
    run.record(gpu_e2e.Outcome("llama_k3", "done", result=_done([[1, 2, 3], [4, 5, 6]], drafts=4)))
    run.record(gpu_e2e.Outcome("mla_k3", "done", result=_done([[1, 2, 3], [4, 5, 0]], drafts=4)))
    run.serve = {"ok": True, "requests": 8, "counters": {"num_drafts": 2.0}}
    summary = gpu_e2e.write_results(run)
    assert json.loads((tmp_path / "out" / "gpu_e2e.json").read_text()) == summary
    for key in ("device", "vllm_version", "lossless", "spec_counters", "cuda_graphs", "serve", "command", "date"):
        assert key in summary
    assert summary["lossless"]["llama_k3"]["identical"] == 2 and summary["lossless"]["mla_k3"]["identical"] == 1
    assert summary["spec_counters"]["llama_k3"]["num_drafts"] == 4 and "serve" in summary["spec_counters"]
    assert summary["cuda_graphs"] is True and summary["device"].startswith("NVIDIA H200")
    assert summary["checks"]["lossless_at_least_90_percent"] is False and summary["passed"] is False
    assert "| mla_k3 | 1 / 2 |" in (tmp_path / "out" / "gpu_e2e.md").read_text()
    run.record(gpu_e2e.Outcome("mla_k3", "done", result=_done([[1, 2, 3], [4, 5, 6]], drafts=4, eager=True)))
    summary = gpu_e2e.write_results(run)
    assert summary["cuda_graphs"] is False  # one eager run is enough to say no


def test_a_lane_replaces_a_hung_worker_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that hangs in a job is killed at the job's timeout; the next job runs in a fresh worker."""
    fake = tmp_path / "fake_worker.py"
    fake.write_text(
        "import json, sys, time\n"
        "spec = json.load(open(sys.argv[2]))\n"
        "for job in spec['jobs']:\n"
        "    if job['name'] == 'no_import':\n"
        "        sys.exit(1)\n"
        "    open(sys.argv[3], 'a').write(json.dumps({'event': 'start', 'job': job['name']}) + '\\n')\n"
        "    if job['name'] == 'dies':\n"
        "        sys.exit(3)\n"
        "    if job['name'] == 'hangs':\n"
        "        time.sleep(600)\n"
        "    if job['name'] == 'fails':\n"
        "        open(sys.argv[3], 'a').write(json.dumps({'event': 'error', 'job': job['name'],\n"
        "                                                 'error': 'Traceback\\nValueError: bad'}) + '\\n')\n"
        "        continue\n"
        "    open(sys.argv[3], 'a').write(json.dumps({'event': 'done', 'job': job['name'], 'tokens': [[1]],\n"
        "        'counters': {'num_drafts': 0, 'num_draft_tokens': 0, 'num_accepted_tokens': 0}, 'engine': {},\n"
        "        'start_s': 0, 'generate_s': 1, 'tokens_per_s': 1, 'vllm_version': 'v', 'device': {}}) + '\\n')\n")
    real_popen = gpu_e2e.subprocess.Popen

    def popen(cmd, **kw):
        return real_popen([sys.executable, str(fake), *[str(c) for c in cmd[2:]]], **kw)

    monkeypatch.setattr(gpu_e2e.subprocess, "Popen", popen)
    run = _run(tmp_path)
    names = ("first", "hangs", "fails", "dies", "no_import", "last")
    jobs = [gpu_e2e.Job(name, "t", None, {}, "target", 3) for name in names]
    began = time.monotonic()
    gpu_e2e.run_lane(run, "A", jobs)
    assert time.monotonic() - began < 30
    status = {name: o.status for name, o in run.outcomes.items()}
    assert status == {"first": "done", "hangs": "timeout", "fails": "error", "dies": "error", "no_import": "error",
                      "last": "done"}
    assert "worker exited with status 3" in run.outcomes["dies"].error
    assert "worker exited with status 1" in run.outcomes["no_import"].error
    assert "ValueError: bad" in run.outcomes["fails"].error


def test_one_process_per_engine_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    real_popen = gpu_e2e.subprocess.Popen

    def popen(cmd, **kw):
        jobs = json.loads(Path(cmd[3]).read_text())["jobs"]
        starts.append([j["name"] for j in jobs])
        events = Path(cmd[4])
        for job in jobs:
            with open(events, "a") as fh:
                fh.write(json.dumps({"event": "start", "job": job["name"]}) + "\n")
                fh.write(json.dumps({"event": "done", "job": job["name"], "tokens": [[1]], "engine": {},
                                     "counters": {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0},
                                     "start_s": 0, "generate_s": 1, "tokens_per_s": 1, "vllm_version": "v",
                                     "device": {}}) + "\n")
        return real_popen([sys.executable, "-c", "pass"], **kw)

    monkeypatch.setattr(gpu_e2e.subprocess, "Popen", popen)
    run = _run(tmp_path, fresh_process=True)
    gpu_e2e.run_lane(run, "A", [gpu_e2e.Job(name, "t", None, {}, "target", 3) for name in ("a", "b", "c")])
    assert starts == [["a"], ["b"], ["c"]]
    assert {o.status for o in run.outcomes.values()} == {"done"}


def test_runs_past_the_budget_are_skipped(tmp_path: Path) -> None:
    run = _run(tmp_path, budget_s=0, min_job_s=5)
    gpu_e2e.run_lane(run, "A", [gpu_e2e.Job("late", "t", None, {}, "target", 3)])
    assert run.outcomes["late"].status == "skipped" and "time budget" in run.outcomes["late"].error


def test_an_orchestrator_error_in_a_lane_is_reported_not_raised(tmp_path: Path) -> None:
    run = _run(tmp_path)

    def broken() -> None:
        raise RuntimeError("lane bug")

    gpu_e2e.guarded(run, "lane X", broken)
    summary = gpu_e2e.write_results(run)
    assert "RuntimeError: lane bug" in summary["orchestrator_errors"][0]
    assert summary["checks"]["orchestrator_ok"] is False and summary["passed"] is False
