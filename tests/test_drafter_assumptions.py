"""``lab/kimi_lab/drafter/assumptions.py``: the entries are described and the table has a row for each. That every lying
copy is named (and refused where the entry says so) and every valid variant passed, by ``kimi drafter inspect`` and
by the serve-time check, is ``tests/test_drafter_corpus.py``.

Good drafters: the shipped pair's Llama-style drafter (``models/pair``) and a small MLA-style one written here
(``tests/drafters.py``) at the pair target's dimensions, both against the pair's target. What upstream does with
the same copies is ``tests/patches/test_drafter_assumptions_upstream.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from drafters import mla_drafter

pytest.importorskip("safetensors")
pytest.importorskip("torch")

from kimi.drafter.inspect import inspect  # noqa: E402
from kimi_lab.drafter.assumptions import (  # noqa: E402
    ASSUMPTIONS,
    OUTCOMES,
    SERVES,
    SERVES_SAME,
    assumption_table,
    make_copy,
)

PAIR = ROOT / "models" / "pair"
TARGET = PAIR / "target"
# The pair target's dimensions (hidden 192, 6 layers, vocab 4096) for the MLA-style drafter.
PAIR_DIMS = {"hidden": 192, "target_vocab": 4096, "draft_vocab": 1536, "heads": 2, "kv_heads": 2, "head_dim": 96,
             "intermediate": 384, "max_positions": 8192, "q_lora": 64}


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    mla = mla_drafter(tmp_path_factory.mktemp("mla") / "drafter", [2, 4, 5], dims=PAIR_DIMS, model_type="kimi_k2")
    return {"llama": PAIR / "drafter", "mla": mla}


def test_the_good_drafters_have_nothing_to_report(drafters: dict[str, Path]) -> None:
    for path in drafters.values():
        report = inspect(path, TARGET)
        assert report.problems == [] and report.notes == [], (path, report.problems, report.notes)


def test_every_entry_is_described() -> None:
    names = [entry.name for entry in ASSUMPTIONS]
    assert len(names) == len(set(names))
    for entry in ASSUMPTIONS:
        assert entry.outcome in OUTCOMES and entry.reads and entry.upstream, entry.name
        if entry.valid:
            assert not entry.refused and entry.outcome in (SERVES, SERVES_SAME), entry.name
        assert bool(entry.fix) == entry.refused, entry.name  # every refusal says its own fix
    assert sum(entry.valid for entry in ASSUMPTIONS) >= 8


def test_the_table_has_a_row_per_entry(drafters: dict[str, Path]) -> None:
    rows = assumption_table(drafters["llama"], TARGET)
    assert [row["name"] for row in rows] == [e.name for e in ASSUMPTIONS if e.applies(drafters["llama"], TARGET)]
    for row in rows:
        assert set(row) == {"name", "reads", "upstream_behaviour", "message", "valid", "refused"}
        assert bool(row["message"]) or row["valid"], row
        assert not (row["valid"] and row["refused"]), row
        assert row["upstream_behaviour"].split(":")[0] in OUTCOMES, row
    assert {r["name"] for r in rows if r["refused"]} >= {"tensor-absent", "d2t-absent", "lm-head-absent"}


def test_a_sharded_drafter_cannot_be_lied_into(tmp_path: Path) -> None:
    from kimi.errors import KimiError

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("config.json", "model.safetensors"):
        (sharded / name).write_bytes((PAIR / "drafter" / name).read_bytes())
    (sharded / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    entry = next(e for e in ASSUMPTIONS if e.name == "tensor-absent")
    with pytest.raises(KimiError, match="single model.safetensors"):
        make_copy(entry, sharded, TARGET, tmp_path / "copy")
