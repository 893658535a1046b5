"""A corpus of broken and odd EAGLE-3 drafters, built from the reference models, and their verdicts.

Every entry of :data:`kimi_lab.drafter.assumptions.ASSUMPTIONS` (a lie, or a valid variant: other weight formats,
shards, the final-layer aux id in each convention) is applied to a copy of each good drafter it fits
(:data:`BASES`: the shipped pair's trained Llama-style drafter against its target, and the reference models'
Llama-style and MLA-style drafters against theirs, ``kimi models make``), plus the formats the fork writes
(:func:`written_formats`: the SpecForge export, and ``kimi drafter convert``'s copies of it and of a ``.bin``
drafter). Each case is judged the way a user meets it:

* ``inspect``: ``kimi drafter inspect`` against the target; refused when a finding would stop ``vllm serve``
  (``SERVE_BLOCKING``) or the checkpoint cannot be read;
* ``hook``: the serve-time check itself (:func:`kimi.drafter.serve_checks.prepare_eagle3_drafter`), given
  the target as vLLM's config describes it; it runs while vLLM builds its config, before any weight loads.

A case's ``expected`` verdict is ``refused`` for a lie the entry says ``vllm serve`` stops, else ``served``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from kimi.drafter.checkpoint import read_config, text_config
from kimi.drafter.inspect import inspect
from kimi.errors import KimiError
from kimi_lab.drafter.assumptions import ASSUMPTIONS, Assumption, make_copy
from kimi_lab.drafter.lies import as_torch

REFUSED, SERVED = "refused", "served"
#: Good drafters: name -> (drafter, target), relative to the folder holding ``pair/`` (the shipped pair) and
#: ``reference/`` (``kimi models make``).
BASES = {"pair-llama": ("pair/drafter", "pair/target"),
         "reference-llama": ("reference/drafter-llama", "reference/target"),
         "reference-mla": ("reference/drafter-mla", "reference/target")}


@dataclass(frozen=True)
class Case:
    """One drafter folder of the corpus, its target, and what ``vllm serve`` on the fork must do with it.

    Attributes:
        name: ``<entry>/<base>``.
        drafter: the drafter folder; target: the target folder.
        expected: :data:`REFUSED` or :data:`SERVED`.
        needle: words the refusal (or a note) must hold ('' for a valid variant).
        fix: words the fix of that refusal must hold ('' where nothing is refused).
    """

    name: str
    drafter: Path
    target: Path
    expected: str
    needle: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Verdict:
    """What a check said: :data:`REFUSED` or :data:`SERVED`, its words (problems with their fixes, or a refusal's
    message; '' when it said nothing) and the seconds it took."""

    verdict: str
    said: str
    seconds: float


def _case(entry: Assumption, base: str, drafter: Path, target: Path, dest: Path) -> Case:
    make_copy(entry, drafter, target, dest)
    return Case(f"{entry.name}/{base}", dest, target, REFUSED if entry.refused else SERVED, entry.needle, entry.fix)


def written_formats(pair: Path, dest: Path) -> list[Case]:
    """The formats the fork writes, from the pair's drafter: the SpecForge export
    (:func:`kimi_lab.drafter.other_tools.specforge_checkpoint`), ``kimi drafter convert`` of it, and ``convert`` of the
    drafter saved as ``pytorch_model.bin`` (written back as safetensors); every one must be served."""
    from kimi.drafter.convert import convert
    from kimi_lab.drafter.other_tools import specforge_checkpoint

    drafter, target = pair / "drafter", pair / "target"
    specforge = specforge_checkpoint(drafter, dest / "specforge-export")
    binary = dest / "bin-source"
    shutil.copytree(drafter, binary)
    as_torch("pytorch_model.bin")(binary, target)
    convert(specforge, dest / "converted-specforge", target)
    convert(binary, dest / "converted-bin", target)
    names = ("specforge-export", "converted-specforge", "converted-bin")
    return [Case(f"{name}/pair-llama", dest / name, target, SERVED) for name in names]


def build(models: Path, dest: Path) -> list[Case]:
    """Write every case under ``dest`` (which must not exist) from the good drafters of :data:`BASES` under
    ``models``; returns the cases, entries in :data:`ASSUMPTIONS` order, then :func:`written_formats`.

    Raises:
        KimiError: a base is missing, or ``dest`` exists.
    """
    if dest.exists():
        raise KimiError(f"{dest} exists: the corpus is written into a new folder")
    cases = []
    for base, (drafter, target) in BASES.items():
        if not (models / drafter / "config.json").is_file():
            raise KimiError(f"no {models / drafter}: `kimi models make --out {models / 'reference'}` writes the "
                            "reference models")
        for entry in ASSUMPTIONS:
            if entry.applies(models / drafter, models / target):
                cases.append(_case(entry, base, models / drafter, models / target, dest / base / entry.name))
    return cases + written_formats(models / "pair", dest / "written")


def judge_inspect(case: Case) -> Verdict:
    """``kimi drafter inspect`` of the case against its target: refused when it names a finding that stops
    ``vllm serve`` or cannot read the checkpoint."""
    from kimi.drafter.serve_checks import SERVE_BLOCKING

    begin = time.monotonic()
    try:
        report = inspect(case.drafter, case.target)
    except KimiError as exc:
        return Verdict(REFUSED, str(exc), time.monotonic() - begin)
    said = "; ".join([f"{f.text} (fix: {f.fix})" for f in report.findings] + report.notes)
    refused = report.blocking(SERVE_BLOCKING)
    return Verdict(REFUSED if refused else SERVED, said, time.monotonic() - begin)


def spec_config(drafter: Path, target: Path, max_model_len: int = 1024) -> SimpleNamespace:
    """What the serve-time check reads of vLLM's ``SpeculativeConfig`` for ``method: eagle3``, built from the two
    folders as vLLM builds it (the draft ``hf_config`` an object with the config's fields; one pipeline stage)."""
    target_cfg = text_config(read_config(target))
    return SimpleNamespace(
        draft_model_config=SimpleNamespace(model=str(drafter), hf_config=SimpleNamespace(**read_config(drafter))),
        target_model_config=SimpleNamespace(model=str(target), hf_text_config=SimpleNamespace(**target_cfg),
                                            max_model_len=max_model_len),
        target_parallel_config=SimpleNamespace(pipeline_parallel_size=1, tensor_parallel_size=1))


def judge_hook(case: Case) -> Verdict:
    """The serve-time check (patch 0004's hook) on the case: refused when it raises ``DrafterConfigError``, whose
    message is what ``vllm serve`` prints. Needs the fork's venv (the hook logs through vLLM's logger)."""
    from kimi.drafter.serve_checks import DrafterConfigError, prepare_eagle3_drafter

    config = spec_config(case.drafter, case.target)
    begin = time.monotonic()
    try:
        prepare_eagle3_drafter(config)
    except DrafterConfigError as exc:
        return Verdict(REFUSED, str(exc), time.monotonic() - begin)
    return Verdict(SERVED, "", time.monotonic() - begin)


def agrees(case: Case, seen: Verdict) -> bool:
    """Whether a verdict is the expected one, and a refusal holds the case's needle and its fix."""
    if seen.verdict != case.expected:
        return False
    return seen.verdict == SERVED or (case.needle in seen.said and case.fix in seen.said)
