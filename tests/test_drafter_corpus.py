"""The drafter corpus (``lab/kimi_lab/drafter/corpus.py``, issue 44): every broken drafter refused before the target
loads, by ``kimi drafter inspect`` and by the serve-time check, with words for its own cause and the fix for it; every
right one (other weight formats, shards, the final-layer aux id in each convention, what the fork writes) served.

One test per case and judge; the corpus is built once from the shipped pair and the reference models. The judge
``hook`` calls patch 0004's check as ``vllm serve`` reaches it (``install``: it needs the fork's vLLM).
"""

from __future__ import annotations

import pytest

from conftest import ROOT
from engine_script import make_reference_models

pytest.importorskip("safetensors")
pytest.importorskip("torch")

from kimi_lab.drafter.assumptions import ASSUMPTIONS  # noqa: E402
from kimi_lab.drafter.corpus import BASES, REFUSED, SERVED, agrees, build, judge_hook, judge_inspect  # noqa: E402

NAMES = [f"{entry.name}/{base}" for entry in ASSUMPTIONS for base in BASES] + [
    f"{name}/pair-llama" for name in ("specforge-export", "converted-specforge", "converted-bin")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    models = tmp_path_factory.mktemp("models")
    (models / "pair").symlink_to(ROOT / "models" / "pair")
    make_reference_models(models / "reference")
    return {case.name: case for case in build(models, tmp_path_factory.mktemp("corpus") / "cases")}


def _case(corpus: dict, name: str):
    if name not in corpus:
        pytest.skip(f"{name.split('/')[0]} does not fit the {name.split('/')[1]} drafter")
    return corpus[name]


def test_the_corpus_has_forty_cases_of_both_verdicts(corpus: dict) -> None:
    verdicts = [case.expected for case in corpus.values()]
    assert len(corpus) >= 40 and verdicts.count(REFUSED) >= 20 and verdicts.count(SERVED) >= 20
    assert set(corpus) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_inspect(corpus: dict, name: str) -> None:
    case = _case(corpus, name)
    seen = judge_inspect(case)
    assert agrees(case, seen), (case.expected, case.needle, case.fix, seen)


@pytest.mark.install
@pytest.mark.parametrize("name", NAMES)
def test_serve_time_check(corpus: dict, name: str) -> None:
    case = _case(corpus, name)
    seen = judge_hook(case)
    assert agrees(case, seen), (case.expected, case.needle, case.fix, seen)
    if seen.verdict == REFUSED:
        assert seen.seconds < 10 and case.fix.lower() in seen.said.lower().split("fix: ", 1)[1], seen
