"""The conventions table in docs/drafters.md is the one ``kimi drafter conventions`` generates from the code, and its
ranges are what the checks accept (no install: ``kimi/drafter/conventions.py`` is plain Python)."""

from __future__ import annotations

import re

from conftest import ROOT
from kimi.drafter.conventions import LAYER_INPUT, LAYER_OUTPUT, check_ids, convention_table, valid_range


def test_the_docs_hold_the_generated_table() -> None:
    docs = (ROOT / "docs" / "drafters.md").read_text()
    shown = re.search(r"<!-- conventions table: .*? -->\n(.*?)\n<!-- end of conventions table -->", docs, re.S)
    assert shown and shown.group(1) == convention_table()


def test_the_final_layer_output_is_valid_in_both_conventions() -> None:
    assert valid_range(LAYER_INPUT, 61) == (0, 61) and valid_range(LAYER_OUTPUT, 61) == (0, 60)
    assert check_ids((2, 30, 61), 61, 3) == []
    (outside,) = check_ids((2, 30, 62), 61, 3)
    assert "[62] are outside the target's layers 0..61" in outside.text and "0..61 in vLLM's convention" in outside.fix
    assert "| 0..L-1 | 1..L |" in convention_table() and "| 0..61 | 0..61 |" in convention_table(61)
