"""kimi.models.widen: the shipped pair padded to 128-multiple widths computes what it did (transformers, float32),
its norm weights rescaled exactly, and block-FP8 then takes the published 128 x 128 blocks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from kimi.errors import KimiError  # noqa: E402
from kimi.models import SHIPPED_PAIR  # noqa: E402
from kimi.models.quantize import fp8_block_size, fp8_gpu_refusal  # noqa: E402
from kimi.models.shipped import check_pair  # noqa: E402
from kimi.models.widen import normed, padded, widen_pair  # noqa: E402


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wide") / "pair"
    widen_pair(SHIPPED_PAIR, out)
    return out


def test_widths_under_a_norm_grow_by_powers_of_four() -> None:
    assert normed(192) == 768 and normed(64) == 256 and normed(256) == 256 and padded(48) == 128


def test_the_widened_pair_is_whole_and_takes_128_blocks(wide: Path) -> None:
    check_pair(wide)
    cfg = json.loads((wide / "target" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["q_lora_rank"], cfg["moe_intermediate_size"]) == (768, 256, 128)
    assert fp8_block_size(cfg) == (128, 128) and fp8_gpu_refusal(fp8_block_size(cfg)) is None
    drafter = json.loads((wide / "drafter" / "config.json").read_text())
    assert drafter["hidden_size"] == drafter["target_hidden_size"] == 768
    old = load_file(SHIPPED_PAIR / "target" / "model.safetensors")
    new = load_file(wide / "target" / "model.safetensors")
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(new[norm][:192], old[norm] / 2) and not new[norm][192:].any()  # exact: a power of two
    expert = "model.layers.1.mlp.experts.0.down_proj.weight"
    assert torch.equal(new[expert][:192, :48], old[expert]) and not new[expert][:, 48:].any()
    fc_old = load_file(SHIPPED_PAIR / "drafter" / "model.safetensors")["fc.weight"]
    fc_new = load_file(wide / "drafter" / "model.safetensors")["fc.weight"]
    for block in range(3):  # each aux state's columns padded at the end of its own block
        assert torch.equal(fc_new[:192, 768 * block:768 * block + 192], fc_old[:, 192 * block:192 * (block + 1)])
    assert not fc_new[192:].any()


def test_the_widened_target_computes_what_the_shipped_one_does(wide: Path) -> None:
    import transformers

    ids = torch.tensor([[5, 77, 301, 1200, 45, 9, 800, 33, 2, 1000, 64, 7]])
    logits = []
    for folder in (SHIPPED_PAIR / "target", wide / "target"):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            logits.append(model(ids).logits)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
    # the norms' eps, now 4x relative, and float order: max |difference| 0.0022 with the memorising target shipped
    # before 2026-12-04 (logits up to 24), 0.0170 with today's (logits up to 14; it fell to 0.01's bound)
    assert (logits[0] - logits[1]).abs().max() < 0.05


def test_a_pair_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KimiError, match="not a reference pair"):
        widen_pair(tmp_path, tmp_path / "out")


def test_force_replaces_an_earlier_widened_pair_only(wide: Path, tmp_path: Path) -> None:
    """`kimi models widen models/pair-vision --force` used to replace the trained tower (any folder with a
    MANIFEST.json); the pair it reads and a folder inside it are refused too."""
    tower, pair = tmp_path / "tower", tmp_path / "pair"
    shutil.copytree(SHIPPED_PAIR.parent / "pair-vision", tower)
    shutil.copytree(SHIPPED_PAIR, pair)
    for out, why in ((tower, "another command's output"), (pair, "is an input"), (pair / "wide", "lies inside")):
        with pytest.raises(KimiError, match=why):
            widen_pair(pair, out, force=True)
    assert sorted(p.name for p in tower.iterdir()) == ["MANIFEST.json", "vision.safetensors"]
    assert not (pair / "wide").exists() and check_pair(pair)
    assert widen_pair(SHIPPED_PAIR, wide, force=True)["files"] == check_pair(wide)["files"]  # its own: replaced
