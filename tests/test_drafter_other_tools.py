"""Drafters made by other tools (issue 17 part 4): speculators' converter and SpecForge's export layout written from
the shipped pair's drafter, what ``kimi drafter inspect`` / ``convert`` make of them, and (``install``) serving them."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from drafters import speculators_drafter, toplevel_drafter
from kimi.errors import KimiError

pytestmark = pytest.mark.long_file

pytest.importorskip("safetensors")
pytest.importorskip("torch")
from kimi.drafter.convert import convert  # noqa: E402 (needs safetensors)
from kimi.drafter.inspect import inspect  # noqa: E402

SMALL = {"hidden": 64, "target_vocab": 1000, "draft_vocab": 100, "layers": 61, "heads": 4, "kv_heads": 2,
         "head_dim": 16, "intermediate": 128, "max_positions": 4096}
#: The shipped drafter's ids (vLLM's convention) and the same layers as "output of layer k".
PAIR_IDS, PAIR_OUTPUT_IDS = [2, 4, 5], [1, 3, 4]


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def same_tensors(a: dict, b: dict) -> bool:
    """Same names, dtypes and values."""
    import torch

    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.fixture
def specforge(trained_pair: Path, tmp_path: Path) -> Path:
    from kimi_lab.drafter.other_tools import specforge_checkpoint

    assert config_of(trained_pair / "drafter")["eagle_aux_hidden_state_layer_ids"] == PAIR_IDS
    return specforge_checkpoint(trained_pair / "drafter", tmp_path / "specforge")


def test_specforge_layout_nests_output_of_layer_ids_and_keeps_the_weights(specforge: Path,
                                                                          trained_pair: Path) -> None:
    cfg = config_of(specforge)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": PAIR_OUTPUT_IDS, "use_aux_hidden_state": True}
    assert not {"eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids_convention",
                "num_aux_hidden_states"} & cfg.keys()
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 10000.0  # legacy field mirrored
    assert cfg["draft_vocab_size"] == 1536 and cfg["dtype"] == "bfloat16" and "transformers_version" in cfg
    theirs, ours = tensors(specforge), tensors(trained_pair / "drafter")
    assert same_tensors(theirs, ours) and "midlayer.self_attn.q_proj.weight" in theirs
    assert str(theirs["d2t"].dtype) == "torch.int64" and str(theirs["t2d"].dtype) == "torch.bool"
    assert (specforge / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_inspect_and_convert_read_specforge_ids_as_output_of_layer_k(specforge: Path, trained_pair: Path,
                                                                     tmp_path: Path) -> None:
    report = inspect(specforge, trained_pair / "target")
    assert report.aux.written == tuple(PAIR_OUTPUT_IDS) and report.aux.convention == "layer_output"
    assert report.aux_layer_ids == PAIR_IDS and report.problems == []
    convert(specforge, tmp_path / "converted", trained_pair / "target")
    cfg = config_of(tmp_path / "converted")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == PAIR_IDS and "eagle_aux_hidden_state_layer_ids" not in \
        cfg["eagle_config"]
    assert same_tensors(tensors(tmp_path / "converted"), tensors(trained_pair / "drafter"))


def test_inspect_names_a_specforge_export_llama_style(specforge: Path) -> None:
    assert inspect(specforge).format == "eagle3-llama"


def test_specforge_writer_refuses_id_0_and_other_layouts(tmp_path: Path) -> None:
    from kimi_lab.drafter.other_tools import specforge_checkpoint

    with pytest.raises(KimiError, match="use id 0"):
        specforge_checkpoint(toplevel_drafter(tmp_path / "zero", [0, 30, 58], dims=SMALL), tmp_path / "out")
    with pytest.raises(KimiError, match="is a speculators drafter"):
        specforge_checkpoint(speculators_drafter(tmp_path / "spec", dims=SMALL), tmp_path / "out")
    with pytest.raises(KimiError, match="names no aux layer ids"):
        specforge_checkpoint(toplevel_drafter(tmp_path / "none", None, dims=SMALL), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_force_never_replaces_a_folder_another_command_wrote(tmp_path: Path) -> None:
    """A target folder (its config.json has no ``eagle_config`` / ``speculators_config``) is not an earlier
    SpecForge or speculators checkpoint: `--force` used to replace any folder holding a config.json."""
    from kimi.models import SHIPPED_PAIR
    from kimi_lab.drafter.other_tools import specforge_checkpoint, speculators_checkpoint

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text((SHIPPED_PAIR / "target" / "config.json").read_text())
    with pytest.raises(KimiError, match="another command's output"):
        specforge_checkpoint(SHIPPED_PAIR / "drafter", target, force=True)
    if importlib.util.find_spec("speculators") is not None:
        with pytest.raises(KimiError, match="another command's output"):
            speculators_checkpoint(SHIPPED_PAIR / "drafter", SHIPPED_PAIR / "target", target, force=True)
    assert [p.name for p in target.iterdir()] == ["config.json"]


def test_converting_a_speculators_checkpoint_leaves_out_its_config_class(tmp_path: Path) -> None:
    src = speculators_drafter(tmp_path / "src", dims=SMALL)
    cfg = config_of(src)
    cfg["auto_map"] = {"": "config.Eagle3SpeculatorConfig"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "config.py").write_text("from speculators import SpeculatorModelConfig\n")
    (src / "README.md").write_text("model card\n")
    convert(src, tmp_path / "dst")
    assert "auto_map" not in config_of(tmp_path / "dst")
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_speculators_missing_is_named_with_the_install(monkeypatch: pytest.MonkeyPatch, trained_pair: Path,
                                                      tmp_path: Path) -> None:
    from kimi_lab.drafter.other_tools import speculators_checkpoint

    monkeypatch.setitem(sys.modules, "speculators.convert.entrypoints", None)
    with pytest.raises(KimiError, match="pip install --no-deps speculators"):
        speculators_checkpoint(trained_pair / "drafter", trained_pair / "target", tmp_path / "out")


def test_speculators_converter_output_is_inspected_and_converted_back(trained_pair: Path, tmp_path: Path) -> None:
    pytest.importorskip("speculators.convert.entrypoints")
    from kimi_lab.drafter.other_tools import speculators_checkpoint

    theirs = speculators_checkpoint(trained_pair / "drafter", trained_pair / "target", tmp_path / "speculators")
    cfg = config_of(theirs)
    assert cfg["speculators_model_type"] == "eagle3" and cfg["transformer_layer_config"]["model_type"] == "llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == PAIR_IDS and cfg["norm_before_residual"] is False
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["DeepseekV3ForCausalLM"]
    ours = tensors(trained_pair / "drafter")
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in ours.items()}
    assert same_tensors(tensors(theirs), renamed)
    report = inspect(theirs, trained_pair / "target")
    assert report.format == "speculators" and report.aux_layer_ids == PAIR_IDS and report.problems == []
    convert(theirs, tmp_path / "converted", trained_pair / "target")
    back = config_of(tmp_path / "converted")
    assert back["architectures"] == ["LlamaForCausalLMEagle3"] and "auto_map" not in back
    assert back["eagle_aux_hidden_state_layer_ids"] == PAIR_IDS and back["norm_before_residual"] is False
    assert not (tmp_path / "converted" / "config.py").exists()
    assert same_tensors(tensors(tmp_path / "converted"), ours)


@pytest.mark.install
def test_other_tools_checkpoints_serve_with_our_drafters_tokens_and_counters(trained_pair: Path,
                                                                            tmp_path: Path) -> None:
    """Each checkpoint served directly and converted: our drafter's greedy tokens and spec-decode counters."""
    pytest.importorskip("speculators.convert.entrypoints")
    from kimi_lab.bench.other_tools import TOOLS, check_other_tools

    result = check_other_tools(trained_pair, tmp_path, prompts=2, tokens=16)
    assert result["ours"]["counters"]["num_accepted_tokens"] > 0, result
    for tool in TOOLS:
        found = result["tools"][tool]
        assert "error" not in found and found["aux_layer_ids"] == PAIR_IDS and found["converted"], found
        for served in found["served"].values():
            assert served["identical"] == served["total"] == 2 and served["counters_equal"], found
    assert result["tools"]["speculators"]["inspect_ok"] and result["lossless"], result
