"""The reference models' tokenizer: byte-level BPE trained on the Python standard library's source.

Every machine has the corpus offline.  Training files are the stdlib's
``*.py`` files in sorted order, without its ``test`` package and without the
held-out packages (``HELD_OUT``) kept for prompts that were not trained on.
Training with ``tokenizers`` on the same files gives the same tokenizer;
the stdlib differs between Python minor versions, so the version and a
digest of the corpus are recorded with the model.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")
HELD_OUT = ("json", "email", "http", "xml")
MAX_CORPUS_BYTES = 6_000_000


@dataclass(frozen=True)
class Corpus:
    """Training files and what identifies them."""

    files: list[Path]
    digest: str
    python: str

    @property
    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)


def stdlib_corpus(max_bytes: int = MAX_CORPUS_BYTES) -> Corpus:
    """The stdlib ``*.py`` files in sorted order, up to ``max_bytes``, held-out packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen, total, digest = [], 0, hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        top = path.relative_to(root).parts[0]
        if top in ("test", "site-packages", "idlelib") or top.removesuffix(".py") in HELD_OUT:
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            break
        chosen.append(path)
        total += size
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return Corpus(files=chosen, digest=digest.hexdigest(), python=f"{sys.version_info[0]}.{sys.version_info[1]}")


def site_corpus(max_bytes: int, seed: int = 0) -> Corpus:
    """``*.py`` files of this Python's installed packages (``purelib``/``platlib``), in a seeded shuffle of the
    sorted list, up to ``max_bytes``: more code than the stdlib holds, for a target that must not memorise its
    corpus. Test folders and any path through a held-out package name (``HELD_OUT``) are left out, so the
    benchmark prompts stay unseen; the digest names the files chosen (it differs between machines' packages).
    """
    import random

    roots = sorted({Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")})
    files = sorted({p for root in roots if root.is_dir() for p in root.rglob("*.py")
                    if not {"test", "tests", *HELD_OUT} & set(p.relative_to(root).parts[:-1])})
    random.Random(seed).shuffle(files)
    chosen, total, digest = [], 0, hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        chosen.append(path)
        total += size
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return Corpus(files=chosen, digest=digest.hexdigest(), python=f"{sys.version_info[0]}.{sys.version_info[1]}")


def held_out_files() -> list[Path]:
    """Stdlib source files never trained on (prompts for acceptance and speed measurements)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for name in HELD_OUT for p in (root / name).rglob("*.py")) if root.is_dir() else []


def train_tokenizer(corpus: Corpus, vocab_size: int):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` entries (specials first: ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(p) for p in corpus.files], trainer)
    return tokenizer


def save_tokenizer(tokenizer, out: Path, max_length: int, pad_token: str = SPECIAL_TOKENS[2]) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` as transformers' fast tokenizer does."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=SPECIAL_TOKENS[0],
                                   eos_token=SPECIAL_TOKENS[1], pad_token=pad_token, model_max_length=max_length)
    fast.save_pretrained(str(out))


def copy_tokenizer_files(source: Path, dest: Path) -> None:
    """Copy a model folder's tokenizer files (``tokenizer*``) and ``generation_config.json`` from ``source`` into
    ``dest`` (an existing folder): what a rewritten copy of the model (quantized, widened) keeps as it was."""
    for extra in sorted(source.iterdir()):
        if extra.name.startswith("tokenizer") or extra.name == "generation_config.json":
            shutil.copyfile(extra, dest / extra.name)
