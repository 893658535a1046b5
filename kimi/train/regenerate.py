"""Stage a, regenerate: the target's own responses to prompts, through the fork's vLLM.

Writes ``samples.jsonl`` in the work folder: per prompt ``input_ids`` (prompt + response) and
``loss_mask`` (0 on prompt tokens, 1 on response tokens). Resumable: the prompts already answered are
skipped. Prompts are either a JSONL file of ``{"prompt": text}`` (a team's own traffic) or snippets of
the stdlib training corpus (whole lines from a seeded choice of files), never the held-out packages.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.train.engine import engine_settings, say
from kimi.train.store import append_samples, read_samples


@dataclass(frozen=True)
class RegenerateOptions:
    """What to ask the target: prompt count and size, response length and sampling."""

    num_prompts: int = 256
    prompt_chars: int = 300
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    batch: int = 64
    #: More prompts, after those, from the ``.py`` files of this importable package (code the target did not
    #: train on, as a team's own traffic is): a drafter trained only on the target's answers to its training
    #: corpus learns a target that is quoting, not the one users meet.
    package: str | None = None
    package_prompts: int = 0


def package_files(name: str) -> list[Path]:
    """The ``.py`` files of the importable package ``name``, sorted, without its tests.

    Raises:
        KimiError: ``name`` is not importable here or is a single module.
    """
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise KimiError(f"no package {name!r} to take prompts from in this Python")
    root = Path(next(iter(spec.submodule_search_locations)))
    return sorted(p for p in root.rglob("*.py") if "tests" not in p.relative_to(root).parts)


def corpus_prompts(count: int, chars: int, seed: int, files: list[Path] | None = None) -> list[str]:
    """``count`` snippets of whole lines (about ``chars`` characters) from ``files`` (default: the stdlib
    training files), chosen with ``random.Random(seed)``."""
    from kimi.models.tokenizer import stdlib_corpus

    rng = random.Random(seed)
    files = stdlib_corpus().files if files is None else files
    if not files:
        raise KimiError("no files to take prompts from")
    prompts: list[str] = []
    while len(prompts) < count:
        lines = rng.choice(files).read_text(errors="replace").splitlines(keepends=True)
        if len(lines) < 8:
            continue
        start, text = rng.randrange(len(lines) - 4), ""
        for line in lines[start:]:
            if len(text) + len(line) > chars and text:
                break
            text += line
        if text.strip():
            prompts.append(text)
    return prompts


def file_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file of ``{"prompt": text}`` objects."""
    try:
        return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KimiError(f"reading prompts from {path}: {exc}; want one JSON object "
                        '{"prompt": ...} a line') from None


def regenerate(work: Path, target: str, opts: RegenerateOptions, prompts_file: Path | None = None) -> int:
    """Answer every prompt not yet in ``work/samples.jsonl`` with the target; returns the sample count."""
    from tqdm import tqdm

    from kimi.e2e.engine import tokenize

    work.mkdir(parents=True, exist_ok=True)
    out = work / "samples.jsonl"
    prompts = file_prompts(prompts_file) if prompts_file else corpus_prompts(opts.num_prompts, opts.prompt_chars,
                                                                             opts.seed)
    if opts.package and opts.package_prompts and not prompts_file:
        prompts += corpus_prompts(opts.package_prompts, opts.prompt_chars, opts.seed, package_files(opts.package))
    done = read_samples(out)
    out.write_text("".join(json.dumps(s, separators=(",", ":")) + "\n" for s in done))  # drop a torn line
    todo = list(range(len(done), len(prompts)))
    if not todo:
        say(f"regenerate: all {len(prompts)} prompts answered already ({out})")
        return len(done)
    say(f"regenerate: {len(todo)} of {len(prompts)} prompts to answer with {target} "
        f"(max {opts.max_tokens} tokens, temperature {opts.temperature})")
    from vllm import LLM, SamplingParams

    llm = LLM(model=target, **engine_settings())
    ids = tokenize(target, prompts)
    try:
        with tqdm(total=len(prompts), initial=len(done), desc="regenerate", unit="prompt") as bar:
            for first in range(todo[0], len(prompts), opts.batch):
                chunk = range(first, min(first + opts.batch, len(prompts)))
                params = [SamplingParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=opts.seed + i)
                          for i in chunk]
                results = llm.generate([{"prompt_token_ids": ids[i]} for i in chunk], params, use_tqdm=False)
                samples = []
                for i, result in zip(chunk, results, strict=True):
                    response = list(result.outputs[0].token_ids)
                    samples.append({"input_ids": ids[i] + response,
                                    "loss_mask": [0] * len(ids[i]) + [1] * len(response)})
                append_samples(out, samples)
                bar.update(len(chunk))
    finally:
        llm.llm_engine.engine_core.shutdown()
    return len(prompts)
