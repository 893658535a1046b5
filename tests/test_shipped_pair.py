"""The shipped reference pair (``models/pair``, issue O): whole, small, long-context, and refused when changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT
from kimi.errors import KimiError
from kimi.models import SHIPPED_PAIR
from kimi.models.shipped import check_pair, pair_digests

#: What every device call carries with the tracked tree (issue O: "at most ~12 MB"); the shipped pair is 12.43 MiB
#: (target 10.25 MiB, drafter 1.92 MiB with its 1536-id head, tokenizer and configs), so a device call keeps about
#: 48 MiB for the kit's chunks.
MAX_PAIR_MIB = 12.5


def test_the_shipped_pair_matches_its_manifest_and_stays_small() -> None:
    manifest = check_pair(SHIPPED_PAIR)
    size = sum((SHIPPED_PAIR / name).stat().st_size for name in manifest["files"])
    assert size / 2**20 <= MAX_PAIR_MIB, f"{size / 2**20:.2f} MiB"
    assert {"target/model.safetensors", "target/tokenizer.json", "drafter/model.safetensors"} <= set(manifest["files"])
    target = json.loads((SHIPPED_PAIR / "target" / "config.json").read_text())
    drafter = json.loads((SHIPPED_PAIR / "drafter" / "config.json").read_text())
    assert target["architectures"] == ["DeepseekV3ForCausalLM"] and target["max_position_embeddings"] >= 8192
    assert drafter["max_position_embeddings"] >= 8192
    made = json.loads((SHIPPED_PAIR / "target" / "MANIFEST.json").read_text())
    assert made["made_on"]["device"].startswith("NVIDIA") and made["heldout_loss"] > 0  # the H200 recipe's run


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "pair"
    shutil.copytree(SHIPPED_PAIR, dest, ignore=shutil.ignore_patterns("work"))
    return dest


def test_a_changed_missing_or_extra_file_is_named(tmp_path: Path) -> None:
    pair = _copy(tmp_path)
    config = pair / "drafter" / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 1', '"num_hidden_layers": 2'))
    with pytest.raises(KimiError, match=r"changed: drafter/config.json.*git checkout"):
        check_pair(pair)
    shutil.rmtree(pair)
    pair = _copy(tmp_path)
    (pair / "target" / "tokenizer.json").unlink()
    (pair / "drafter" / "notes.txt").write_text("mine\n")
    with pytest.raises(KimiError, match=r"target/tokenizer.json.*not in the manifest: drafter/notes.txt"):
        check_pair(pair)
    with pytest.raises(KimiError, match="not a reference pair"):
        check_pair(tmp_path)


def test_digests_cover_target_and_drafter_only(tmp_path: Path) -> None:
    pair = _copy(tmp_path)
    (pair / "work").mkdir()
    (pair / "work" / "samples.jsonl").write_text("{}\n")
    assert set(pair_digests(pair)) == set(json.loads((SHIPPED_PAIR / "MANIFEST.json").read_text())["files"])


def test_a_target_trained_otherwise_is_not_taken_for_the_recipes(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # kimi.train imports it
    from kimi.train.pair import train_pair

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "MANIFEST.json").write_text(json.dumps({"training": {"steps": 1}}))
    with pytest.raises(KimiError, match="trained with other settings"):
        train_pair(tmp_path)
    # with --force (which the message names) that target goes, though no pair manifest says the recipe changed; the
    # recipe's own target is then trained: on CUDA only, so here it stops there
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the recipe's target would be trained here (minutes on a GPU)")
    with pytest.raises(KimiError, match="trains on CUDA"):
        train_pair(tmp_path, force=True)
    assert not (tmp_path / "target" / "MANIFEST.json").exists()


def test_train_pair_keeps_the_shipped_pair_and_refuses_another_recipe_over_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # kimi.train imports it
    from kimi.train.pair import H200_PAIR, PairRecipe, train_pair

    pair = _copy(tmp_path)
    before = pair_digests(pair)
    manifest = train_pair(pair, H200_PAIR, target_from=pair / "target")  # the recipe that made it: complete
    assert manifest == json.loads((SHIPPED_PAIR / "MANIFEST.json").read_text())  # returned as it is, not retrained
    with pytest.raises(KimiError, match=r"made with another recipe \(it differs in: .*train.*nothing was changed"):
        train_pair(pair, PairRecipe())  # `kimi models train-pair models/pair` with the CPU recipe
    assert pair_digests(pair) == before and check_pair(pair)["files"] == before


def test_a_target_inside_the_pair_folder_other_than_its_target_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # kimi.train imports it
    from kimi.train.pair import H200_PAIR, place_target, train_pair

    pair = _copy(tmp_path)
    before = pair_digests(pair)
    picked = pair / "picked"  # e.g. `train-pair ROOT --target ROOT/picked --force`: --force would delete it first
    shutil.copytree(pair / "target", picked)
    with pytest.raises(KimiError, match="lies inside"):
        train_pair(pair, H200_PAIR, force=True, target_from=picked)
    assert pair_digests(pair) == before and picked.is_dir()
    with pytest.raises(KimiError, match="not a trained target"):
        place_target(tmp_path / "nothing-here", pair / "target")
    assert pair_digests(pair) == before


def test_each_shipped_output_carries_its_own_commands_manifest_keys_only() -> None:
    """OUTPUT_KEYS tell the shipped outputs apart: the pair is train-pair's, its target train-target's, the tower
    train-vision's; none holds another command's keys, so no other command's --force replaces it."""
    from kimi.models import OUTPUT_KEYS

    shipped = {"train-pair": SHIPPED_PAIR, "train-target": SHIPPED_PAIR / "target",
               "train-vision": SHIPPED_PAIR.parent / "pair-vision"}
    for command, folder in shipped.items():
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        assert [c for c, keys in OUTPUT_KEYS.items() if set(keys) <= set(manifest)] == [command], folder
    for command, keys in OUTPUT_KEYS.items():  # no command's keys are all among another's
        assert not [c for c, other in OUTPUT_KEYS.items() if c != command and set(other) <= set(keys)], command


