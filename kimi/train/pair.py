"""The trained reference pair: ``kimi models train-pair`` (default ``.kimi/models/trained``).

1. ``target/``: :func:`kimi.models.trained.train_target` (the DeepSeek-V3-architecture LM trained on Python
   source; for the shipped pair trained on an H200 and put there first, since its recipe needs CUDA);
2. ``work/``: the ``kimi train`` stages on it - regenerate (greedy answers to stdlib training-corpus snippets and
   to snippets of an installed package's code), capture (at :data:`PAIR_AUX_IDS`), vocab, train, report;
3. ``drafter/``: the exported EAGLE-3 drafter;
4. ``MANIFEST.json``: settings, timings, the last training metrics and the served acceptance on held-out
   prompts (k = 3, greedy). Written last: its presence means the pair is complete.

Every stage that is already done is skipped, so an interrupted run picks up where it stopped. Given the same
target, the same seeds, Python minor version (the stdlib corpus), package version (transformers' source), torch
and thread count give the same drafter.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from kimi.e2e.engine import tokenize
from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, copy_folder, write_atomic
from kimi.models import OUTPUT_KEYS
from kimi.models.prompts import code_prompts
from kimi.models.shipped import pair_digests
from kimi.models.trained import H200_TRAINING, TargetTraining, train_target
from kimi.train.acceptance import served_acceptance
from kimi.train.capture import capture
from kimi.train.engine import say
from kimi.train.export import export
from kimi.train.regenerate import RegenerateOptions, regenerate
from kimi.train.report import report
from kimi.train.store import read_json
from kimi.train.trainer import TrainOptions, train
from kimi.train.vocab import build_vocab

#: Aux layer ids of the pair (vLLM's ``layer_input`` convention) on the 6-layer target: low, middle and the last
#: layer's input. vLLM's default for 6 layers is ``(2, 3, 3)`` (``(2, n // 2, n - 3)``), which names layer 3 twice.
#: The wiring guard's shift (:func:`kimi.train.export.shifted_ids`) is ``(1, 3, 4)``: down by one, since the top id
#: has no layer above; it drops the last layer's input, so a drafter fed those states must lose acceptance.
PAIR_AUX_IDS = (2, 4, 5)


@dataclass(frozen=True)
class PairRecipe:
    """Everything that decides the pair."""

    target: TargetTraining = H200_TRAINING  # how target/ was (or is to be) trained
    #: 384 answers to training-corpus snippets and 768 to snippets of transformers' source (which the target never
    #: saw). Trained on the first 384 alone, the drafter reached tau 2.9 on its own samples but 1.44 served on the
    #: held-out prompts (8 x 64 tokens, CPU): the target quotes its memorised corpus there, not on new code.
    regenerate: RegenerateOptions = RegenerateOptions(num_prompts=384, max_tokens=96, package="transformers",
                                                      package_prompts=768)
    aux_ids: tuple[int, ...] | None = PAIR_AUX_IDS  # None: vLLM's defaults for the target's depth
    draft_vocab: int = 1024
    #: 8 epochs over the 1152 samples (576 steps, about 16 minutes on 2 cores).
    train: TrainOptions = TrainOptions(epochs=8, batch=16, lr=3e-3, warmup=10)
    eval_prompts: int = 8
    eval_tokens: int = 64


#: The drafter made on one H200 (``kimi models train-pair OUT --recipe h200 --target DIR``): the fork's vLLM
#: answers 24576 prompts there (4096 training-corpus snippets and 20480 of ``transformers``' source) and the
#: trainer runs on the GPU, 5 epochs of batch 32 (3840 steps); about 510 s after the kit. Twice the answers of the
#: recipe before it at half the epochs, since that drafter fitted its samples far better than it drafted new text.
#: Timings and acceptance: benchmarks/results/logs/pair-unlikelihood-h200/, benchmarks/results/acceptance.md (H200),
#: benchmarks/results/cpu/acceptance.md.
H200_PAIR = PairRecipe(regenerate=RegenerateOptions(num_prompts=4096, max_tokens=96, batch=2048, package="transformers",
                                                    package_prompts=20480),
                       draft_vocab=1536, train=TrainOptions(epochs=5, batch=32, lr=3e-3, warmup=30, save_every=500))

#: Pair recipes by the name ``kimi models train-pair --recipe`` takes.
PAIR_RECIPES = {"cpu": PairRecipe(), "h200": H200_PAIR}

#: A pair in about two minutes on 2 cores, for the pipeline's end-to-end test (its drafter is not useful).
TINY = PairRecipe(target=TargetTraining(steps=8, batch=4, seq_len=64),
                  regenerate=RegenerateOptions(num_prompts=12, max_tokens=16, batch=12), aux_ids=None, draft_vocab=256,
                  train=TrainOptions(epochs=2, batch=4, save_every=2), eval_prompts=2, eval_tokens=12)


def recipe_json(recipe: PairRecipe) -> dict:
    """``recipe`` as its manifest stores it (JSON types: tuples become lists)."""
    return json.loads(json.dumps(asdict(recipe)))


def with_target_defaults(training: dict | None) -> dict:
    """A target's recorded ``training`` settings with the fields added to :class:`TargetTraining` since it was made
    taking their defaults (so an older target is still the recipe's); ``{"steps": None}`` for none recorded."""
    return {**json.loads(json.dumps(asdict(TargetTraining()))), **(training or {"steps": None})}


def recorded_training(target: Path) -> dict | None:
    """The training settings the target in ``target`` records (:func:`with_target_defaults`); None: no target."""
    made = read_json(target / "MANIFEST.json")
    return with_target_defaults(made.get("training")) if made else None


def recipe_changes(manifest: dict, recipe: PairRecipe) -> list[str]:
    """The fields of ``recipe`` (``target``, ``train``, ...) that a pair's manifest records otherwise; [] if none."""
    made = dict(manifest.get("recipe") or {})
    if "target" in made:
        made["target"] = with_target_defaults(made["target"])
    return sorted(k for k, v in recipe_json(recipe).items() if made.get(k) != v)


def with_target(recipe: PairRecipe, source: Path) -> PairRecipe:
    """``recipe`` with the training settings recorded in the trained target ``source`` (its MANIFEST.json).

    Raises:
        KimiError: ``source`` has no manifest recording them (not written by ``kimi models train-target``).
    """
    training = (read_json(source / "MANIFEST.json") or {}).get("training")
    if not training:
        raise KimiError(f"{source} is not a target written by `kimi models train-target` (no MANIFEST.json with "
                        "its training settings)")
    known = {f.name for f in fields(TargetTraining)}
    return replace(recipe, target=TargetTraining(**{k: v for k, v in with_target_defaults(training).items()
                                                    if k in known}))


def place_target(source: Path, target: Path) -> None:
    """Copy the trained target ``source`` to ``target`` (atomically), unless the same one is already there.

    Raises:
        KimiError: ``source`` has no MANIFEST.json (not a trained target, or not there).
    """
    wanted = read_json(source / "MANIFEST.json")
    if not wanted:
        raise KimiError(f"{source} is not a trained target (no MANIFEST.json): name the folder written by "
                        "`kimi models train-target` or `pick-target`")
    if read_json(target / "MANIFEST.json") == wanted:
        return
    copy_folder(source, target)
    say(f"target: {source} copied to {target}")


#: What a pair folder holds while it is trained (before its MANIFEST.json is written).
PAIR_PARTS = ("target", "work", "drafter")


def check_pair_folder(out: Path, force: bool) -> None:
    """Refuse ``out`` when its MANIFEST.json is another command's (without ``OUTPUT_KEYS["train-pair"]``), or, with
    ``force`` (which removes what it holds), when it holds no manifest and something else than a pair being trained
    (:data:`PAIR_PARTS`).

    Raises:
        KimiError: from ``check_replaceable``, with the way out.
    """
    foreign = force and out.is_dir() and any(item.name not in PAIR_PARTS for item in out.iterdir())
    if (out / "MANIFEST.json").exists() or foreign:
        check_replaceable(out, "MANIFEST.json", True, marker_keys=OUTPUT_KEYS["train-pair"])


def train_pair(out: Path, recipe: PairRecipe | None = None, force: bool = False, tiny: bool = False,
               target_from: Path | None = None) -> dict:
    """Make (or finish) the pair in ``out``; returns its manifest.

    A complete pair (``MANIFEST.json``) made with this recipe is kept. One made with another recipe is left as it
    is unless ``force`` (the shipped pair's files are never replaced by a run that merely names another recipe).
    ``force`` trains the pair again; ``target/`` is kept when the recipe's target settings are those it was made
    with (a target trained on a GPU is not trained again on a CPU), or when it is ``target_from``.
    ``target_from``: a target trained elsewhere (``kimi models train-target``, picked by ``pick-target``) to
    use as ``target/``; the recipe then takes its recorded training settings. It may not lie inside ``out``
    other than as ``out/target``.

    Raises:
        KimiError: a complete pair made with another recipe (without ``force``), a ``target_from`` inside ``out``,
            a ``target/`` trained with other settings than the recipe's, or an ``out`` that is not a pair
            (:func:`check_pair_folder`).
    """
    recipe = recipe or (TINY if tiny else PairRecipe())
    check_pair_folder(out, force)
    if target_from is not None:
        source, inside = target_from.resolve(), out.resolve()
        if inside in source.parents and source != inside / "target":
            raise KimiError(f"--target {target_from} lies inside {out}, which the pair's training rewrites: move it "
                            "out of there first")
        recipe = with_target(recipe, target_from)
    done = read_json(out / "MANIFEST.json")
    changed = recipe_changes(done, recipe) if done else []
    if changed and not force:
        raise KimiError(f"the pair in {out} was made with another recipe (it differs in: {', '.join(changed)}); "
                        "nothing was changed. Name the recipe it was made with (the shipped pair: --recipe h200 "
                        "--target models/pair/target) or another folder; --force trains its drafter again "
                        "(and its target too where the target settings differ)")
    keep_target = recorded_training(out / "target") == recipe_json(recipe)["target"] or (
        target_from is not None and (out / "target").resolve() == target_from.resolve())
    if force and out.exists():
        for item in out.iterdir():
            if not (keep_target and item.name == "target"):
                shutil.rmtree(item) if item.is_dir() else item.unlink()
    elif done:
        say(f"the trained pair in {out} is complete (MANIFEST.json)")
        return done
    times: dict[str, float] = {}
    started = time.monotonic()
    target, work, drafter = out / "target", out / "work", out / "drafter"
    if target_from is not None:
        place_target(target_from, target)
    if not (target / "MANIFEST.json").is_file():
        train_target(target, cfg=recipe.target, force=True)
    made = recorded_training(target)
    if made != recipe_json(recipe)["target"]:
        raise KimiError(f"{target} was trained with other settings than this recipe's target ({made} vs "
                        f"{recipe_json(recipe)['target']}); remove {target} or pass --force to train it again")
    target_manifest = read_json(target / "MANIFEST.json")
    times["target_s"] = time.monotonic() - started
    regenerate(work, str(target), recipe.regenerate)
    times["regenerate_s"] = time.monotonic() - started - sum(times.values())
    capture(work, str(target), list(recipe.aux_ids) if recipe.aux_ids else None)
    times["capture_s"] = time.monotonic() - started - sum(times.values())
    vocab = build_vocab(work, json.loads((target / "config.json").read_text())["vocab_size"], recipe.draft_vocab)
    ckpt = work / "train" / "checkpoint.pt"
    metrics = train(work, str(target), recipe.train, resume=ckpt.exists())
    times["train_s"] = time.monotonic() - started - sum(times.values())
    export(work, drafter, str(target), force=True)
    prompts = tokenize(str(target), code_prompts(recipe.eval_prompts))
    served = served_acceptance(str(target), str(drafter), prompts, k=3, max_tokens=recipe.eval_tokens)
    times["serve_s"] = time.monotonic() - started - sum(times.values())
    report(work, served)
    manifest = {"recipe": recipe_json(recipe), "seconds": {k: round(v, 1) for k, v in times.items()},
                "target_final_loss": target_manifest["final_loss"],
                "target_heldout_loss": target_manifest.get("heldout_loss"), "vocab": vocab,
                "train_last": metrics, "served": {k: v for k, v in served.items() if k != "tokens"},
                "aux_layer_ids": read_json(work / "capture" / "index.json")["aux_layer_ids"],
                "files": pair_digests(out)}
    write_atomic(out / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"trained pair in {out}: target loss {manifest['target_final_loss']:.3f}, served tau {served['tau']:.2f} "
        f"(k = 3, per position {', '.join(f'{p:.2f}' for p in served['per_position'])})")
    return manifest
