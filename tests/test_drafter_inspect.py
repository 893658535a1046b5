"""``kimi drafter inspect`` on synthetic drafters in each published format, at Kimi-K2 dimensions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from drafters import (
    KIMI,
    head_tensors,
    kimi_target,
    llama_config,
    llama_layer_tensors,
    mla_drafter,
    modelopt_drafter,
    specforge_drafter,
    speculators_drafter,
    toplevel_drafter,
    vocab_maps,
    write_drafter,
)

pytest.importorskip("safetensors")


def inspect_json(drafter: Path, target: Path | None, *extra: str) -> tuple[int, dict]:
    args = [sys.executable, "-m", "kimi", "drafter", "inspect", str(drafter), "--json", *extra]
    if target is not None:
        args += ["--target", str(target)]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return kimi_target(tmp_path / "kimi-k2")


def test_specforge_nested_ids_are_translated_to_vllm_convention(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(specforge_drafter(tmp_path / "d", [1, 29, 57]), target)
    assert code == 0, report["problems"]
    assert report["format"] == "eagle3-llama"
    assert report["architecture"] == "LlamaForCausalLMEagle3"
    assert report["aux_layer_ids_written"] == [1, 29, 57]
    assert report["aux_layer_ids_field"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert report["convention"] == "layer_output"
    assert report["aux_layer_ids"] == [2, 30, 58]
    assert report["problems"] == []
    assert (report["hidden_size"], report["target_hidden_size"]) == (7168, 7168)
    assert (report["draft_vocab_size"], report["target_vocab_size"]) == (32000, 163840)
    assert report["vocab_map"]["t2d_true"] == 32000 and report["vocab_map"]["max_target_id"] < 163840
    assert report["fc_hidden_states"] == 3


def test_toplevel_ids_are_vllm_convention(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(toplevel_drafter(tmp_path / "d", [2, 30, 58]), target)
    assert code == 0 and report["convention"] == "layer_input" and report["aux_layer_ids"] == [2, 30, 58]


def test_no_ids_use_vllm_defaults(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(toplevel_drafter(tmp_path / "d", None), target)
    assert code == 0 and report["convention"] == "default" and report["aux_layer_ids"] == [2, 30, 58]
    assert report["aux_layer_ids_written"] is None


def test_speculators_format(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(speculators_drafter(tmp_path / "d", [2, 30, 58]), target)
    assert code == 0, report["problems"]
    assert report["format"] == "speculators" and report["architecture"] == "Eagle3LlamaForCausalLM"
    assert report["aux_layer_ids"] == [2, 30, 58] and report["hidden_size"] == 7168


def test_modelopt_export_ids_are_layer_outputs(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(modelopt_drafter(tmp_path / "d", [1, 29, 57]), target)
    assert code == 0, report["problems"]
    assert report["format"] == "modelopt" and report["convention"] == "layer_output"
    assert report["aux_layer_ids"] == [2, 30, 58]


def test_mla_drafter(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(mla_drafter(tmp_path / "d", [2, 30, 58]), target)
    assert code == 0, report["problems"]
    assert report["format"] == "eagle3-mla" and report["architecture"] == "Eagle3DeepseekV3ForCausalLM"
    assert report["model_type"] == "kimi_k2"


def test_kimi_k25_wrapper_target_reads_its_text_config(tmp_path: Path) -> None:
    wrapper = kimi_target(tmp_path / "k25", wrapper=True)
    code, report = inspect_json(specforge_drafter(tmp_path / "d", [1, 29, 57]), wrapper / "config.json")
    assert code == 0 and report["aux_layer_ids"] == [2, 30, 58] and report["target"]["num_layers"] == 61


def test_four_layer_target_gets_distinct_default_ids(tmp_path: Path) -> None:
    shallow = kimi_target(tmp_path / "t4", layers=4)
    code, report = inspect_json(toplevel_drafter(tmp_path / "d", None), shallow)
    assert code == 0, report["problems"]
    assert report["aux_layer_ids"] == [1, 2, 3]  # upstream's (2, L//2, L-3) would be (2, 2, 1)


def test_nested_ids_not_starting_at_one_are_flagged_as_a_guess(tmp_path: Path, target: Path) -> None:
    code, report = inspect_json(specforge_drafter(tmp_path / "d", [2, 30, 58]), target)
    assert code == 1
    assert report["aux_layer_ids"] == [2, 30, 58]
    guess = [(p, f) for p, f in zip(report["problems"], report["fixes"], strict=True) if "is a guess" in p]
    assert guess and "--convention layer_input|layer_output" in guess[0][1]


@pytest.mark.parametrize("ids, needle, fix", [
    ([2, 30, 62], "outside the target's layers 0..61 (61 layers; 61 is the last layer's output)",
     "0..61 in vLLM's convention"),
    ([2, 30, 30], "repeat [30]", "write each layer the drafter was trained on once"),
    ([2, 58], "2 aux layer ids [2, 58] but the drafter's fc takes 3 hidden states",
     "write the 3 ids the drafter's fc was trained on"),
])
def test_bad_ids_are_problems(tmp_path: Path, target: Path, ids: list[int], needle: str, fix: str) -> None:
    code, report = inspect_json(toplevel_drafter(tmp_path / "d", ids), target)
    assert code == 1
    found = [f for p, f in zip(report["problems"], report["fixes"], strict=True) if needle in p]
    assert found and fix in found[0], (report["problems"], report["fixes"])


@pytest.mark.parametrize("write", [lambda path: toplevel_drafter(path, [2, 30, 61]),
                                   lambda path: specforge_drafter(path, [1, 29, 60])],
                         ids=["layer_input", "specforge_nested"])
def test_the_last_layer_output_is_accepted_in_every_convention(tmp_path: Path, target: Path, write) -> None:
    """Id L on an L-layer target (vLLM captures the last layer's output); L-1 as 'output of layer k'."""
    code, report = inspect_json(write(tmp_path / "d"), target)
    assert (code, report["problems"], report["aux_layer_ids"]) == (0, [], [2, 30, 61])


def test_drafter_for_another_hidden_size(tmp_path: Path) -> None:
    other = kimi_target(tmp_path / "t", dims={**KIMI, "hidden": 4096})
    code, report = inspect_json(toplevel_drafter(tmp_path / "d"), other)
    assert code == 1
    assert any("width 7168 but the target's hidden size is 4096" in p for p in report["problems"])


def test_vocab_maps_that_do_not_fit(tmp_path: Path, target: Path) -> None:
    d2t, t2d = vocab_maps(KIMI["draft_vocab"], KIMI["target_vocab"])
    d2t = d2t.copy()
    d2t[-1] += 10**6  # maps the last draft id past the target vocabulary
    t2d = t2d.copy()
    t2d[np.flatnonzero(~t2d)[:5]] = True  # five extra marks
    drafter = write_drafter(tmp_path / "d", llama_config(KIMI, eagle_aux_hidden_state_layer_ids=[2, 30, 58]),
                            {**llama_layer_tensors("midlayer.", KIMI), **head_tensors(KIMI, d2t=d2t, t2d=t2d)})
    code, report = inspect_json(drafter, target)
    assert code == 1
    assert any("d2t maps 1 draft ids outside the target vocabulary 0..163839" in p for p in report["problems"])
    assert any("t2d marks 32005 target ids but the draft vocabulary has 32000" in p for p in report["problems"])


def test_rope_shorter_than_the_context(tmp_path: Path, target: Path) -> None:
    cache_only = toplevel_drafter(tmp_path / "a", max_position_embeddings=131072)
    code, report = inspect_json(cache_only, target)
    assert code == 0 and report["rope"]["cache_only"] and "raises" in report["rope"]["summary"]
    yarn = toplevel_drafter(tmp_path / "b", max_position_embeddings=131072,
                            rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 32768})
    code, report = inspect_json(yarn, target)
    assert code == 1 and any("covers 131072 positions but the target serves 262144" in p for p in report["problems"])
    code, report = inspect_json(yarn, target, "--max-model-len", "65536")
    assert code == 0


