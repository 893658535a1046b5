"""Reference models made by the project (never downloaded): ``tokenizer``, ``reference``, ``trained``, and the
shipped pair."""

from pathlib import Path

#: The shipped reference pair (tracked in the repository: ``target/``, ``drafter/``, ``MANIFEST.json``): what the
#: demo, the tests and the benchmarks serve. Its target was trained on an H200 (``kimi models train-target --recipe
#: h200-unlikelihood``), its drafter by ``kimi models train-pair --recipe h200`` there too;
#: ``docs/reference-models.md`` says how to make it again.
SHIPPED_PAIR = Path(__file__).resolve().parents[2] / "models" / "pair"

#: The top-level MANIFEST.json keys that mark a folder as an earlier output of each ``kimi models`` command that
#: writes one (``pick-target`` copies a ``train-target`` output): with ``--force`` a command replaces only a folder
#: whose manifest holds its own keys (``kimi.fork.fsutil.check_replaceable``), never another command's output, such
#: as the shipped pair, its target or the trained tower.
OUTPUT_KEYS = {
    "make": ("spec", "kimi_k25"),
    "train-target": ("spec", "training"),
    "train-pair": ("recipe", "served"),
    "train-vision": ("recipe", "vision"),
    "pair-k25": ("kimi_k25", "vision_sha256"),
    "quantize": ("scheme", "quantization_config"),
    "widen": ("widened_from",),
}
