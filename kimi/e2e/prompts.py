"""Real code prompts from the standard library files the reference tokenizer was not trained on.

The reference models' tokenizer is trained on the Python standard library minus the packages in
:data:`kimi.models.tokenizer.HELD_OUT` (json, email, http, xml); prompts are cut from those held-out
files, so they are real code the models have not seen. Standard library only.
"""

from __future__ import annotations

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
