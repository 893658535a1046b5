"""`kimi models make`: the reference target and drafters load where they must, and are deterministic.

Independent checks: transformers' own DeepseekV3ForCausalLM loads the target
with no missing or unexpected weights and runs a forward pass; vLLM's engine
config accepts the target with each drafter (the MLA drafter is MLA through
patch 0005); `kimi drafter inspect` finds no problems.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.install


def make(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimi", "models", "make", str(out), *extra], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "reference"
    result = make(out)
    assert result.returncode == 0, result.stderr
    return out


def test_same_seed_same_files_other_seed_other_weights(models: Path, tmp_path: Path) -> None:
    first = json.loads((models / "MANIFEST.json").read_text())
    assert make(tmp_path / "again").returncode == 0
    assert json.loads((tmp_path / "again" / "MANIFEST.json").read_text())["files"] == first["files"]
    assert make(tmp_path / "seed1", "--seed", "1").returncode == 0
    other = json.loads((tmp_path / "seed1" / "MANIFEST.json").read_text())["files"]
    assert other["target/model.safetensors"] != first["files"]["target/model.safetensors"]
    assert other["target/tokenizer.json"] == first["files"]["target/tokenizer.json"]
    refused = make(models)
    assert refused.returncode == 1 and "or pass --force to replace it" in refused.stderr


def test_target_is_deepseek_v3_as_transformers_loads_it(models: Path) -> None:
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from kimi.models.tokenizer import held_out_files

    config = json.loads((models / "target" / "config.json").read_text())
    assert config["num_hidden_layers"] >= 8 and config["kv_lora_rank"] == 512 and config["q_lora_rank"]
    assert (config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["v_head_dim"]) == (64, 128, 128)
    routing = (config["topk_method"], config["scoring_func"], config["first_k_dense_replace"])
    assert routing == ("noaux_tc", "sigmoid", 1) and config["n_shared_experts"] == 1
    model, info = DeepseekV3ForCausalLM.from_pretrained(str(models / "target"), output_loading_info=True,
                                                        torch_dtype=torch.float32)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    tokenizer = AutoTokenizer.from_pretrained(str(models / "target"))
    text = held_out_files()[0].read_text()[:2000]
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config["vocab_size"]) and torch.isfinite(logits).all()


def test_drafters_fit_the_target(models: Path) -> None:
    for name, fmt in (("drafter-llama", "eagle3-llama"), ("drafter-mla", "eagle3-mla")):
        result = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(models / name), "--target",
                                 str(models / "target"), "--json"], capture_output=True, text=True, cwd=ROOT)
        report = json.loads(result.stdout)
        assert result.returncode == 0 and report["problems"] == [], report["problems"]
        assert report["format"] == fmt and report["aux_layer_ids"] == [2, 4, 5]
        assert report["draft_vocab_size"] == 1024 and report["vocab_map"]["t2d_true"] == 1024


_ENGINE = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    cfg = EngineArgs(model=sys.argv[1], max_model_len=1024, gpu_memory_utilization=0.25,
                     speculative_config={"method": "eagle3", "model": sys.argv[2],
                                         "num_speculative_tokens": 3}).create_engine_config()
    draft = cfg.speculative_config.draft_model_config
    print(json.dumps({"target_mla": cfg.model_config.is_deepseek_mla, "draft_mla": draft.is_deepseek_mla,
                      "arch": draft.architectures, "ids": draft.hf_config.eagle_aux_hidden_state_layer_ids}))
""")


@pytest.mark.parametrize("name, arch, mla", [("drafter-llama", "Eagle3LlamaForCausalLM", False),
                                             ("drafter-mla", "Eagle3DeepseekV3ForCausalLM", True)])
def test_vllm_accepts_target_and_drafter(models: Path, name: str, arch: str, mla: bool) -> None:
    result = subprocess.run([sys.executable, "-c", _ENGINE, str(models / "target"), str(models / name)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["target_mla"] is True and got["draft_mla"] is mla and got["ids"] == [2, 4, 5]
    assert got["arch"][0] in (arch, "LlamaForCausalLMEagle3")


def test_make_never_replaces_the_working_directory_or_a_foreign_folder(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    (here / "precious.txt").write_text("keep")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run([sys.executable, "-m", "kimi", "models", "make", ".", "--force"], cwd=here, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "choose a folder outside it" in refused.stderr
    foreign = make(here, "--force")
    assert foreign.returncode == 1 and "has no MANIFEST.json" in foreign.stderr
    assert (here / "precious.txt").read_text() == "keep" and "Traceback" not in foreign.stderr
