"""`kimi models make`: the reference target, its Kimi-K2.5 wrapper and drafters load where they must.

Independent checks: transformers' own DeepseekV3ForCausalLM loads the target
with no missing or unexpected weights and runs a forward pass; vLLM's engine
config accepts the target with each drafter (the MLA drafter is MLA through
patch 0005); `kimi drafter inspect` finds no problems.  The Kimi-K2.5 wrapper
holds the target's text tensors byte for byte; vLLM resolves it to
KimiK25ForConditionalGeneration with its image placeholder; on CPU it generates
the plain target's greedy tokens with the EAGLE-3 drafter, and image prompts run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, installed_line
from kimi.models import OUTPUT_KEYS

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
    assert other["kimi-k25/model.safetensors"] != first["files"]["kimi-k25/model.safetensors"]
    assert first["kimi_k25"]["media_placeholder_token_id"] == 2
    assert set(OUTPUT_KEYS["make"]) <= set(first)  # what `make --force` takes for its own earlier output
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


@pytest.mark.parametrize("target", ["target", "kimi-k25"])
def test_drafters_fit_the_target(models: Path, target: str) -> None:
    for name, fmt in (("drafter-llama", "eagle3-llama"), ("drafter-mla", "eagle3-mla")):
        result = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(models / name), "--target",
                                 str(models / target), "--json"], capture_output=True, text=True, cwd=ROOT)
        report = json.loads(result.stdout)
        assert result.returncode == 0 and report["problems"] == [], report["problems"]
        assert report["format"] == fmt and report["aux_layer_ids"] == [2, 4, 5]
        assert report["draft_vocab_size"] == 1024 and report["vocab_map"]["t2d_true"] == 1024


_ENGINE = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    cfg = EngineArgs(model=sys.argv[1], max_model_len=1024, gpu_memory_utilization=0.25, dtype="float32",
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
    tower = tmp_path / "tower"  # `kimi models make models/pair-vision --force` used to replace the trained tower
    shutil.copytree(ROOT / "models" / "pair-vision", tower)
    other = make(tower, "--force")
    assert other.returncode == 1 and "another command's output" in other.stderr, other.stderr
    assert sorted(p.name for p in tower.iterdir()) == ["MANIFEST.json", "vision.safetensors"]


def test_make_outside_the_forks_environment_names_the_fix(tmp_path: Path) -> None:
    """An interpreter without the environment's packages (``-S``: no site-packages, as the system python3 of a fresh
    machine) gets one line naming ``python3 -m kimi setup``, exit 2, not a ModuleNotFoundError traceback."""
    run = subprocess.run([sys.executable, "-S", "-m", "kimi", "models", "make", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "`python3 -m kimi setup` makes it" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


def test_kimi_k25_wraps_the_target_text_model(models: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from kimi.models.tokenizer import held_out_files

    with safe_open(str(models / "target" / "model.safetensors"), "pt") as plain, \
            safe_open(str(models / "kimi-k25" / "model.safetensors"), "pt") as wrapped:
        names, text = set(wrapped.keys()), list(plain.keys())
        assert {n for n in names if n.startswith("language_model.")} == {f"language_model.{n}" for n in text}
        assert all(plain.get_tensor(n).equal(wrapped.get_tensor(f"language_model.{n}")) for n in text)
    assert {"vision_tower.patch_embed.pos_emb.weight", "vision_tower.encoder.blocks.1.wqkv.bias",
            "mm_projector.proj.0.weight", "mm_projector.proj.2.weight", "mm_projector.pre_norm.bias"} <= names
    config = json.loads((models / "kimi-k25" / "config.json").read_text())
    assert (config["model_type"], config["text_config"]["model_type"]) == ("kimi_k25", "kimi_k2")
    target, wrapper = (AutoTokenizer.from_pretrained(str(models / d)) for d in ("target", "kimi-k25"))
    text = held_out_files()[1].read_text()[:2000]
    assert target(text).input_ids == wrapper(text).input_ids
    assert wrapper("a<|media_pad|>b").input_ids[1] == config["media_placeholder_token_id"]


_K25_CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    from vllm.multimodal import MULTIMODAL_REGISTRY
    cfg = EngineArgs(model=sys.argv[1], max_model_len=1024, gpu_memory_utilization=0.25, dtype="float32",
                     speculative_config={"method": "eagle3", "model": sys.argv[2],
                                         "num_speculative_tokens": 3}).create_engine_config()
    model, draft = cfg.model_config, cfg.speculative_config.draft_model_config
    info = MULTIMODAL_REGISTRY.create_processor(model).info
    print(json.dumps({"arch": model.architecture, "multimodal": model.is_multimodal_model,
                      "mla": model.is_deepseek_mla, "text_type": model.hf_text_config.model_type,
                      "hidden": model.get_hidden_size(), "layers": model.hf_text_config.num_hidden_layers,
                      "vision_hidden": model.hf_config.vision_config.hidden_size,
                      "config_media_id": model.hf_config.media_placeholder_token_id,
                      "media_id": info.media_token_id, "media_token": info.media_token,
                      "draft_ids": draft.hf_config.eagle_aux_hidden_state_layer_ids}))
""")