def test_train_pair_never_empties_another_commands_folder(tmp_path: Path) -> None:
    """`kimi models train-pair models/pair-vision --force` (or a folder of anything else) used to remove what the
    folder held before training; it is refused, and so is a folder whose MANIFEST.json another command wrote."""
    pytest.importorskip("torch")  # kimi.train imports it
    from kimi.train.pair import train_pair

    tower = tmp_path / "tower"
    shutil.copytree(SHIPPED_PAIR.parent / "pair-vision", tower)
    for force in (True, False):
        with pytest.raises(KimiError, match="another command's output .* choose another folder"):
            train_pair(tower, force=force)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    (mine / "target").mkdir()
    with pytest.raises(KimiError, match="has no MANIFEST.json: it is not an earlier output"):
        train_pair(mine, force=True)
    assert sorted(p.name for p in tower.iterdir()) == ["MANIFEST.json", "vision.safetensors"]
    assert (mine / "notes.txt").read_text() == "keep" and (mine / "target").is_dir()


def test_the_recorded_h200_acceptance_is_the_shipped_pairs_and_meets_issue_o_gates() -> None:
    """Issue O's evidence, ``benchmarks/results/acceptance.json``: recorded on an H200 with 0.32.0, of the pair in
    ``models/pair`` (its recipe and stage timings equal the MANIFEST's: another training of the same recipe takes
    other seconds), τ recomputed from vLLM's counters, and every gate met at issue O's limits."""
    from kimi_lab.bench.acceptance import GATES, gates

    result = json.loads((ROOT / "benchmarks" / "results" / "acceptance.json").read_text())
    manifest = json.loads((SHIPPED_PAIR / "MANIFEST.json").read_text())
    assert result["device"].startswith("NVIDIA H200") and result["vllm_version"].startswith("0.32.0")
    assert result["pair"]["recipe"] == manifest["recipe"] and result["pair"]["seconds"] == manifest["seconds"]
    for tau, counters in ((result["tau"], result["counters"]), (result["tau_shifted_ids"],
                                                                result["counters_shifted_ids"])):
        assert tau == pytest.approx(1 + counters["num_accepted_tokens"] / counters["num_drafts"])
    assert GATES == {"loop_share_max": 0.2, "distinct_2_min": 0.5, "tau_min": 2.0, "tau_max": 3.6,
                     "shifted_gap_min": 0.3}  # issue O's Must show
    assert result["quality"]["heldout_loss"] == manifest["target_heldout_loss"]
    assert gates(result)["all_met"], gates(result)
