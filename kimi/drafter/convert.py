"""``kimi drafter convert SRC DST``: a vLLM-ready copy of an EAGLE-3 drafter.

The copy states its aux layer ids explicitly and in vLLM's convention:
top-level ``eagle_aux_hidden_state_layer_ids`` (state entering layer k),
``eagle_aux_hidden_state_layer_ids_convention: layer_input``,
``num_aux_hidden_states``, and no nested ids left to be misread.  A
speculators checkpoint becomes the Llama-style layout (``transformer_layer_config``
flattened, ``LlamaForCausalLMEagle3``, ``layers.0.*`` renamed ``midlayer.*``; its ``auto_map`` and the
``config.py`` it names, speculators' own config class, left out).
Where the source has no ids, the target's depth decides them (``--target``). A config without
``architectures`` gets the drafter class its fields ask for. Weights in ``.bin`` / ``.pt`` files are written
as safetensors (``pytorch_model*.bin`` -> ``model*.safetensors``). Nothing is dropped silently: every config
key the copy changes or leaves out is recorded with its old value under ``kimi_converted_from.replaced``,
and the files left out are listed under ``files_left_out`` and printed.

DST is written into a temporary folder beside it and renamed into place, so
it either exists complete or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from kimi.drafter.checkpoint import SAFETENSORS_INDEX, Checkpoint, read_config
from kimi.drafter.conventions import CONVENTION_FIELD, CONVENTIONS, IDS_FIELD, LAYER_INPUT, AuxIds
from kimi.drafter.inspect import CONVERT_BLOCKING, Report, architectures, default_architecture, inspect
from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, default_mode, staged_folder, write_atomic

#: The config key a converted copy records its source in: what marks a folder as an earlier conversion.
CONVERTED_FROM = "kimi_converted_from"
_SPECULATORS_KEYS = ("speculators_model_type", "speculators_config", "speculators_version", "transformer_layer_config",
                     "auto_map")


def _remote_code_files(cfg: dict) -> set[str]:
    """The local Python files a config's ``auto_map`` names (``config.Eagle3SpeculatorConfig`` -> ``config.py``)."""
    auto_map = cfg.get("auto_map")
    refs = auto_map.values() if isinstance(auto_map, dict) else []
    return {f"{ref.rsplit('.', 1)[0]}.py" for ref in refs if isinstance(ref, str) and "." in ref and "--" not in ref}


def _converted_config(cfg: dict, report: Report, ids: list[int]) -> dict:
    if report.format == "speculators":
        out = dict(cfg.get("transformer_layer_config") or {})
        for key, value in cfg.items():
            if key not in _SPECULATORS_KEYS and key not in ("architectures", "model_type"):
                out[key] = value
        out["architectures"] = ["LlamaForCausalLMEagle3"]
        out.setdefault("model_type", "llama")
    else:
        out = dict(cfg)
        if not architectures(cfg):
            out["architectures"] = [default_architecture(cfg)]
    nested = out.get("eagle_config")
    if isinstance(nested, dict):
        out["eagle_config"] = {k: v for k, v in nested.items() if k != IDS_FIELD}
    out[IDS_FIELD] = ids
    out[CONVENTION_FIELD] = LAYER_INPUT
    out["num_aux_hidden_states"] = len(ids)
    out[CONVERTED_FROM] = {"format": report.format, "ids_written": report.as_dict()["aux_layer_ids_written"],
                           "field": report.aux.where, "convention": report.aux.convention,
                           "replaced": {k: v for k, v in cfg.items() if out.get(k, _ABSENT) != v}}
    return out


_ABSENT = object()


def _safetensors_name(name: str) -> str:
    """The safetensors file a torch weight file becomes (``pytorch_model-00001-of-00002.bin`` ->
    ``model-00001-of-00002.safetensors``)."""
    stem = name.rsplit(".", 1)[0]
    return ("model" + stem[len("pytorch_model"):] if stem.startswith("pytorch_model") else stem) + ".safetensors"