def test_vllm_reads_the_kimi_k25_config(models: Path) -> None:
    args = [str(models / "kimi-k25"), str(models / "drafter-llama")]
    result = subprocess.run([sys.executable, "-c", _K25_CONFIG, *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["arch"] == "KimiK25ForConditionalGeneration" and got["multimodal"] and got["mla"]
    # transformers 5.22 (vLLM 0.34.0) has its own KimiK25Config, which reads a kimi_k2 text config as deepseek_v3
    text_type = "kimi_k2" if installed_line() in ("v0.26", "v0.32") else "deepseek_v3"
    assert (got["text_type"], got["hidden"], got["layers"], got["vision_hidden"]) == (text_type, 256, 8, 64)
    assert got["config_media_id"] == got["media_id"] == 2 and got["media_token"] == "<|media_pad|>"
    assert got["draft_ids"] == [2, 4, 5]


_GENERATE = textwrap.dedent("""
    import json, sys
    from PIL import Image
    from vllm import LLM, SamplingParams
    model, drafter, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3} if drafter else None
    llm = LLM(model=model, dtype="float32", max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
              speculative_config=spec, disable_log_stats=False)
    params = SamplingParams(temperature=0, max_tokens=16)
    out = {"text": [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]}
    if drafter:
        images = [{"prompt": sys.argv[4], "multi_modal_data": {"vision_chunk": [
            {"type": "image", "image": Image.new("RGB", (224, 224), color)}]}} for color in ("red", "blue")]
        done = llm.generate(images, params)
        out["image"] = [list(o.outputs[0].token_ids) for o in done]
        out["image_prompt_len"] = [len(o.prompt_token_ids) for o in done]
        out["drafts"] = sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_drafts")
    print("RESULT " + json.dumps(out))
""")

_IMAGE_PROMPT = "image: <|media_pad|> says"
_PROMPTS = ["def f(x):", "import os\n\nclass Path", "for i in range(10):\n    ", "# sum\ndef total(items):"]


def _generate(model: Path, drafter: Path | None) -> dict:
    """Greedy tokens of ``_PROMPTS`` from vLLM on CPU, one engine per call (a process of its own)."""
    result = subprocess.run([sys.executable, "-c", _GENERATE, str(model), str(drafter or ""), json.dumps(_PROMPTS),
                             _IMAGE_PROMPT],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])


def test_kimi_k25_with_eagle3_generates_the_target_tokens_on_cpu(models: Path) -> None:
    plain = _generate(models / "target", None)
    wrapped = _generate(models / "kimi-k25", models / "drafter-llama")
    assert wrapped["text"] == plain["text"] and all(len(t) == 16 for t in plain["text"])
    assert wrapped["drafts"] > 0
    from transformers import AutoTokenizer

    text_tokens = len(AutoTokenizer.from_pretrained(str(models / "kimi-k25"))(_IMAGE_PROMPT).input_ids)
    per_image = (224 // 14 // 2) ** 2  # 16 x 16 patches of 14 pixels, merged 2 x 2
    assert wrapped["image_prompt_len"] == [text_tokens - 1 + per_image] * 2  # the placeholder, repeated
    assert all(len(t) == 16 for t in wrapped["image"]) and wrapped["image"][0] != wrapped["image"][1]
