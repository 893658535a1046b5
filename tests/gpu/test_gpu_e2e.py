"""The fork on an NVIDIA GPU: EAGLE-3 with CUDA graphs is lossless, counts its drafts, and `vllm serve` answers.

The same checks as ``benchmarks/gpu_e2e.py`` (issue C). With ``KIMI_GPU_E2E_RESULTS`` naming a
``gpu_e2e.json`` (``benchmarks/gpu_call.sh`` sets it after the full run) the tests read it; otherwise they
run the short form, ``gpu_e2e.py --small`` (baseline, Llama- and MLA-style drafters at k = 3, 8 prompts x
16 tokens, `vllm serve`; a few minutes). Skipped where CUDA is not available (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.gpu

LOSSLESS_MIN = 0.9


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    given = os.environ.get("KIMI_GPU_E2E_RESULTS")
    if given:
        return json.loads(Path(given).read_text())
    out = tmp_path_factory.mktemp("gpu_e2e")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_e2e.py"), "--small", "--out", str(out),
                           "--budget-s", "600"], capture_output=True, text=True, timeout=1200)
    assert (out / "gpu_e2e.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_e2e.json").read_text())


def test_the_installed_vllm_is_the_fork() -> None:
    import inspect

    import vllm
    from vllm.config import speculative

    assert "+kimi." in vllm.__version__
    assert "prepare_eagle3_drafter" in inspect.getsource(speculative)  # patch 0004 is in the installed tree


def test_every_planned_run_finished(results: dict) -> None:
    failed = {name: run.get("error", "")[-500:] for name, run in results["runs"].items() if run["status"] != "done"}
    assert not failed, failed


def test_eagle3_is_lossless_with_both_drafter_styles(results: dict) -> None:
    lossless = results["lossless"]
    assert {name.split("_k")[0] for name in lossless} >= {"llama", "mla"}, lossless
    short = {name: v for name, v in lossless.items() if v["identical"] < LOSSLESS_MIN * v["total"]}
    assert not short, short


def test_spec_decode_counters_count_the_drafts(results: dict) -> None:
    for name, counters in results["spec_counters"].items():
        if name == "serve":
            continue
        k = int(re.search(r"_k(\d+)$", name).group(1))
        assert counters["num_drafts"] > 0, (name, counters)
        assert counters["num_drafts"] <= counters["num_draft_tokens"] <= k * counters["num_drafts"], (name, counters)
        assert 0 <= counters["num_accepted_tokens"] <= counters["num_draft_tokens"], (name, counters)


def test_cuda_graphs_were_on(results: dict) -> None:
    assert results["cuda_graphs"] is True
    for name, run in results["runs"].items():
        if run["status"] == "done":
            assert run["engine"]["enforce_eager"] is False and "NONE" not in run["engine"]["cudagraph_mode"], name


def test_vllm_serve_answers_concurrent_requests_with_eagle3(results: dict) -> None:
    serve = results["serve"]
    assert serve.get("ok"), {k: v for k, v in serve.items() if k != "replies"}
    assert serve["answered"] == serve["requests"] >= 8
    assert serve["counters"]["num_drafts"] > 0


def test_results_name_the_fork_and_the_device(results: dict) -> None:
    assert "+kimi." in results["vllm_version"]
    assert results["device"] and results["command"] and results["date"]
