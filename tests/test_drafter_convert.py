"""``kimi drafter convert``: explicit vLLM-convention ids, speculators -> midlayer, atomic output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from drafters import kimi_target, modelopt_drafter, specforge_drafter, speculators_drafter, toplevel_drafter

pytest.importorskip("safetensors")
SMALL = {"hidden": 64, "target_vocab": 1000, "draft_vocab": 100, "layers": 61, "heads": 4, "kv_heads": 2,
         "head_dim": 16, "intermediate": 128, "max_positions": 4096}


def kimi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimi", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_specforge_nested_ids_become_explicit_vllm_ids(tmp_path: Path) -> None:
    target = kimi_target(tmp_path / "t", dims=SMALL)
    src = specforge_drafter(tmp_path / "src", [1, 29, 57], dims=SMALL)
    result = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(target))
    assert result.returncode == 0, result.stderr
    cfg = config_of(tmp_path / "dst")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert cfg["eagle_aux_hidden_state_layer_ids_convention"] == "layer_input"
    assert cfg["num_aux_hidden_states"] == 3
    assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    assert cfg["kimi_converted_from"]["ids_written"] == [1, 29, 57]
    assert (tmp_path / "dst" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "dst").stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
    assert (tmp_path / "dst" / "config.json").stat().st_mode & 0o777 == 0o666 & ~umask
    again = kimi("drafter", "inspect", str(tmp_path / "dst"), "--target", str(target), "--json")
    report = json.loads(again.stdout)
    assert report["aux_layer_ids"] == [2, 30, 58] and report["convention"] == "layer_input"
    assert "convention says layer_input" in report["convention_evidence"]


def test_speculators_checkpoint_becomes_midlayer_layout(tmp_path: Path) -> None:
    from safetensors import safe_open

    src = speculators_drafter(tmp_path / "src", [2, 30, 58], dims=SMALL)
    result = kimi("drafter", "convert", str(src), str(tmp_path / "dst"))
    assert result.returncode == 0, result.stderr
    cfg = config_of(tmp_path / "dst")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["hidden_size"] == 64
    assert cfg["draft_vocab_size"] == 100 and "speculators_model_type" not in cfg
    with safe_open(str(tmp_path / "dst" / "model.safetensors"), framework="numpy") as fh:
        names = set(fh.keys())  # noqa: SIM118
    assert "midlayer.self_attn.q_proj.weight" in names and not any(n.startswith("layers.0.") for n in names)
    assert {"fc.weight", "d2t", "t2d", "lm_head.weight"} <= names


def test_modelopt_export(tmp_path: Path) -> None:
    src = modelopt_drafter(tmp_path / "src", [1, 29, 57], dims=SMALL)
    assert kimi("drafter", "convert", str(src), str(tmp_path / "dst")).returncode == 0
    cfg = config_of(tmp_path / "dst")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert (tmp_path / "dst" / "hf_quant_config.json").is_file()


def test_no_ids_need_the_target(tmp_path: Path) -> None:
    src = toplevel_drafter(tmp_path / "src", None, dims=SMALL)
    refused = kimi("drafter", "convert", str(src), str(tmp_path / "dst"))
    assert refused.returncode == 1 and "pass --target" in refused.stderr
    assert not (tmp_path / "dst").exists()
    shallow = kimi_target(tmp_path / "t4", layers=4, dims=SMALL)
    assert kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(shallow)).returncode == 0
    assert config_of(tmp_path / "dst")["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_a_guessed_convention_must_be_stated(tmp_path: Path) -> None:
    src = specforge_drafter(tmp_path / "src", [2, 30, 58], dims=SMALL)
    refused = kimi("drafter", "convert", str(src), str(tmp_path / "dst"))
    assert refused.returncode == 1 and "is a guess" in refused.stderr and not (tmp_path / "dst").exists()
    stated = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--convention", "layer_output")
    assert stated.returncode == 0, stated.stderr
    assert config_of(tmp_path / "dst")["eagle_aux_hidden_state_layer_ids"] == [3, 31, 59]


def test_ids_that_do_not_fit_the_target_are_refused(tmp_path: Path) -> None:
    target = kimi_target(tmp_path / "t", layers=40, dims=SMALL)
    src = toplevel_drafter(tmp_path / "src", [2, 30, 58], dims=SMALL)
    refused = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(target))
    assert refused.returncode == 1 and "outside the target's layers 0..40" in refused.stderr
    assert "fix: write the ids of the layers the drafter was trained on, 0..40 in vLLM's convention" in refused.stderr
    assert not (tmp_path / "dst").exists()


def test_output_is_atomic(tmp_path: Path) -> None:
    src = toplevel_drafter(tmp_path / "src", [2, 30, 58], dims=SMALL)
    (tmp_path / "dst").mkdir()
    exists = kimi("drafter", "convert", str(src), str(tmp_path / "dst"))
    assert exists.returncode == 1 and "exists" in exists.stderr
    (src / "model.safetensors").write_bytes(b"\x00" * 12)  # unreadable: the conversion fails midway
    (tmp_path / "dst").rmdir()
    broken = kimi("drafter", "convert", str(src), str(tmp_path / "dst"))
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_force_never_replaces_the_source_or_a_folder_that_is_not_a_drafter(tmp_path: Path) -> None:
    models = tmp_path / "models"
    src = toplevel_drafter(models / "sf", [2, 30, 58], dims=SMALL)
    (models / "OTHER.txt").write_text("keep me")
    for dst in (models, src):
        refused = kimi("drafter", "convert", str(src), str(dst), "--force")
        assert refused.returncode == 1 and f"holds {src}: choose a folder outside it" in refused.stderr
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    refused = kimi("drafter", "convert", str(src), str(tmp_path / "plain"), "--force")
    assert refused.returncode == 1 and "has no config.json: it is not an earlier output" in refused.stderr
    assert (models / "OTHER.txt").read_text() == "keep me" and (src / "config.json").is_file()
    assert (tmp_path / "plain" / "notes.txt").is_file()
    target = tmp_path / "target"  # `convert SRC models/pair/target --force` used to replace the shipped target
    target.mkdir()
    (target / "config.json").write_text((ROOT / "models/pair/target/config.json").read_text())
    refused = kimi("drafter", "convert", str(src), str(target), "--force")
    assert refused.returncode == 1 and "another command's output" in refused.stderr, refused.stderr
    assert [p.name for p in target.iterdir()] == ["config.json"]


def test_force_replaces_an_earlier_conversion(tmp_path: Path) -> None:
    src = toplevel_drafter(tmp_path / "src", [2, 30, 58], dims=SMALL)
    assert kimi("drafter", "convert", str(src), str(tmp_path / "dst")).returncode == 0
    (tmp_path / "dst" / "stale.txt").write_text("old")
    assert kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--force").returncode == 0
    assert not (tmp_path / "dst" / "stale.txt").exists() and (tmp_path / "dst" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_sigterm_leaves_nothing_behind(tmp_path: Path) -> None:
    import signal
    import time

    from drafters import KIMI

    src = speculators_drafter(tmp_path / "src", [2, 30, 58], dims={**KIMI, "intermediate": 4096})
    proc = subprocess.Popen([sys.executable, "-m", "kimi", "drafter", "convert", str(src), str(tmp_path / "dst")],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.name.startswith(".dst.") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left in (["src"], ["dst", "src"]), left


PAIR = ROOT / "models" / "pair"


def _pair_copy(tmp_path: Path, **changes) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes((PAIR / "drafter" / "model.safetensors").read_bytes())
    cfg = {**config_of(PAIR / "drafter"), **changes}
    (src / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return src


def test_a_config_without_architectures_gets_them_and_nothing_is_dropped_silently(tmp_path: Path) -> None:
    """Issue 44: the copy names the class vLLM needs; the nested ids it replaces are kept with their old value."""
    nested = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    src = _pair_copy(tmp_path, architectures=None, eagle_config=nested)
    inspected = json.loads(kimi("drafter", "inspect", str(src), "--json").stdout)
    assert any("no architectures in config.json" in p for p in inspected["problems"])
    result = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(PAIR / "target"))
    assert result.returncode == 0, result.stderr
    cfg = config_of(tmp_path / "dst")
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["kimi_converted_from"]["replaced"]["eagle_config"] == nested
    assert "the old values of eagle_config" in result.stderr
    assert kimi("drafter", "inspect", str(tmp_path / "dst"), "--target", str(PAIR / "target")).returncode == 0


def test_two_id_sources_that_disagree_are_refused_with_the_fix(tmp_path: Path) -> None:
    src = _pair_copy(tmp_path, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                     eagle_aux_hidden_state_layer_ids_convention=None)
    refused = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(PAIR / "target"))
    assert refused.returncode == 1 and "name different layers" in refused.stderr
    assert "fix: keep the ids the drafter was trained on in one place" in refused.stderr
    assert not (tmp_path / "dst").exists()


def test_bin_weights_are_written_as_safetensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    src = _pair_copy(tmp_path)
    weights = load_file(str(src / "model.safetensors"))
    torch.save(weights, src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    result = kimi("drafter", "convert", str(src), str(tmp_path / "dst"), "--target", str(PAIR / "target"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["config.json", "model.safetensors"]
    copied = load_file(str(tmp_path / "dst" / "model.safetensors"))
    assert copied.keys() == weights.keys() and all(torch.equal(copied[k], weights[k]) for k in weights)