def _copy_weights(ckpt: Checkpoint, dst: Path, rename: bool, leave_out: set[str]) -> list[str]:
    """Copy the checkpoint's files but ``leave_out`` into ``dst``; weight files in torch's formats, and every weight
    file when renaming ``layers.0.`` to ``midlayer.`` (speculators), are written as safetensors, with an index when
    there are several (their old indexes are not copied). Returns the names of the source files not copied."""
    from safetensors.torch import save_file

    def renamed(name: str) -> str:
        return f"midlayer.{name[len('layers.0.'):]}" if rename and name.startswith("layers.0.") else name

    rewrite = [f for f in ckpt.files if rename or f.suffix != ".safetensors"]
    weight_map, skipped = {}, []
    for file in rewrite:
        out = _safetensors_name(file.name)
        tensors = {renamed(k): v.contiguous().clone() for k, v in ckpt.load(file).items()}
        save_file(tensors, str(dst / out), metadata={"format": "pt"})
        os.chmod(dst / out, default_mode())  # safetensors writes 0600
        weight_map.update(dict.fromkeys(tensors, out))
    for file in sorted(ckpt.path.iterdir()):
        if file.name == "config.json" or file in rewrite or not file.is_file():
            continue
        if file.name in leave_out or (rewrite and file.name.endswith(".index.json")):
            skipped.append(file.name)
        else:
            shutil.copy2(file, dst / file.name)
    if len(rewrite) > 1:
        write_atomic(dst / SAFETENSORS_INDEX, json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    return skipped


def convert(src: Path, dst: Path, target: Path | None = None, convention: str | None = None,
            force: bool = False) -> Report:
    """Write the vLLM-ready drafter; returns the inspection of the source.

    Args:
        src: the drafter checkpoint folder.
        dst: the folder to create, outside ``src``; an existing one is only
            replaced with ``force`` and only if it is an earlier conversion
            (its config.json has :data:`CONVERTED_FROM`).
        target: target folder or config.json; needed when the source has no ids,
            and checks the ids against the target's depth.
        convention: the convention of the written ids (``layer_input`` or
            ``layer_output``), overriding detection; required when detection
            can only guess.
        force: replace an existing ``dst``.

    Raises:
        KimiError: ``dst`` is in the way, the ids cannot be decided, the
            drafter has blocking problems (listed), or writing fails (nothing
            is left behind).
    """
    check_replaceable(dst, "config.json", force, keep=(src, Path.cwd()), marker_keys=(CONVERTED_FROM,))
    if convention is not None and convention not in CONVENTIONS:
        raise KimiError(f"--convention must be one of {', '.join(CONVENTIONS)}")
    report = inspect(src, target)
    if convention is not None and report.aux.written is not None:
        report.aux = AuxIds(report.aux.written, report.aux.where, convention, f"--convention {convention}")
        report.findings = [f for f in report.findings if f.kind != "convention"]
    try:
        ids = report.aux.vllm_ids(report.target["num_layers"] if report.target else None)
    except ValueError as exc:
        raise KimiError(str(exc)) from None
    blocking = report.blocking()
    if blocking:
        raise KimiError("the drafter cannot be converted as it is:\n  "
                        + "\n  ".join(f"{f.text}\n    fix: {f.fix}" for f in blocking))
    if ids is None:
        raise KimiError(f"{src} names no aux layer ids: pass --target so that the target's depth decides them")
    for problem in report.findings:
        if problem.kind not in CONVERT_BLOCKING:
            print(f"kimi drafter convert: warning: {problem.text} (fix: {problem.fix})", file=sys.stderr)

    try:
        with staged_folder(dst) as staging:
            source = read_config(src)
            speculators = report.format == "speculators"
            left_out = _copy_weights(Checkpoint.open(src), staging, rename=speculators,
                                     leave_out=_remote_code_files(source) if speculators else set())
            config = _converted_config(source, report, list(ids))
            config[CONVERTED_FROM]["files_left_out"] = left_out
            write_atomic(staging / "config.json", json.dumps(config, indent=2) + "\n")
    except KimiError:
        raise
    except Exception as exc:  # safetensors errors while rewriting a shard
        raise KimiError(f"converting {src} failed: {exc}; nothing was written") from None
    replaced = config[CONVERTED_FROM]["replaced"]
    if replaced or left_out:
        print(f"kimi drafter convert: kept under {CONVERTED_FROM} in {dst / 'config.json'}: the old values of "
              f"{', '.join(replaced) or 'no config key'}; left out {', '.join(left_out) or 'no file'}", file=sys.stderr)
    print(f"kimi drafter convert: wrote {dst} (aux layer ids {list(ids)}, {LAYER_INPUT})", file=sys.stderr)
    return report
