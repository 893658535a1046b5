"""``pair-k25``: the Kimi-K2.5 wrapper of the shipped pair's target with the trained vision tower.

Two steps, each written atomically:

* :func:`write_vision` (``kimi models train-vision``): ``models/pair-vision/``, the trained tower and projector
  only (``vision.safetensors``, bf16, about 0.3 MB) and a ``MANIFEST.json`` with the recipe, the snippets, the
  losses, the seconds and the sha256 of the weights (:mod:`kimi.models.vision` trains them);
* :func:`assemble` (``kimi models pair-k25``): the wrapper folder, the pair target's text weights under
  ``language_model.`` plus those tensors, through the same writer as the random reference wrapper
  (:func:`kimi.models.reference.write_kimi_k25`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import (
    check_replaceable,
    default_mode,
    read_json_object,
    sha256_file,
    staged_folder,
    write_atomic,
)
from kimi.log import sayer
from kimi.models import OUTPUT_KEYS, SHIPPED_PAIR
from kimi.models.vision import VISION

#: The shipped trained tower (tracked: ``vision.safetensors``, ``MANIFEST.json``).
SHIPPED_VISION = SHIPPED_PAIR.parent / "pair-vision"
WEIGHTS = "vision.safetensors"
#: The projector's last layer: its rows are the image rows the text model reads ([hidden_size, 4 x tower width]).
PROJECTOR_OUT = "mm_projector.proj.2.weight"

say = sayer("models")


def write_vision(out: Path, tensors: dict, record: dict, recipe, force: bool = False) -> dict:
    """Write ``out/vision.safetensors`` (``tensors``) and ``out/MANIFEST.json`` (``recipe``, ``record``, digest).

    Raises:
        KimiError: ``out`` exists without ``force`` or is not an earlier tower (``check_replaceable`` with
            ``OUTPUT_KEYS["train-vision"]``); writing failed.
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), marker_keys=OUTPUT_KEYS["train-vision"])
    with staged_folder(out) as staging:
        save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
        os.chmod(staging / WEIGHTS, default_mode())
        manifest = {"recipe": asdict(recipe), "vision": asdict(VISION), **record,
                    "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                    "files": {WEIGHTS: sha256_file(staging / WEIGHTS)}}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out}")
    return manifest



def load_vision(folder: Path = SHIPPED_VISION) -> tuple[dict, dict]:
    """``(tensors, manifest)`` of a trained tower folder, after checking the weights' sha256.

    Raises:
        KimiError: no manifest or weights, or the weights are not the ones the manifest names.
    """
    from safetensors.torch import load_file

    manifest_path, weights = folder / "MANIFEST.json", folder / WEIGHTS
    if not manifest_path.is_file() or not weights.is_file():
        raise KimiError(f"{folder} holds no trained vision tower: run `kimi models train-vision {folder}`")
    try:
        manifest = read_json_object(manifest_path)
    except ValueError as exc:
        raise KimiError(f"{exc}: not a trained tower's manifest") from None
    if not all(key in manifest for key in OUTPUT_KEYS["train-vision"]) or WEIGHTS not in manifest.get("files", {}):
        raise KimiError(f"{manifest_path} is not a trained tower's manifest (written by `kimi models train-vision`)")
    if sha256_file(weights) != manifest["files"][WEIGHTS]:
        raise KimiError(f"{weights} is not the file its MANIFEST.json names: restore it (`git checkout -- "
                        f"{folder}`) or train it again")
    return load_file(str(weights)), manifest


def assemble(out: Path, pair: Path = SHIPPED_PAIR, vision: Path = SHIPPED_VISION, force: bool = False) -> dict:
    """Write the ``pair-k25`` wrapper into ``out``: ``pair/target``'s text model and ``vision``'s tower.

    Returns:
        Its ``MANIFEST.json``: the wrapper entry, the sources' digests and every file's sha256.

    Raises:
        KimiError: ``out`` is an input, exists without ``force`` or is not an earlier wrapper
            (``check_replaceable``); the pair or
            the tower fails its manifest check; the tower's projector writes rows of another width than the
            target's hidden size (a tower trained for another target).
    """
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from kimi.models.reference import write_kimi_k25
    from kimi.models.shipped import check_pair

    pair_manifest = check_pair(pair)
    tensors, vision_manifest = load_vision(vision)
    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), inputs=(pair, vision),
                      marker_keys=OUTPUT_KEYS["pair-k25"])
    target = pair / "target"
    text = json.loads((target / "config.json").read_text())
    width = tensors[PROJECTOR_OUT].shape[0]
    if width != text["hidden_size"]:
        raise KimiError(f"the tower in {vision} writes {width}-wide image rows, the target {target} reads "
                        f"{text['hidden_size']}-wide ones: train a tower for this target (`kimi models train-vision "
                        f"OUT --target {target}`) and pass it as --vision")
    with staged_folder(out) as staging:
        entry = write_kimi_k25(staging / "model", text, load_file(str(target / "model.safetensors")), tensors,
                               VISION, Tokenizer.from_file(str(target / "tokenizer.json")),
                               text["max_position_embeddings"])
        files = {p.relative_to(staging).as_posix(): sha256_file(p) for p in sorted(staging.rglob("*")) if p.is_file()}
        manifest = {"kimi_k25": entry, "target": str(target), "vision": str(vision),
                    "target_sha256": pair_manifest["files"]["target/model.safetensors"],
                    "vision_sha256": vision_manifest["files"][WEIGHTS], "files": files}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out}/model (serve it with {pair / 'drafter'})")
    return manifest