def test_human_report_and_bad_paths(tmp_path: Path, target: Path) -> None:
    drafter = specforge_drafter(tmp_path / "d", [1, 29, 57])
    result = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(drafter), "--target",
                             str(target)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "layer_output" in result.stdout and "[2, 30, 58]" in result.stdout
    missing = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(tmp_path / "nope")],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 1 and "is not a checkpoint folder" in missing.stderr


@pytest.mark.parametrize("ids", [["2", "30", "58"], [2.0, 30.0, 58.0], [True, False, True], [], "2,30,58"])
def test_malformed_ids_are_problems_not_defaults(tmp_path: Path, target: Path, ids: object) -> None:
    drafter = toplevel_drafter(tmp_path / "d")
    config = json.loads((drafter / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = ids
    (drafter / "config.json").write_text(json.dumps(config))
    code, report = inspect_json(drafter, target)
    assert code == 1 and report["aux_layer_ids"] is None
    assert any("must be a non-empty list of integer layer ids" in p for p in report["problems"])


@pytest.mark.parametrize("field, value, needle", [
    ("num_hidden_layers", None, "num_hidden_layers must be a positive integer"),
    ("num_hidden_layers", "sixty", "num_hidden_layers must be a positive integer, not 'sixty'"),
    ("vocab_size", 0, "vocab_size must be a positive integer"),
])
def test_bad_target_configs_are_one_line_errors(tmp_path: Path, field: str, value: object, needle: str) -> None:
    target = kimi_target(tmp_path / "t")
    config = json.loads((target / "config.json").read_text())
    config[field] = value
    (target / "config.json").write_text(json.dumps(config))
    result = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(toplevel_drafter(tmp_path / "d")),
                             "--target", str(target)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1 and "Traceback" not in result.stderr and needle in result.stderr


def test_two_layer_target_without_ids(tmp_path: Path) -> None:
    code, report = inspect_json(toplevel_drafter(tmp_path / "d", None), kimi_target(tmp_path / "t", layers=2))
    assert code == 1 and any("needs 3 distinct target layers; the target has 2" in p for p in report["problems"])


@pytest.mark.parametrize("config_change, needle", [
    ({"target_hidden_size": "7168"}, "target_hidden_size must be a positive integer"),
    ({"max_position_embeddings": "2048"}, "max_position_embeddings must be a positive integer"),
    ({"architectures": [1]}, "architectures must be a list of class names"),
])
def test_wrongly_typed_drafter_fields(tmp_path: Path, target: Path, config_change: dict, needle: str) -> None:
    drafter = toplevel_drafter(tmp_path / "d")
    config = {**json.loads((drafter / "config.json").read_text()), **config_change}
    (drafter / "config.json").write_text(json.dumps(config))
    code, report = inspect_json(drafter, target)
    assert code == 1 and any(needle in p for p in report["problems"]), report["problems"]


def test_malformed_tensors_are_problems(tmp_path: Path, target: Path) -> None:
    d2t, t2d = vocab_maps(KIMI["draft_vocab"], KIMI["target_vocab"])
    tensors = {**llama_layer_tensors("midlayer.", KIMI), **head_tensors(KIMI, d2t=d2t.reshape(2, -1), t2d=t2d),
               "embed_tokens.weight": ("BF16", (163840, 4096), None)}
    drafter = write_drafter(tmp_path / "d", llama_config(KIMI, eagle_aux_hidden_state_layer_ids=[2, 30, 58]), tensors)
    code, report = inspect_json(drafter, target)
    assert code == 1
    assert any("d2t must be a non-empty 1-D int64 tensor" in p for p in report["problems"])
    assert any("embed_tokens.weight is [163840, 4096], expected [163840, 7168]" in p for p in report["problems"])


def test_sharded_checkpoint_reads_the_index(tmp_path: Path, target: Path) -> None:
    from drafters import write_sparse_safetensors

    drafter = toplevel_drafter(tmp_path / "d")
    tensors = {**llama_layer_tensors("midlayer.", KIMI), **head_tensors(KIMI)}
    names = sorted(tensors)
    (drafter / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, members in shards.items():
        write_sparse_safetensors(drafter / shard, {n: tensors[n] for n in members})
    index = {"weight_map": {n: shard for shard, members in shards.items() for n in members}}
    (drafter / "model.safetensors.index.json").write_text(json.dumps(index))
    write_sparse_safetensors(drafter / "stale.safetensors", {"fc.weight": ("BF16", (7168, 7), None)})
    code, report = inspect_json(drafter, target)
    assert code == 0 and report["fc_hidden_states"] == 3, report["problems"]  # the unlisted file is ignored
    (drafter / "model-00002-of-00002.safetensors").unlink()
    result = subprocess.run([sys.executable, "-m", "kimi", "drafter", "inspect", str(drafter)], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 1 and "lists model-00002-of-00002.safetensors, missing" in result.stderr


@pytest.mark.parametrize("factor, problem", [(64.0, None), (32.0, "covers 131072 positions but the target serves")])
def test_yarn_rope_covers_original_positions_times_factor(tmp_path: Path, target: Path, factor: float,
                                                          problem: str | None) -> None:
    """vLLM sizes a YaRN cache from original_max_position_embeddings x factor, not max_position_embeddings."""
    yarn = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096}
    drafter = toplevel_drafter(tmp_path / "d", max_position_embeddings=131072, rope_scaling=yarn)
    code, report = inspect_json(drafter, target)
    if problem is None:
        assert code == 0 and report["problems"] == [], report["problems"]
    else:
        assert code == 1 and any(problem in p for p in report["problems"]), report["problems"]
