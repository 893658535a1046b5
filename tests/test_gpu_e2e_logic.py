"""benchmarks/gpu_e2e.py's library (kimi_lab.bench.gpu_e2e) without an engine: prompts, comparisons, counters, the
summary and the lanes' recovery."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from kimi.e2e.engine import spec_metrics
from kimi.e2e.presets import CPU_SERVE, GPU_E2E, GPU_E2E_CPU_SMOKE, MLA_FALLBACK
from kimi.e2e.server import serve_args, spec_counters
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench import workers
from kimi_lab.bench.gpu_e2e.lanes import Job, Outcome, Run, guarded, run_lane
from kimi_lab.bench.gpu_e2e.summary import compare, write_results


def test_compare_counts_identical_sequences_and_first_divergence() -> None:
    base = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    other = [[1, 2, 3], [4, 0, 6], [0, 8, 9]]
    assert compare(other, base) == {"identical": 1, "total": 3, "token_match": round(7 / 9, 4),
                                    "first_divergence": [1, 0]}
    margins = [[2.0, 1.5, 1.0], [3.0, 0.01, 2.0], [0.02, 1.0, 1.0]]
    assert compare(other, base, margins)["divergence_margins"] == [0.01, 0.02]


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


def test_engine_presets_as_vllm_serve_flags() -> None:
    """The flags `vllm serve` gets from an engine preset, in the order the scripts wrote them before there were
    presets (cpu_e2e's serve, gpu_e2e's serve with the MLA fallback)."""
    assert serve_args(CPU_SERVE) == ["--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory-bytes",
                                     str(512 << 20)]
    spec = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}
    assert serve_args({**GPU_E2E, **MLA_FALLBACK, "seed": 0, "max_num_seqs": 8, "speculative_config": spec}) == [
        "--dtype", "bfloat16", "--max-model-len", "512", "--kv-cache-memory-bytes", str(1 << 30), "--seed", "0",
        "--max-num-seqs", "8", "--speculative-config", json.dumps(spec), "--gpu-memory-utilization", "0.12",
        "--attention-config", json.dumps(MLA_FALLBACK["attention_config"])]
    assert serve_args({**GPU_E2E_CPU_SMOKE, "enforce_eager": True})[-1] == "--enforce-eager"
    with pytest.raises(ValueError, match="load_format"):
        serve_args({"load_format": "dummy"})


def test_code_prompts_are_deterministic_real_code_of_bounded_length(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from engine_script import tiny_tokenizer

    tiny_tokenizer(tmp_path / "tokenizer.json")
    first = code_prompt_ids(tmp_path / "tokenizer.json", 8, 96)
    assert first == code_prompt_ids(tmp_path / "tokenizer.json", 8, 96)
    assert len(first) == 8 and all(24 <= len(p) <= 96 for p in first)
    assert len({tuple(p) for p in first}) == 8


def _run(tmp_path: Path, **overrides) -> Run:
    args = argparse.Namespace(budget_s=100, min_job_s=1, grace_s=1, job_timeout_s=30, tokens=3, lanes=1,
                              fresh_process=False,
                              scratch=tmp_path, cpu_smoke=False, small=False, command="test", date="now", serve_k=3)
    for key, value in overrides.items():
        setattr(args, key, value)
    run = Run(args, tmp_path / "out", dict(GPU_E2E), [[1, 2], [3, 4]])
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
    run.record(Outcome("base", "done", result=_done([[1, 2, 3], [4, 5, 6]])))
    run.record(Outcome("llama_k3", "done", result=_done([[1, 2, 3], [4, 5, 6]], drafts=4)))
    run.record(Outcome("mla_k3", "done", result=_done([[1, 2, 3], [4, 5, 0]], drafts=4)))
    run.serve = {"ok": True, "requests": 8, "counters": {"num_drafts": 2.0}}
    summary = write_results(run)
    assert json.loads((tmp_path / "out" / "gpu_e2e.json").read_text()) == summary
    for key in ("device", "vllm_version", "lossless", "spec_counters", "cuda_graphs", "serve", "command", "date"):
        assert key in summary
    assert summary["lossless"]["llama_k3"]["identical"] == 2 and summary["lossless"]["mla_k3"]["identical"] == 1
    assert summary["spec_counters"]["llama_k3"]["num_drafts"] == 4 and "serve" in summary["spec_counters"]
    assert summary["cuda_graphs"] is True and summary["device"].startswith("NVIDIA H200")
    assert summary["checks"]["lossless_at_least_90_percent"] is False and summary["passed"] is False
    assert "| mla_k3 | 1 / 2 |" in (tmp_path / "out" / "gpu_e2e.md").read_text()
    run.record(Outcome("mla_k3", "done", result=_done([[1, 2, 3], [4, 5, 6]], drafts=4, eager=True)))
    summary = write_results(run)
    assert summary["cuda_graphs"] is False  # one eager run is enough to say no


def test_the_pair_is_judged_against_its_own_baseline_and_batch_invariance_wants_every_sequence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--pair`` runs (pair_base, pair_kK) compare with pair_base, not the reference target's base; under
    VLLM_BATCH_INVARIANT=1 one sequence that parts fails the call even where 90 % are identical."""
    run = _run(tmp_path, serve=False)
    run.prompts = [[i, i + 1] for i in range(10)]
    run.spec_names, run.planned = {"llama_k3", "pair_k3"}, {"base", "llama_k3", "pair_base", "pair_k3"}
    ten = [[i, 0, 0] for i in range(10)]
    run.record(Outcome("base", "done", result=_done(ten)))
    run.record(Outcome("llama_k3", "done", result=_done(ten, drafts=4)))
    run.record(Outcome("pair_base", "done", result=_done([[7, 7, 7]] * 10)))
    run.record(Outcome("pair_k3", "done", result=_done([[7, 7, 7]] * 9 + [[7, 7, 8]], drafts=4)))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    summary = write_results(run)
    assert summary["lossless"]["pair_k3"]["identical"] == 9 and summary["checks"]["lossless_at_least_90_percent"]
    assert "batch_invariant_every_sequence_identical" not in summary["checks"] and summary["passed"]
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    summary = write_results(run)
    assert summary["checks"]["batch_invariant_every_sequence_identical"] is False and not summary["passed"]
    assert summary["settings"]["batch_invariant"] is True
    assert "VLLM_BATCH_INVARIANT=1: True" in (tmp_path / "out" / "gpu_e2e.md").read_text()


