"""Reference models made by the project (never downloaded): ``tokenizer``, ``reference``, ``trained``, and the
shipped pair."""

from pathlib import Path

#: The shipped reference pair (tracked in the repository: ``target/``, ``drafter/``, ``MANIFEST.json``): what the
#: demo, the tests and the benchmarks serve. Its target was trained on an H200 (``kimi models train-target --recipe
#: h200``), its drafter by ``kimi models train-pair --recipe h200`` there too; ``docs/reference-models.md`` says how
#: to make it again.
SHIPPED_PAIR = Path(__file__).resolve().parents[2] / "models" / "pair"
