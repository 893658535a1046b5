"""Issue 44 with a real ``vllm serve`` on CPU (the shipped pair's DeepSeek-V3 target, 6 layers): a ``.bin`` drafter
whose ``fc`` has the wrong shape stops start-up before the target's weights load, naming the cause and the fix
(upstream: a bare AssertionError after the load); a drafter whose last aux id is the target's last layer output
(id 6, saved as ``pytorch_model.bin``) is served and drafts (upstream's check said "outside 0..5").
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kimi.e2e.presets import CPU_SERVE
from kimi.e2e.server import VllmServer, serve_args, vllm_command
from kimi.errors import KimiError

pytestmark = pytest.mark.install


def bin_drafter(source: Path, dest: Path, ids: list[int] | None = None, narrow_fc: bool = False) -> Path:
    """The drafter at ``source`` saved as ``dest/pytorch_model.bin`` (``torch.save``), its ids replaced by ``ids``,
    its ``fc`` cut by one input column with ``narrow_fc``."""
    import torch
    from safetensors.torch import load_file

    dest.mkdir()
    weights = load_file(str(source / "model.safetensors"))
    if narrow_fc:
        weights["fc.weight"] = weights["fc.weight"][:, :-1].contiguous()
    torch.save(weights, dest / "pytorch_model.bin")
    config = json.loads((source / "config.json").read_text())
    if ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = ids
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def server(target: Path, drafter: Path, log: Path) -> VllmServer:
    spec = json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3})
    return VllmServer(vllm_command(), str(target), [*serve_args(CPU_SERVE), "--speculative-config", spec], log)


def test_a_bin_drafter_with_a_wrong_fc_shape_stops_vllm_serve_before_the_target_loads(trained_pair: Path,
                                                                                      tmp_path: Path) -> None:
    drafter = bin_drafter(trained_pair / "drafter", tmp_path / "drafter", narrow_fc=True)
    begin = time.monotonic()
    with server(trained_pair / "target", drafter, tmp_path / "serve.log") as refused, pytest.raises(KimiError):
        refused.start(timeout=300)
    seconds = time.monotonic() - begin
    log = (tmp_path / "serve.log").read_text()
    assert "fc.weight [192, 575] does not take a whole number of 192-wide states" in log, log[-3000:]
    assert "Fix: use the drafter made for this target" in log
    assert "Starting to load model" not in log and "Loading weights took" not in log  # the target never loaded
    assert seconds < 120, seconds


def test_vllm_serve_serves_a_drafter_reading_the_last_layer_output(trained_pair: Path, tmp_path: Path) -> None:
    layers = json.loads((trained_pair / "target" / "config.json").read_text())["num_hidden_layers"]
    drafter = bin_drafter(trained_pair / "drafter", tmp_path / "drafter", ids=[2, 4, layers])
    with server(trained_pair / "target", drafter, tmp_path / "serve.log") as served:
        served.start(timeout=600)
        reply = served.complete("def fibonacci(n):\n", 24, ignore_eos=True)
        counters = served.counters()
    assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 24
    assert counters["num_drafts"] > 0
    assert f"aux layer ids [2, 4, {layers}]" in (tmp_path / "serve.log").read_text()
