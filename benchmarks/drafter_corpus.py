"""The drafter corpus (issue 44): broken and odd EAGLE-3 drafters, each judged before the target loads.

Run in the fork's venv (``python3 -m kimi setup`` makes it)::

    .venv/bin/python benchmarks/drafter_corpus.py [--work DIR] [--no-engine] [--out benchmarks/results]

Writes the reference models (``kimi models make``) and the corpus (:mod:`kimi_lab.drafter.corpus`: every entry of
``lab/kimi_lab/drafter/assumptions.py`` on copies of the shipped pair's drafter and the reference drafters, and the
formats the fork writes) under ``--work`` (default: a temporary folder), then judges each drafter with ``kimi drafter
inspect``, the serve-time check and vLLM's engine-config build (:mod:`kimi_lab.bench.drafter_corpus`). Writes
``drafter_corpus.json`` and ``drafter_corpus.md`` to ``--out``; exit status 1 when a verdict is not the expected one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.models import SHIPPED_PAIR
from kimi.models.reference import make_reference_models
from kimi_lab.bench.drafter_corpus import run, summary, write_results
from kimi_lab.bench.hardware import cpu_name
from kimi_lab.bench.results import stamp
from kimi_lab.drafter.corpus import build

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="folder for the models and the corpus (new)")
    parser.add_argument("--no-engine", action="store_true", help="skip vLLM's engine-config build per case")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    import vllm

    with tempfile.TemporaryDirectory(prefix="kimi-corpus-") as tmp:
        work = args.work or Path(tmp)
        models = work / "models"
        models.mkdir(parents=True)
        (models / "pair").symlink_to(SHIPPED_PAIR)
        make_reference_models(models / "reference")
        rows = run(build(models, work / "cases"), engine=not args.no_engine)
    result = {**stamp(sys.argv[0], sys.argv[1:], python=".venv/bin/python"), "machine": cpu_name(),
              "vllm": vllm.__version__, "summary": summary(rows), "rows": rows}
    write_results(args.out, result)
    print(result["summary"])
    return 0 if all(row["agrees"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
