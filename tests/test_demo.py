"""``kimi demo`` (the README's main command) and the pieces it is made of: prompts, server control, /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.demo import acceptance, demo_models
from kimi.e2e.server import VllmServer, accepted_per_position, spec_counters
from kimi.errors import KimiError
from kimi.fork.layout import Layout
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompts

ROOT = Path(__file__).resolve().parents[1]

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 36.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 5.0
vllm:prompt_tokens_total{engine="0",model_name="t"} 99.0
"""


def test_spec_counters_are_read_from_prometheus_text() -> None:
    assert spec_counters(METRICS) == {"num_drafts": 12.0, "num_draft_tokens": 36.0, "num_accepted_tokens": 7.0}
    assert spec_counters("") == {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}


def test_code_prompts_are_whole_lines_ending_in_a_definition() -> None:
    prompts = code_prompts(16)
    assert len(set(prompts)) == 16 and prompts == code_prompts(16)
    for prompt in prompts:
        last = prompt.rstrip("\n").splitlines()[-1].lstrip()
        assert last.startswith(("def ", "class ")) and last.endswith(":") and len(prompt) <= 240
    with pytest.raises(KimiError, match="wanted"):
        code_prompts(100_000)


def test_a_server_that_exits_at_start_raises_with_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho 'ValueError: EAGLE-3 drafter d does not fit. Fix: write the ids'\nexit 3\n")
    fake.chmod(0o755)
    server = VllmServer(fake, "model", [], tmp_path / "serve.log")
    with pytest.raises(KimiError, match=r"exited with status 3(.|\n)*Fix: write the ids"):
        server.start(timeout=30)


def test_per_position_acceptance_is_read_from_prometheus_text() -> None:
    assert accepted_per_position(METRICS) == [5.0]
    two = METRICS + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 1.0\n'
    assert accepted_per_position(two) == [5.0, 0.0, 1.0]
    assert accepted_per_position("") == []
    found = acceptance(two, k=3)
    assert found["tau"] == 1 + 7 / 12 and found["per_position"] == [5 / 12, 0.0, 1 / 12]
    assert acceptance("", k=3)["per_position"] == [] and acceptance(METRICS, k=1)["per_position"] == [5 / 12]


def test_demo_serves_the_trained_pair_unless_asked_for_the_reference_models(tmp_path: Path) -> None:
    layout = Layout(root=tmp_path, cache=tmp_path / "cache")
    trained = demo_models(layout, "trained", None)
    assert trained.folder == SHIPPED_PAIR and trained.drafter == SHIPPED_PAIR / "drafter"
    assert trained.make is None  # shipped: checked, never made
    reference = demo_models(layout, "reference", None)
    assert reference.drafter == tmp_path / ".kimi" / "models" / "reference" / "drafter-mla"
    assert demo_models(layout, "reference", "llama").drafter.name == "drafter-llama"
    with pytest.raises(KimiError, match="--models reference"):
        demo_models(layout, "trained", "mla")
    with pytest.raises(KimiError, match="--models must be one of"):
        demo_models(layout, "random", None)


@pytest.mark.install
def test_demo_serves_the_trained_pair_with_real_acceptance(trained_pair: Path) -> None:
    """`kimi demo` as the README runs it, on the shipped pair (checked, not trained)."""
    env = {**os.environ, "KIMI_CACHE_DIR": os.environ.get("KIMI_CACHE_DIR", str(ROOT / ".kimi" / "cache"))}
    result = subprocess.run([sys.executable, "-m", "kimi", "demo", "--max-tokens", "32", "--prompts", "2"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "files match its MANIFEST.json" in result.stderr and "train-pair" not in result.stderr
    assert result.stdout.count("--- completion (32 tokens") == 2 and "server stopped" in result.stderr
    stats = result.stdout.split("spec decode: ")[1]
    tau = float(stats.split("tau = ")[1].split()[0])
    per_pos = [float(p) for p in stats.split("acceptance per draft position: ")[1].split(", ")]
    # the shipped pair on CPU, 16 prompts: tau 2.23, position 0 0.64 (benchmarks/results/cpu/acceptance.md)
    assert tau > 1.2 and len(per_pos) == 3 and per_pos[0] > 0.2, stats
