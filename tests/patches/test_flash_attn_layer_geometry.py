"""Patch 0012: FlashAttention's metadata builder schedules with the shapes of the layers it serves.

Upstream 0.26.0 takes the query heads, KV heads and head size for FA3's ahead-of-time scheduler from the
model config, which is the target's. Beside a DeepSeek-V3 (MLA) target, the EAGLE-3 drafter's FlashAttention
layers have other shapes (here a reference drafter re-headed to 8 query and 8 KV heads of 32, the same weight
shapes as its 4 heads of 64; upstream's builder takes the MLA target's 4 query heads and 1 KV head of 576,
its latent plus RoPE width). vLLM's V1 drafter skips that scheduler, the V2 model runner does not: on the H200 it
crashed capturing the Kimi slice's drafter ("scheduler_metadata must have shape (metadata_size)") and its tau
fell once requests shared a batch (benchmarks/results/logs/perf-run2/perf_vs_upstream.md); with the patch
neither happens (benchmarks/results/logs/pair-0.26.0/perf_vs_upstream.md). One subprocess (CPU, vLLM
in-process) serves the reference target with its Llama-style drafter, then builds a FlashAttention metadata
builder for the drafter's attention layers and their KV cache spec, as the V2 runner's speculator does on a
GPU, and reads its shapes.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from engine_script import make_reference_models, run_engine_script

pytestmark = pytest.mark.install


_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from vllm import LLM
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    models = sys.argv[1]
    llm = LLM(model=models + "/target", dtype="float32", max_model_len=256, enforce_eager=True,
              kv_cache_memory_bytes=128 << 20, speculative_config={
                  "method": "eagle3", "model": models + "/drafter-8heads", "num_speculative_tokens": 2})
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    # the drafter's attention layers: the V2 runner's speculator (vLLM 0.34.0), the V1 runner's drafter (0.32.0)
    speculator = getattr(runner, "speculator", None)
    names = sorted(speculator.draft_attn_layer_names if speculator is not None
                   else runner.drafter._draft_attn_layer_names)
    specs = {}  # layer -> its spec (the CPU backend puts all layers in one group of per-layer specs)
    for group in runner.kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        specs.update(per_layer or dict.fromkeys(group.layer_names, group.kv_cache_spec))
    spec = specs[names[0]]
    assert type(spec) is FullAttentionSpec, spec
    builder = FlashAttentionMetadataBuilder(spec, names, llm.llm_engine.vllm_config, torch.device("cpu"))
    print("RESULT " + json.dumps({"layers": names, "heads_q": builder.num_heads_q,
                                  "heads_kv": builder.num_heads_kv, "head_size": builder.headdim}))
""")


def test_drafter_layers_get_their_own_shapes(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    shutil.copytree(models / "drafter-llama", models / "drafter-8heads")
    config_path = models / "drafter-8heads" / "config.json"
    config = json.loads(config_path.read_text())
    width = config["num_attention_heads"] * config["head_dim"]
    assert width == config["num_key_value_heads"] * config["head_dim"]  # 8 x 32 keeps every weight's shape
    config.update(num_attention_heads=8, num_key_value_heads=8, head_dim=width // 8)
    config_path.write_text(json.dumps(config))
    target_heads = json.loads((models / "target" / "config.json").read_text())["num_attention_heads"]
    assert target_heads != 8  # else the query-head path would pass unpatched
    out = run_engine_script(_SCRIPT, str(models))
    assert out["layers"], "no attention layers for the drafter"
    assert (out["heads_q"], out["heads_kv"], out["head_size"]) == (8, 8, width // 8)
