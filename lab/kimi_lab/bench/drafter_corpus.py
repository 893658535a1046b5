"""The drafter corpus as a benchmark: every case of :mod:`kimi_lab.drafter.corpus` judged by ``kimi drafter
inspect``, by the serve-time check, and by vLLM building its engine config the way ``vllm serve`` does
(``EngineArgs.create_engine_config``: where the check runs, before any weight loads), with the seconds to the
refusal; written as ``drafter_corpus.json`` and ``drafter_corpus.md``.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from kimi_lab.bench.results import header, write_json, write_lines
from kimi_lab.drafter.corpus import REFUSED, SERVED, Case, Verdict, agrees, judge_hook, judge_inspect

#: Where a refusal at engine-config time happens: vLLM loads no weight before its config is built.
BEFORE_LOAD = "before weight load (engine config)"


def judge_engine(case: Case, max_model_len: int = 1024) -> Verdict:
    """vLLM's ``EngineArgs(...).create_engine_config()`` for the target with the case as its EAGLE-3 drafter (k = 3),
    in this process: refused when it raises (its message), served when the config is built."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(case.target), skip_tokenizer_init=True, max_model_len=max_model_len,
                      speculative_config={"method": "eagle3", "model": str(case.drafter), "num_speculative_tokens": 3})
    begin = time.monotonic()
    try:
        args.create_engine_config()
    except Exception as exc:  # vLLM wraps the hook's DrafterConfigError in pydantic's ValidationError
        return Verdict(REFUSED, str(exc), time.monotonic() - begin)
    return Verdict(SERVED, "", time.monotonic() - begin)


def run(cases: list[Case], engine: bool = True) -> list[dict]:
    """One row per case: ``case``, ``expected``, the verdict of ``inspect``, ``hook`` and (with ``engine``)
    ``engine``, ``seconds`` to the engine's (else the hook's) verdict, ``stage`` of a refusal, ``agrees`` (every
    judge gave the expected verdict, a refusal with the case's cause and fix) and ``said`` (the refusal's message)."""
    rows = []
    for case in cases:
        judges = {"inspect": judge_inspect(case), "hook": judge_hook(case)}
        if engine:
            judges["engine"] = judge_engine(case)
        last = judges["engine" if engine else "hook"]
        rows.append({"case": case.name, "expected": case.expected, **{k: v.verdict for k, v in judges.items()},
                     "seconds": round(last.seconds, 3), "stage": BEFORE_LOAD if last.verdict == REFUSED else "-",
                     "agrees": all(agrees(case, v) for v in judges.values()), "said": last.said[:2000]})
    return rows


def summary(rows: list[dict]) -> dict:
    """Counts: cases, expected refused / served, and for each expectation how many every judge agreed with."""
    expected = Counter(row["expected"] for row in rows)
    agreed = Counter(row["expected"] for row in rows if row["agrees"])
    return {"cases": len(rows), "expected_refused": expected[REFUSED], "expected_served": expected[SERVED],
            "refused_as_expected": agreed[REFUSED], "served_as_expected": agreed[SERVED],
            "max_seconds_to_refusal": max((r["seconds"] for r in rows if r.get("engine", r["hook"]) == REFUSED),
                                          default=None)}


def write_results(out: Path, result: dict) -> None:
    """``drafter_corpus.json`` and ``drafter_corpus.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "drafter_corpus.json", result)
    s = result["summary"]
    lines = header("Drafter corpus: every drafter judged before the target loads", result["command"], result["date"])
    lines += [f"- machine: {result['machine']}; vLLM {result['vllm']}", "",
              (f"{s['cases']} drafters built from the shipped pair and the reference models "
               "(`lab/kimi_lab/drafter/corpus.py`): "
               f"{s['expected_refused']} must be refused, {s['refused_as_expected']} were, by all three judges, each "
               f"refusal naming its cause and its fix; {s['expected_served']} must be served, "
               f"{s['served_as_expected']} were. Longest time to a refusal in vLLM's config build: "
               f"{s['max_seconds_to_refusal']} s."), "",
              ("Judges: `inspect` is `kimi drafter inspect --target`; `hook` the serve-time check of patch 0004 "
               "called as vLLM calls it; `engine` vLLM's `EngineArgs.create_engine_config()`, the step of `vllm "
               "serve` that runs the check, before any weight loads (seconds are this step's). `served` means the "
               "check lets the drafter through; `tests/test_drafter_serve.py` serves a final-layer-id drafter saved "
               "as `.bin` with a real `vllm serve`."), "",
              "| case | expected | inspect | hook | engine | seconds | refused at | agrees |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['expected']} | {r['inspect']} | {r['hook']} | {r.get('engine', '-')} | "
                     f"{r['seconds']} | {r['stage']} | {'yes' if r['agrees'] else '**no**'} |")
    write_lines(out / "drafter_corpus.md", lines)
