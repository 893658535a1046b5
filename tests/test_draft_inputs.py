"""kimi.e2e.draft_inputs.compare on records made by hand: which drafter rows count, and, where one is wrong, the
pass-by-pass history that tells a stale padded row from one that wrote the drafter's KV (issue 18's H200 gap)."""

from __future__ import annotations

import pytest

from kimi.e2e.draft_inputs import compare

MEDIA = 7


def test_a_later_pass_that_writes_a_placeholder_row_is_named_with_its_slot() -> None:
    torch = pytest.importorskip("torch")
    prompt = [1, MEDIA, MEDIA, MEDIA, MEDIA, 2]
    target = torch.arange(6 * 3, dtype=torch.float32).reshape(6, 3)  # the target's row at each position
    placeholder = torch.full((3,), -1.0)
    whole = (torch.arange(5), target[1:6].clone(), torch.arange(10, 15))  # drafter p reads the target's p + 1
    # a later pass of three rows from position 1 (slots 11-13) with the placeholder's row at 1 and 2
    late = (torch.tensor([1, 2, 3]), torch.stack([placeholder, placeholder, target[4]]), torch.tensor([11, 12, 13]))
    records = {"target": [(torch.arange(6), target, None)], "drafter": [whole, late]}
    out = compare(records, prompt, MEDIA, placeholder)
    assert out["image_positions"] == 4 and out["image_equal"] == 2 and out["image_placeholder"] == 2
    assert out["image_unequal_at"] == out["image_placeholder_at"] == [2, 3]
    assert out["image_unequal_history"]["2"] == [
        {"pass": 0, "pass_rows": 5, "pass_first": 0, "slot": 11, "row": "target"},
        {"pass": 1, "pass_rows": 3, "pass_first": 1, "slot": 11, "row": "placeholder"}]
    assert [h["row"] for h in out["image_unequal_history"]["3"]] == ["target", "placeholder"]
    assert set(out["image_unequal_history"]) == {"2", "3"}  # equal positions carry no history


def test_unknown_slots_are_said_and_equal_rows_give_no_history() -> None:
    torch = pytest.importorskip("torch")
    prompt = [1, MEDIA, 2]
    target = torch.eye(3)
    records = {"target": [(torch.arange(3), target, None)], "drafter": [(torch.arange(2), target[1:3].clone(), None)]}
    out = compare(records, prompt, MEDIA, torch.zeros(3))
    assert out["image_equal"] == out["image_positions"] == 1 and out["image_unequal_history"] == {}
    wrong = {"target": records["target"], "drafter": [(torch.arange(2), torch.ones(2, 3), None)]}
    history = compare(wrong, prompt, MEDIA, torch.zeros(3))["image_unequal_history"]
    assert history == {"1": [{"pass": 0, "pass_rows": 2, "pass_first": 0, "slot": None, "row": "other"}]}


def _v2_decode_records(torch, placeholder, late_slot: int | None = None):
    """Records shaped as the H200 gave them (2026-12-02): a prefill pass writing every slot right, then a decode
    pass of four rows whose first is real (position 7) and whose other three carry stale positions 1-3 with
    placeholder rows, writing the slots of later positions (108-110) or, with ``late_slot``, slot 101 again."""
    target = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    prefill = (torch.arange(7), target[1:8].clone(), torch.arange(100, 107))
    slots = torch.tensor([107, 108, 109, 110] if late_slot is None else [107, late_slot, 109, 110])
    decode = (torch.tensor([7, 1, 2, 3]), torch.stack([target[0], placeholder, placeholder, placeholder]), slots)
    return {"target": [(torch.arange(8), target, torch.arange(100, 108))], "drafter": [prefill, decode]}


def test_stale_positions_of_rejected_draft_rows_do_not_count_their_slots_do() -> None:
    torch = pytest.importorskip("torch")
    prompt, placeholder = [1, MEDIA, MEDIA, MEDIA, MEDIA, 2, 3, 4], torch.full((3,), -1.0)
    records = _v2_decode_records(torch, placeholder)
    out = compare(records, prompt, MEDIA, placeholder)
    assert out["image_equal"] == out["image_positions"] == 4 and out["image_unequal_at"] == []
    # keyed by the recorded positions instead (no slots known), the stale rows would look like a gap at 2-4
    blind = {k: [(p, r, None) for p, r, _ in v] for k, v in records.items()}
    assert compare(blind, prompt, MEDIA, placeholder)["image_placeholder_at"] == [2, 3, 4]
    # a placeholder row written into position 1's own slot is a real overwrite of the drafter's KV: counted
    overwrite = compare(_v2_decode_records(torch, placeholder, late_slot=101), prompt, MEDIA, placeholder)
    assert overwrite["image_placeholder_at"] == [2]
    assert [(h["slot"], h["row"]) for h in overwrite["image_unequal_history"]["2"]] == [(101, "target"),
                                                                                       (101, "placeholder")]


def test_the_report_lists_each_wrong_rows_passes(tmp_path) -> None:
    from kimi_lab.bench.multimodal import write_results

    passes = [{"pass": 3, "pass_rows": 51, "pass_first": 32, "slot": 1058, "row": "target"},
              {"pass": 4, "pass_rows": 4, "pass_first": 83, "slot": 1059, "row": "placeholder"}]
    scenario = {"image_positions": 38, "image_equal": 37, "image_placeholder": 1, "image_not_read": 26,
                "image_unequal_at": [34], "image_unequal_history": {"34": passes}}
    write_results(tmp_path, {"command": "c", "date": "d", "device": "H200", "vllm": "0.32.0",
                             "drafter_sees_target_embeddings": False, "lossless": {},
                             "drafter_inputs": {"llama": [{"engine": {"model_runner": "v2"},
                                                           "scenarios": {"prefix_hit_inside": scenario}}]}})
    text = (tmp_path / "multimodal.md").read_text()
    assert ("- llama prefix_hit_inside, position 34: pass 3: 51 from 32, slot 1058, target; "
            "pass 4: 4 from 83, slot 1059, placeholder") in text
