"""Real code prompts from the standard library files the reference tokenizer was not trained on.

The reference models' tokenizer is trained on the Python standard library minus the packages in
:data:`kimi.models.tokenizer.HELD_OUT` (json, email, http, xml); prompts are cut from those held-out
files, so they are real code the models have not seen. Two cuts of the same files:

* :func:`code_prompts`: text prompts that end with a ``def``/``class`` header (``kimi demo``, ``kimi train``,
  ``benchmarks/cpu_e2e.py``, ``benchmarks/acceptance.py``);
* :func:`code_prompt_ids`: token-id prompts of spread lengths from the middle of the files
  (``benchmarks/gpu_e2e.py``, ``benchmarks/perf_vs_upstream.py``; their recorded results used these).

Standard library only (``code_prompt_ids`` imports ``tokenizers`` when called).
"""

from __future__ import annotations

from pathlib import Path

from kimi.errors import KimiError
from kimi.models.tokenizer import held_out_files

#: Characters per prompt: a few lines of code, well inside a 512-token context.
PROMPT_CHARS = 240


def code_prompts(count: int, chars: int = PROMPT_CHARS) -> list[str]:
    """``count`` distinct prompts: whole lines of a held-out file ending with a ``def``/``class`` header.

    Each prompt ends right after the first ``def ...:`` or ``class ...:`` line found past ``chars``
    characters into a file (so a completion continues real code) and holds the whole lines of at most
    ``chars`` characters before it. Files are taken in sorted order: deterministic.

    Raises:
        KimiError: if this Python has fewer than ``count`` usable held-out files.
    """
    prompts: list[str] = []
    for path in held_out_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for line_end in _definition_ends(text):
            if line_end <= chars:
                continue
            prompt = text[text.index("\n", line_end - chars) + 1:line_end]  # whole lines only
            if prompt.strip() and prompt not in prompts:
                prompts.append(prompt)
            break
        if len(prompts) == count:
            return prompts
    raise KimiError(f"found {len(prompts)} code prompts in the held-out stdlib packages, {count} wanted")


def _definition_ends(text: str):
    """Offsets just past each ``def``/``class`` header line of ``text`` (the newline included)."""
    offset = 0
    for line in text.splitlines(keepends=True):
        offset += len(line)
        stripped = line.lstrip()
        if stripped.startswith(("def ", "class ")) and stripped.rstrip().endswith(":"):
            yield offset


def code_prompt_ids(tokenizer_json: Path, count: int, max_len: int) -> list[list[int]]:
    """``count`` distinct token-id prompts of 24..``max_len`` tokens, cut at line starts from held-out files.

    Files are spread over the packages first (every ``len(files) // count``-th, then the others); a file of at
    least 30 lines gives the tokens of its 60 lines from one third in, cut to a length that steps through
    24..``max_len`` (``24 + 37 i`` modulo the range for the i-th prompt). Deterministic for a tokenizer.

    Raises:
        KimiError: this Python has no held-out packages, or fewer than ``count`` prompts could be cut.
    """
    from tokenizers import Tokenizer

    files = held_out_files()
    if not files:
        raise KimiError("this Python has no held-out stdlib packages (json, email, http, xml)")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    step = max(1, len(files) // count)
    order = files[::step] + [f for i, f in enumerate(files) if i % step]  # spread over the packages first
    prompts: list[list[int]] = []
    for path in order:
        if len(prompts) == count:
            break
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(lines) < 30:
            continue
        start = len(lines) // 3
        ids = tokenizer.encode("".join(lines[start:start + 60])).ids
        want = 24 + (len(prompts) * 37) % max(1, max_len - 23)
        if len(ids) >= want and ids[:want] not in prompts:
            prompts.append(ids[:want])
    if len(prompts) < count:
        raise KimiError(f"only {len(prompts)} prompts could be cut from the held-out files, {count} wanted")
    return prompts
