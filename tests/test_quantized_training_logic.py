"""benchmarks/quantized_training.py's library without a GPU: the kimi train commands it runs, the comparison of two
captures of the same tokens, and the markdown."""

from __future__ import annotations

import json

import pytest

from kimi.cli import build_parser
from kimi.train.store import write_shard
from kimi_lab.bench.quantized_training import Settings, compare_captures, markdown, plan


def _drafter(tmp_path):
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"draft_vocab_size": 1536, "num_attention_heads": 4,
                                                            "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}))
    return folder


def test_the_plan_trains_on_each_target_and_serves_each_drafter_on_the_quantized_one(tmp_path) -> None:
    shipped = _drafter(tmp_path)
    steps = plan(Settings(num_prompts=64, epochs=2), tmp_path / "s", tmp_path / "bf16", tmp_path / "q", shipped)
    names = [s.name for s in steps]
    assert names[:5] == ["regenerate-bf16", "capture-bf16", "vocab-bf16", "train-bf16", "export-bf16"]
    assert names[5:10] == [n.replace("bf16", "int4-experts") for n in names[:5]]
    by = {s.name: s for s in steps}
    assert by["capture-int4-experts"].args[-4:] == ["--ids", "2", "4", "5"]  # the shipped drafter's aux ids
    assert by["vocab-bf16"].args[-2:] == ["--draft-vocab", "1536"]  # the shipped drafter's, for its warm start
    train = by["train-int4-experts"].args
    assert train[train.index("--init") + 1] == str(shipped)
    assert train[train.index("--target") + 1] == str(tmp_path / "q")
    assert train[train.index("--epochs") + 1] == "2" and train[train.index("--heads") + 1] == "4"
    same = by["capture-bf16-on-quantized-samples"]
    assert same.samples_from == tmp_path / "s" / "work-int4-experts"
    assert same.args[same.args.index("--target") + 1] == str(tmp_path / "bf16")
    served = [s for s in steps if s.served]
    assert [s.served for s in served] == [("shipped", "bf16"), ("shipped", "int4-experts"),
                                          ("fine-tuned on bf16", "int4-experts"),
                                          ("fine-tuned on int4-experts", "int4-experts")]
    last = served[-1].args
    assert last[last.index("--drafter") + 1] == str(tmp_path / "s" / "drafter-int4-experts")
    assert last[last.index("--target") + 1] == str(tmp_path / "q")
    assert served[-1].work == tmp_path / "s" / "work-int4-experts"
    cli = build_parser()  # every command is one the kimi CLI takes, with the stage it names
    assert [cli.parse_args(s.args).stage for s in steps] == [s.args[1] for s in steps]


def _capture(folder, aux, final, ids, aux_ids=(2, 4, 5)) -> None:
    folder.mkdir(parents=True)
    write_shard(folder / "shard-00000.safetensors", {"aux": aux, "final": final, "input_ids": ids})
    (folder / "index.json").write_text(json.dumps({"aux_layer_ids": list(aux_ids), "hidden": final.shape[1],
                                                   "shards": [{"file": "shard-00000.safetensors"}]}))


def test_captures_are_compared_per_state_on_the_same_tokens(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    g = torch.Generator().manual_seed(0)
    aux, final, ids = torch.randn(10, 12, generator=g), torch.randn(10, 4, generator=g), torch.arange(10)
    moved = aux.clone()
    moved[:, 4:8] *= -1  # the second aux state reversed, the others kept
    _capture(tmp_path / "b", aux, final, ids)
    _capture(tmp_path / "q", moved, final * 1.5, ids)
    got = compare_captures(tmp_path / "q", tmp_path / "b")
    assert got["tokens"] == 10
    assert got["aux 2"] == {"relative_l2": 0.0, "cosine_mean": 1.0}
    assert got["aux 4"] == {"relative_l2": 2.0, "cosine_mean": -1.0}
    assert got["final"] == {"relative_l2": 0.5, "cosine_mean": 1.0}
    _capture(tmp_path / "other", aux, final, ids + 1)
    with pytest.raises(ValueError, match="other tokens"):
        compare_captures(tmp_path / "other", tmp_path / "b")
    _capture(tmp_path / "ids", aux, final, ids, aux_ids=(1, 3, 4))
    with pytest.raises(ValueError, match="other ids"):
        compare_captures(tmp_path / "ids", tmp_path / "b")


def test_the_markdown_names_failed_steps_and_the_table() -> None:
    result = {"command": "python3 benchmarks/quantized_training.py", "date": "d", "device": "H200",
              "vllm_version": "0.32.0+kimi.1.cuda", "targets": {}, "settings": Settings().__dict__,
              "capture_comparison": {"tokens": 3, "aux 2": {"relative_l2": 0.1, "cosine_mean": 0.99}},
              "served": [{"drafter": "shipped", "target": "int4-experts", "tau": 1.9, "per_position": [0.5]}],
              "notes": ["served-3 ran again in a second call"],
              "steps": {"capture-bf16": {"rc": 0, "seconds": 3.0, "log": "a"},
                        "served-3": {"rc": 1, "seconds": 9.0, "log": "/l/served-3.log"}}}
    text = "\n".join(markdown(result))
    assert "| aux 2 | 0.1 | 0.99 |" in text and "| shipped | int4-experts | 1.9 | [0.5] |" in text
    assert "- `served-3`: exit 1 (log `/l/served-3.log`)" in text and "capture-bf16 3.0" in text
    assert "- note: served-3 ran again in a second call" in text
