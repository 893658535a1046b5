"""Off-domain prompts for the reference pair: token-id prompts unlike the Python code it was trained on.

The pair's tokenizer and target were trained on Python source only (``kimi.models.tokenizer``), so anything that
is not Python is off its domain, but not every such input makes the drafter fail: on short random prompts the
target falls into output the drafter predicts nearly as well as code, and longer ones hold it off longer. Each kind
here is deterministic (a seed, files read in sorted order), with lengths stepping by 37 through
``min_len``..``max_len`` tokens as :func:`kimi.models.prompts.code_prompt_ids`' do through 24..``max_len``:

* ``random-text``: the method of ``vllm bench serve --dataset-name random``: per prompt a seeded offset into
  the vocabulary (special ids left out) and the ids that follow it in vocabulary order, decoded to text and
  encoded again (what a server does with the text), cut to the length (twice the length is decoded, so that the
  merges of the re-encoding leave enough; vLLM tops a short prompt up with random ids instead);
* ``prose``: English prose from the text files every CPython install carries beside its standard library
  (``LICENSE.txt``; ``idlelib``'s ``*.txt`` where installed), from seeded paragraph starts;
* ``cjk``: Chinese, Japanese and Korean text from the standard library's ``test/cjkencodings/*-utf8.txt``
  (only where the ``test`` package is installed);
* ``random-ids``: ids drawn uniformly from the vocabulary (special ids left out), never decoded.

Standard library only (the tokenizer's ``tokenizers`` is imported when a kind is made).
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path

from kimi.errors import KimiError

KINDS = ("random-text", "prose", "cjk", "random-ids")


def prompt_lengths(count: int, max_len: int, min_len: int = 24) -> list[int]:
    """``count`` prompt lengths, ``min_len + 37 i`` modulo the range ``min_len``..``max_len`` (with the default
    ``min_len`` those of :func:`kimi.models.prompts.code_prompt_ids`)."""
    return [min_len + (i * 37) % max(1, max_len - min_len + 1) for i in range(count)]


def text_sources(kind: str, stdlib: Path | None = None) -> list[Path]:
    """The files ``kind`` (``prose`` or ``cjk``) cuts its prompts from, sorted; ``stdlib``: the standard library's
    folder (default this Python's). Empty where this Python has none; ``[]`` for the kinds that read no file."""
    root = stdlib or Path(sysconfig.get_paths()["stdlib"])
    if kind == "prose":
        return sorted(p for p in [root / "LICENSE.txt", *(root / "idlelib").glob("*.txt")] if p.is_file())
    if kind == "cjk":
        return sorted((root / "test" / "cjkencodings").glob("*-utf8.txt"))
    return []


def digest(paths: list[Path]) -> str:
    """sha256 over the files' names and bytes (the prompts of ``prose`` and ``cjk`` differ where they differ)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def offdomain_prompts(kind: str, tokenizer_json: Path, count: int, max_len: int, min_len: int = 24,
                      seed: int = 0) -> list[list[int]]:
    """``count`` token-id prompts of ``kind`` (module docstring) for the tokenizer in ``tokenizer_json``, of
    :func:`prompt_lengths` tokens.

    Raises:
        KimiError: an unknown kind, or a kind whose text files this Python lacks or holds too little of.
    """
    from tokenizers import Tokenizer

    if kind not in KINDS:
        raise KimiError(f"unknown off-domain prompt kind {kind!r}: one of {', '.join(KINDS)}")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    rng = random.Random(seed)
    lengths = prompt_lengths(count, max_len, min_len)
    vocab = tokenizer.get_vocab_size()
    special = {tokenizer.token_to_id(t) for t in tokenizer.get_vocab() if t.startswith("<|") and t.endswith("|>")}
    allowed = [i for i in range(vocab) if i not in special]
    if kind == "random-ids":
        return [[rng.choice(allowed) for _ in range(n)] for n in lengths]
    if kind == "random-text":
        prompts = []
        for i, n in enumerate(lengths):
            offset = rng.randrange(vocab)
            ids = [allowed[(offset + i + j) % len(allowed)] for j in range(2 * n)]  # re-encoding may merge
            prompts.append(tokenizer.encode(tokenizer.decode(ids)).ids[:n])
        return prompts
    paragraphs = [p.strip() for path in text_sources(kind)
                  for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n") if p.strip()]
    if len(paragraphs) < 4:
        raise KimiError(f"off-domain kind {kind!r}: this Python has too little of its text "
                        f"({', '.join(str(p) for p in text_sources(kind)) or 'no files'})")
    prompts = []
    for n in lengths:
        start = rng.randrange(len(paragraphs))
        ids: list[int] = []
        for paragraph in paragraphs[start:] + paragraphs[:start]:  # on from the start, wrapping around
            ids += tokenizer.encode(paragraph + "\n\n").ids
            if len(ids) >= n:
                break
        prompts.append(ids[:n])
    return prompts
