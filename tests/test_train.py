"""The drafter-training pieces that need only torch: the TTT unroll against a served draft chain, the loss
masks, the draft vocabulary, resumable sample files, the report's PNG charts (and its data without matplotlib)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT, load_benchmark  # noqa: E402
from kimi.train.eagle3 import DrafterShape, Eagle3Drafter, rotate  # noqa: E402
from kimi.train.report import report  # noqa: E402
from kimi.train.store import append_samples, read_samples  # noqa: E402
from kimi.train.trainer import ttt_loss  # noqa: E402
from kimi.train.vocab import build_vocab  # noqa: E402
from pngs import assert_png, require_matplotlib  # noqa: E402

SHAPE = DrafterShape(hidden=16, target_hidden=16, num_aux=3, vocab=40, draft_vocab=24, heads=2, head_dim=8,
                     intermediate=32)


def _drafter() -> Eagle3Drafter:
    torch.manual_seed(0)
    return Eagle3Drafter(SHAPE, torch.randn(SHAPE.vocab, SHAPE.hidden))


def _served_chain(model: Eagle3Drafter, ids: torch.Tensor, aux: torch.Tensor, t: int, steps: int) -> list:
    """The logits a served chain from row ``t`` produces, one token at a time with an explicit KV list:
    step 0 over rows 0..t from the target's states, then each step one token at the next position."""
    hidden0 = model.fc(aux[None, :t + 1])
    rows = torch.arange(t + 1)
    cache: list = []
    logits, r = model.step(ids[None, rows + 1], hidden0, rows[None], cache, torch.ones(1, t + 1, dtype=torch.bool))
    out, g = [logits[0, t]], r[:, t:t + 1]
    keys = [cache[0][0], cache[0][1]]
    layer, s = model.midlayer, model.shape
    for j in range(1, steps):
        x = torch.cat([layer.input_layernorm(model.embed[ids[t + 1 + j]][None, None]), layer.hidden_norm(g)], -1)
        def heads(proj, x=x):
            return proj(x).view(1, 1, s.heads, s.head_dim).transpose(1, 2)

        pos = torch.tensor([[t + j]])
        q, k, v = (rotate(heads(layer.self_attn.q_proj), pos, s.rope_theta),
                   rotate(heads(layer.self_attn.k_proj), pos, s.rope_theta), heads(layer.self_attn.v_proj))
        keys = [torch.cat([keys[0], k], 2), torch.cat([keys[1], v], 2)]
        att = torch.softmax((q @ keys[0].transpose(-1, -2)) * s.head_dim ** -0.5, -1) @ keys[1]
        attn = layer.self_attn.o_proj(att.transpose(1, 2).reshape(1, 1, -1))
        g = attn + g
        g = layer.mlp(layer.post_attention_layernorm(g)) + g
        out.append(model.lm_head(model.norm(g))[0, 0])
    return out


def test_ttt_unroll_equals_the_served_chain():
    model = _drafter()
    ids = torch.randint(0, SHAPE.vocab, (12,))
    aux = torch.randn(12, 3 * SHAPE.target_hidden)
    with torch.no_grad():
        unrolled = model.unroll(ids[None], aux[None], torch.tensor([12]), 3)
        for t in (0, 4, 8):
            for j, chain in enumerate(_served_chain(model, ids, aux, t, 3)):
                assert torch.allclose(unrolled[j][0, t], chain, atol=1e-5), (t, j)


def test_padding_does_not_leak_into_real_rows():
    model = _drafter()
    ids = torch.randint(0, SHAPE.vocab, (1, 10))
    aux = torch.randn(1, 10, 3 * SHAPE.target_hidden)
    with torch.no_grad():
        alone = model.unroll(ids[:, :7], aux[:, :7], torch.tensor([7]), 2)
        padded = model.unroll(ids, aux, torch.tensor([7]), 2)
    for a, b in zip(alone, padded, strict=True):
        assert torch.allclose(a[0, :5], b[0, :5], atol=1e-5)  # rows whose inputs are inside the first 7 tokens


def _batch(mask: list[int]) -> dict:
    t = len(mask)
    return {"input_ids": torch.randint(0, SHAPE.vocab, (1, t)), "loss_mask": torch.tensor([mask], dtype=torch.bool),
            "aux": torch.randn(1, t, 3 * SHAPE.target_hidden), "final": torch.randn(1, t, SHAPE.hidden),
            "lengths": torch.tensor([t])}