def test_the_pair_runs_get_prompts_of_their_own_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from kimi.models import SHIPPED_PAIR
    from kimi_lab.bench.gpu_e2e.plan import plan

    run = _run(tmp_path, ks=[1, 3], styles=["llama"], k25=False, pair=SHIPPED_PAIR)
    run.models = {"kimi_k25": False}
    first, styles, _ = plan(run, tmp_path / "models")
    pair = styles["pair"]
    assert [j.name for j in pair] == ["pair_base", "pair_k1", "pair_k3"] and pair[0].spec is None
    assert pair[2].spec == {"method": "eagle3", "model": str(SHIPPED_PAIR / "drafter"), "num_speculative_tokens": 3}
    assert {j.target for j in pair} == {str(SHIPPED_PAIR / "target")} and first[0].prompts is None
    assert pair[0].prompts == pair[2].prompts and len(pair[0].prompts) == len(run.prompts)
    assert run.spec_names == {"llama_k1", "llama_k3", "pair_k1", "pair_k3"} and "pair_base" in run.planned


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
    real_popen = workers.subprocess.Popen

    def popen(cmd, **kw):
        return real_popen([sys.executable, str(fake), *[str(c) for c in cmd[2:]]], **kw)

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    run = _run(tmp_path)
    names = ("first", "hangs", "fails", "dies", "no_import", "last")
    jobs = [Job(name, "t", None, {}, "target", 3) for name in names]
    began = time.monotonic()
    run_lane(run, "A", jobs)
    assert time.monotonic() - began < 30
    status = {name: o.status for name, o in run.outcomes.items()}
    assert status == {"first": "done", "hangs": "timeout", "fails": "error", "dies": "error", "no_import": "error",
                      "last": "done"}
    assert "worker exited with status 3" in run.outcomes["dies"].error
    assert "worker exited with status 1" in run.outcomes["no_import"].error
    assert "ValueError: bad" in run.outcomes["fails"].error


