"""Our Llama-style EAGLE-3 drafter as other tools write it: speculators and SpecForge checkpoints.

* **speculators** (``vllm-project/speculators`` on the package index, 0.9.0): its own EAGLE-3 converter runs
  (``speculators.convert.entrypoints.convert_model``, what ``speculators convert --algorithm eagle3`` calls).
  It writes ``speculators_model_type: eagle3``, a ``transformer_layer_config`` (a ``LlamaConfig``),
  ``speculators_config`` naming the verifier, ``auto_map`` onto a ``config.py`` holding speculators' config
  class, and ``layers.0.*`` for ``midlayer.*``. Its ids are top-level in vLLM's convention, which vLLM's
  ``update_eagle3`` copies literally; the converter does not read the source's ids, so they are passed
  (``--algorithm-kwargs '{"eagle_aux_hidden_state_layer_ids": [...]}'``), and so is ``norm_before_residual``
  (vLLM reads a speculators config without it as ``True``).
* **SpecForge** (``sgl-project/SpecForge``; it pins torch 2.11, transformers 5.8.1 and sglang 0.5.14, so it is
  not run here): our writer of its export layout, as read in ``specforge/export/to_sglang.py``,
  ``specforge/export/checkpoint_io.py``, ``specforge/modeling/draft/llama3_eagle.py``,
  ``specforge/data/preprocessing.py``, ``specforge/algorithms/model_providers.py`` and
  ``configs/deepseek-v3-671b-eagle3.json`` (commit a6b6b02). The config is the training config
  saved by transformers' ``LlamaConfig.save_pretrained`` (``architectures: [LlamaForCausalLMEagle3]``,
  ``draft_vocab_size``, ``dtype``, ``rope_parameters``) with ``rope_theta`` mirrored to the top level
  (``apply_legacy_rope_scaling``) and the ids nested as ``eagle_config.eagle_aux_hidden_state_layer_ids``
  in the "output of layer k" convention next to ``use_aux_hidden_state: true`` (SpecForge's default
  ``[1, L // 2 - 1, L - 4]`` is vLLM's ``(2, L // 2, L - 3)``). The weights keep the draft module's names
  (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, the int64 ``d2t`` offsets and the bool ``t2d`` mask:
  the sglang export's weight map is the identity), embeddings dropped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kimi.drafter.checkpoint import Checkpoint
from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD, read_aux_ids
from kimi.drafter.inspect import detect_format
from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, default_mode, staged_folder, write_atomic

#: Keys SpecForge's sglang export requires in a draft checkpoint (``_REQUIRED_SERVING_KEYS`` in ``to_sglang.py``).
SPECFORGE_REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", "t2d", "d2t")
_OUR_ID_KEYS = (IDS_FIELD, CONVENTION_FIELD, "num_aux_hidden_states")


def _llama_drafter(drafter: Path) -> tuple[Checkpoint, tuple[int, ...]]:
    """The opened Llama-style drafter and its aux ids in vLLM's convention.

    Raises:
        KimiError: another layout, or no ids written.
    """
    ckpt = Checkpoint.open(drafter)
    fmt, evidence = detect_format(ckpt)
    if fmt != "eagle3-llama":
        raise KimiError(f"{drafter} is a {fmt} drafter ({evidence}); a Llama-style EAGLE-3 drafter is needed")
    ids = read_aux_ids(ckpt.config).vllm_ids(None)
    if ids is None:
        raise KimiError(f"{drafter} names no aux layer ids: `kimi drafter convert --target` writes them")
    return ckpt, ids


def speculators_checkpoint(drafter: Path, target: Path, dst: Path, force: bool = False) -> Path:
    """Convert our Llama-style ``drafter`` with speculators' own EAGLE-3 converter into ``dst``; returns ``dst``.

    Raises:
        KimiError: speculators is not installed, the drafter is not Llama-style or has no ids, or ``dst``
            is in the way (with ``force`` too, unless it is an earlier speculators checkpoint).
    """
    try:
        from speculators.convert.entrypoints import convert_model
    except ImportError as exc:
        raise KimiError(f"speculators is not importable ({exc}): `.venv/bin/pip install --no-deps speculators` "
                        "and its missing dependencies (docs/drafters.md)") from None
    ckpt, ids = _llama_drafter(drafter)
    check_replaceable(dst, "config.json", force, keep=(drafter, target, Path.cwd()),
                      marker_keys=("speculators_config",))
    with staged_folder(dst) as staging:
        convert_model(model=str(drafter), verifier=str(target), algorithm="eagle3", output_path=str(staging),
                      eagle_aux_hidden_state_layer_ids=list(ids),
                      norm_before_residual=bool(ckpt.config.get("norm_before_residual", False)))
    return dst


def _legacy_rope(config: dict) -> dict:
    """SpecForge's ``apply_legacy_rope_scaling``: ``rope_theta`` (and a non-default ``rope_scaling``) mirrored from
    transformers 5's ``rope_parameters`` for serving stacks that read only the old fields."""
    params = config.get("rope_parameters") or {}
    if "rope_theta" in params:
        config["rope_theta"] = params["rope_theta"]
    kind = params.get("rope_type", params.get("type"))
    if params and not config.get("rope_scaling") and kind not in (None, "default"):
        config["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return config


def specforge_checkpoint(drafter: Path, dst: Path, force: bool = False) -> Path:
    """Write our Llama-style ``drafter`` in SpecForge's export layout (module docstring) into ``dst``; returns ``dst``.

    Raises:
        KimiError: the drafter is not Llama-style, has no ids, uses id 0 (the embedding output, which
            "output of layer k" cannot name), lacks a tensor SpecForge's export requires, or ``dst`` is in the way
            (with ``force`` too, unless it is an earlier SpecForge layout: an ``eagle_config``).
    """
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    ckpt, ids = _llama_drafter(drafter)
    if 0 in ids:
        raise KimiError(f"aux layer ids {list(ids)} use id 0 (the embedding output): SpecForge's "
                        "\"output of layer k\" ids cannot name it")
    missing = [name for name in SPECFORGE_REQUIRED if name not in ckpt.tensors]
    if missing:
        raise KimiError(f"{drafter} lacks {', '.join(missing)}, which SpecForge's export requires")
    config = {k: v for k, v in ckpt.config.items() if k not in _OUR_ID_KEYS}
    config["eagle_config"] = {**(config.get("eagle_config") or {}), IDS_FIELD: [i - 1 for i in ids],
                              "use_aux_hidden_state": True}
    check_replaceable(dst, "config.json", force, keep=(drafter, Path.cwd()), marker_keys=("eagle_config",))
    tensors = {}
    for file in ckpt.files:
        tensors.update({k: v for k, v in ckpt.load(file).items() if "embed" not in k.lower()})
    with staged_folder(dst) as staging:
        LlamaConfig.from_dict(config).save_pretrained(str(staging))
        saved = json.loads((staging / "config.json").read_text())
        write_atomic(staging / "config.json", json.dumps(_legacy_rope(saved), indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(staging / "model.safetensors", default_mode())  # safetensors writes 0600
    return dst