def test_loss_needs_response_tokens_and_reports_each_step():
    model = _drafter()
    lm_head = torch.randn(SHAPE.vocab, SHAPE.hidden)
    d2t = torch.zeros(SHAPE.draft_vocab, dtype=torch.int64)
    t2d = torch.zeros(SHAPE.vocab, dtype=torch.bool)
    t2d[:SHAPE.draft_vocab] = True
    loss, metrics = ttt_loss(model, _batch([0] * 12), lm_head, d2t, t2d, 3)
    assert float(loss) == 0.0 and metrics["acc"] == [0.0, 0.0, 0.0] and metrics["tau_ttt"] == 1.0
    loss, metrics = ttt_loss(model, _batch([0] * 4 + [1] * 8), lm_head, d2t, t2d, 3)
    assert float(loss) > 0 and len(metrics["acc"]) == 3
    loss.backward()
    assert model.fc.weight.grad is not None and model.midlayer.self_attn.q_proj.weight.grad.abs().sum() > 0


def test_vocab_counts_only_response_tokens(tmp_path: Path):
    append_samples(tmp_path / "samples.jsonl", [{"input_ids": [5, 5, 5, 7, 9, 9], "loss_mask": [1, 0, 0, 0, 1, 1]},
                                                {"input_ids": [3, 5], "loss_mask": [0, 1]}])
    info = build_vocab(tmp_path, 12, 2)
    from safetensors.torch import load_file

    vocab = load_file(str(tmp_path / "vocab.safetensors"))
    assert (torch.arange(2) + vocab["d2t"]).tolist() == [5, 9]  # 5 twice, 9 twice in responses; 7 never
    assert vocab["t2d"].nonzero().flatten().tolist() == [5, 9] and vocab["d2t"].dtype == torch.int64
    assert info["coverage"] == 1.0


def test_torn_sample_line_is_dropped(tmp_path: Path):
    path = tmp_path / "samples.jsonl"
    append_samples(path, [{"input_ids": [1], "loss_mask": [1]}])
    with open(path, "a") as f:
        f.write('{"input_ids": [2')
    assert read_samples(path) == [{"input_ids": [1], "loss_mask": [1]}]


def _log(work: Path) -> dict:
    """A five-step training log in ``work`` and a served result for the report."""
    (work / "train").mkdir()
    rows = [{"step": i + 1, "loss": 3.0 - i * 0.1, "acc": [0.5, 0.4], "tau_ttt": 1.7} for i in range(5)]
    (work / "train" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"k": 2, "tau": 1.6, "per_position": [0.4, 0.2], "counters": {}}


def test_report_without_matplotlib_keeps_the_data(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("kimi.train.report.pyplot", lambda: None)
    md = report(tmp_path, _log(tmp_path)).read_text()
    assert "tau = 1.60" in md and "matplotlib is not installed" in md and "![" not in md
    assert (tmp_path / "report" / "curves.csv").read_text().count("\n") == 6
    assert not list((tmp_path / "report").glob("*.png"))


def test_report_writes_valid_png_charts(tmp_path: Path):
    require_matplotlib()
    md = report(tmp_path, _log(tmp_path)).read_text()
    for name in ("training.png", "acceptance.png"):
        assert f"![{name}]({name})" in md
        assert_png(tmp_path / "report" / name, min_size=(400, 300))
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "acceptance.png", "curves.csv", "report.md", "served.json", "training.png"]  # no temp files left
    again = report(tmp_path).read_text()  # no served result given: the kept one
    assert "tau = 1.60" in again and "![acceptance.png](acceptance.png)" in again


def test_acceptance_benchmark_writes_its_chart_beside_the_json(tmp_path: Path):
    require_matplotlib()
    bench = load_benchmark("acceptance")
    result = json.loads((ROOT / "benchmarks" / "results" / "cpu" / "acceptance.json").read_text())
    png = bench.chart(result, tmp_path / "acceptance.png")
    assert png == tmp_path / "acceptance.png"
    assert_png(png, min_size=(400, 300))
    assert "![per-position acceptance](acceptance.png)" in bench.markdown(result, png.name)
    assert_png(ROOT / "benchmarks" / "results" / "cpu" / "acceptance.png", min_size=(400, 300))  # the recorded one


def test_export_never_replaces_a_folder_another_command_wrote(tmp_path: Path):
    """`kimi train export --out models/pair/target --force` used to replace any folder holding a config.json: a
    target's names no aux layer ids, so it is refused before the checkpoint is read."""
    from kimi.errors import KimiError
    from kimi.models import SHIPPED_PAIR
    from kimi.train.export import export

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text((SHIPPED_PAIR / "target" / "config.json").read_text())
    with pytest.raises(KimiError, match="another command's output"):
        export(tmp_path / "work", target, str(SHIPPED_PAIR / "target"), force=True)
    assert [p.name for p in target.iterdir()] == ["config.json"]