def test_one_process_per_engine_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    real_popen = workers.subprocess.Popen

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

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    run = _run(tmp_path, fresh_process=True)
    run_lane(run, "A", [Job(name, "t", None, {}, "target", 3) for name in ("a", "b", "c")])
    assert starts == [["a"], ["b"], ["c"]]
    assert {o.status for o in run.outcomes.values()} == {"done"}


def test_runs_past_the_budget_are_skipped(tmp_path: Path) -> None:
    run = _run(tmp_path, budget_s=0, min_job_s=5)
    run_lane(run, "A", [Job("late", "t", None, {}, "target", 3)])
    assert run.outcomes["late"].status == "skipped" and "time budget" in run.outcomes["late"].error


def test_an_orchestrator_error_in_a_lane_is_reported_not_raised(tmp_path: Path) -> None:
    run = _run(tmp_path)

    def broken() -> None:
        raise RuntimeError("lane bug")

    guarded(run, "lane X", broken)
    summary = write_results(run)
    assert "RuntimeError: lane bug" in summary["orchestrator_errors"][0]
    assert summary["checks"]["orchestrator_ok"] is False and summary["passed"] is False


def test_a_cpu_smoke_call_runs_its_engines_in_workers_and_judges_them(tmp_path: Path) -> None:
    """``gpu_e2e.py --cpu-smoke`` with the stand-in vLLM (tests/engine_script.py), from a copy of the checkout
    without the laid vLLM tree: the baseline and a drafter run in worker processes and are compared, `vllm serve`
    answers every client as the baseline did, and the call passes."""
    pytest.importorskip("tokenizers")
    from engine_script import fake_vllm_site, tiny_tokenizer

    copy, models, out = tmp_path / "checkout", tmp_path / "models", tmp_path / "out"
    shutil.copytree(ROOT / "kimi", copy / "kimi", ignore=shutil.ignore_patterns("__pycache__", "lines"))
    shutil.copytree(ROOT / "lab", copy / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "benchmarks").mkdir()
    shutil.copy2(ROOT / "benchmarks" / "gpu_e2e.py", copy / "benchmarks" / "gpu_e2e.py")
    tiny_tokenizer(models / "target" / "tokenizer.json")
    (models / "MANIFEST.json").write_text(json.dumps({"aux_layer_ids": [1, 2], "files": {}}))
    site = fake_vllm_site(tmp_path / "site")
    run = subprocess.run([sys.executable, str(copy / "benchmarks" / "gpu_e2e.py"), "--cpu-smoke", "--models",
                          str(models), "--styles", "llama", "--ks", "1", "3", "--scratch",
                          str(tmp_path / "scratch"), "--out", str(out)], cwd=copy, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(site)])})
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    summary = json.loads((out / "gpu_e2e.json").read_text())
    assert {n: r["status"] for n, r in summary["runs"].items()} == {"base": "done", "llama_k1": "done",
                                                                    "llama_k3": "done"}
    assert summary["lossless"]["llama_k3"]["identical"] == summary["lossless"]["llama_k3"]["total"] == 4
    assert summary["spec_counters"]["llama_k3"]["mean_acceptance_length"] == 2.0
    assert summary["checks"] == {"every_run_finished": True, "lossless_at_least_90_percent": True,
                                 "serve_ok": True, "fork_version": True} and summary["passed"]
    serve = summary["serve"]
    assert (serve["answered"], serve["identical_to_offline"], serve["stopped"]) == (4, 4, True)
    assert "serve" in serve["command"] and "--speculative-config" in serve["command"] and "--enforce-eager" in serve[
        "command"]
    assert summary["command"].startswith("python3 benchmarks/gpu_e2e.py --cpu-smoke")
    assert (out / "logs" / "lane-base.log").is_file() and "| llama_k3 | 4 / 4 |" in (out / "gpu_e2e.md").read_text()
