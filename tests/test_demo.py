"""``kimi demo`` (the README's main command) and the pieces it is made of: prompts, server control, /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.e2e.prompts import code_prompts
from kimi.e2e.server import VllmServer, spec_counters
from kimi.errors import KimiError

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


@pytest.mark.install
def test_demo_serves_the_reference_models_with_eagle3(tmp_path: Path) -> None:
    env = {**os.environ, "KIMI_CACHE_DIR": os.environ.get("KIMI_CACHE_DIR", str(ROOT / ".kimi" / "cache"))}
    result = subprocess.run([sys.executable, "-m", "kimi", "demo", "--max-tokens", "16"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "--- completion (" in result.stdout and "server stopped" in result.stderr
    drafts = result.stdout.split("spec decode: ")[1].split(" drafts")[0]
    assert int(drafts) > 0