def test_shifted_ids_move_every_id_by_one_inside_the_target():
    from kimi.errors import KimiError
    from kimi.train.export import shifted_ids

    assert shifted_ids([2, 4, 5], 8) == [3, 5, 6]
    assert shifted_ids([2, 4, 7], 8) == [1, 3, 6]  # the top id is the last layer: down instead
    with pytest.raises(KimiError):
        shifted_ids([1, 4, 7], 8)  # down would reach layer 0's input, which vLLM cannot capture


def test_shipped_targets_have_mla_head_dims_a_gpu_engine_takes():
    from kimi.models.reference import ReferenceSpec
    from kimi.models.trained import GPU_MLA_PREFILL_HEAD_DIMS, TRAINED_SPEC

    for spec in (ReferenceSpec(), TRAINED_SPEC):
        assert (spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim) in GPU_MLA_PREFILL_HEAD_DIMS
        assert spec.kv_lora_rank + spec.qk_rope_head_dim == 576


def test_a_pair_made_with_another_recipe_is_named_for_retraining():
    from dataclasses import replace

    from kimi.train.pair import PairRecipe, recipe_changes, recipe_json
    from kimi.train.trainer import TrainOptions

    current = PairRecipe()
    assert recipe_changes({"recipe": recipe_json(current)}, current) == []
    older = replace(current, train=TrainOptions(epochs=6, batch=16, lr=3e-3, warmup=10))
    assert recipe_changes({"recipe": recipe_json(older)}, current) == ["train"]
    assert recipe_changes({}, current) == sorted(recipe_json(current))


def test_capture_matches_prefilled_rows_to_samples_in_any_batch_order():
    """vLLM's V2 runner batches requests in its own order (seen on the H200: the capture of 16 samples failed with
    "captured token ids differ from the sample's" when rows were given to samples in submission order)."""
    from kimi.errors import KimiError
    from kimi.train.capture import _Sink

    sink = _Sink()
    first, second = [5, 6, 7, 8, 9], [11, 12, 13]
    sink.expected = [(0, first), (1, second)]
    rows = torch.arange(16.0)[:, None].expand(16, 2)
    # one step: all of the second sample, then the first sample's first chunk of three tokens
    sink.take(torch.tensor(second + first[:3]), torch.tensor([0, 1, 2, 0, 1, 2]), rows[:6], rows[:6])
    assert list(sink.done) == [1]
    sink.take(torch.tensor(first[3:]), torch.tensor([3, 4]), rows[6:8], rows[6:8])  # the first one's last chunk
    assert sorted(sink.done) == [0, 1] and not sink.open and not sink.expected
    assert sink.done[1]["aux"][:, 0].tolist() == [0.0, 1.0, 2.0]
    assert sink.done[0]["aux"][:, 0].tolist() == [3.0, 4.0, 5.0, 6.0, 7.0]
    prefix = first[:3]  # a sample that is another's prefix takes its own rows, not the longer sample's
    sink.expected, sink.done = [(0, first), (1, prefix)], {}
    sink.take(torch.tensor(prefix), torch.tensor([0, 1, 2]), rows[:3], rows[:3])
    assert list(sink.done) == [1] and sink.expected == [(0, first)]
    sink.expected = [(0, first)]
    with pytest.raises(KimiError, match="not asked for"):
        sink.take(torch.tensor([1, 2]), torch.tensor([0, 1]), rows[:2], rows[:2])


def test_a_pair_takes_the_training_settings_of_the_target_it_is_given(tmp_path: Path):
    from dataclasses import asdict

    from kimi.errors import KimiError
    from kimi.models.trained import H200_TRAINING
    from kimi.train.pair import H200_PAIR, place_target, recipe_changes, recipe_json, with_target

    source = tmp_path / "picked"
    source.mkdir()
    training = {**json.loads(json.dumps(asdict(H200_TRAINING))), "site_bytes": 25_000_000}
    del training["eval_windows"]  # a field the target's kimi did not have yet takes its default
    (source / "MANIFEST.json").write_text(json.dumps({"training": training}))
    (source / "model.safetensors").write_bytes(b"w")
    recipe = with_target(H200_PAIR, source)
    assert recipe.target.site_bytes == 25_000_000 and recipe.target.eval_windows == H200_TRAINING.eval_windows
    assert recipe_changes({"recipe": recipe_json(H200_PAIR)}, recipe) == ["target"]
    place_target(source, tmp_path / "pair" / "target")
    assert (tmp_path / "pair" / "target" / "model.safetensors").read_bytes() == b"w"
    (source / "not-a-target").mkdir()
    with pytest.raises(KimiError, match="not a target written by `kimi models train-target`"):
        with_target(H200_PAIR, source / "not-a-target")
