"""EAGLE-3 drafter checks run by vLLM's ``SpeculativeConfig`` before any weight loads.

Reached through the hook :mod:`kimi.hooks.eagle3_drafter_checks` (patch ``0004-eagle3-drafter-checks``, one call in
``vllm/config/speculative.py``).  For ``method: eagle3`` it:

1. decides the aux layer ids in vLLM's convention (``kimi.drafter.conventions``):
   ids written as "output of layer k" are translated and the log says so; a
   drafter without ids gets vLLM's defaults made distinct for shallow targets,
   logged loudly with the ids used;
2. runs ``kimi drafter inspect``'s checks against the target as vLLM has
   configured it: the weight files vLLM would load (safetensors, sharded with or
   without an index, ``.bin``, ``.pt``) found and read, no tensor in two of them;
   ids in range (``0..L``: ``L`` is the last layer's output), not repeated, one
   source only, as many as the drafter's ``fc`` takes; the drafter's target hidden size and
   vocabulary; ``d2t`` within the target vocabulary; every tensor against the
   shape its config gives it, and tensors vLLM would serve uninitialised,
   reject or drop (:mod:`kimi.drafter.layout`; ``docs/drafter-assumptions.md``);
   a ``t2d`` that disagrees is only logged (vLLM never reads it);
3. raises the drafter's ``max_position_embeddings`` to the served context
   where its RoPE only caches positions, or fails clearly where it does not;
4. writes the ids to the draft config's top-level
   ``eagle_aux_hidden_state_layer_ids`` and ``num_aux_hidden_states``, which
   both of vLLM's model runners and the drafter's ``fc`` read.

Every failure is a ``DrafterConfigError`` (a ``ValueError``) naming each problem
with the fix for its own cause, raised seconds into start-up instead
of as a shape error after the target's weights have loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimi.drafter.checkpoint import Checkpoint, read_config
from kimi.drafter.conventions import LAYER_OUTPUT
from kimi.drafter.inspect import Report, Target, architectures_findings, detect_format, inspect_checkpoint
from kimi.errors import KimiError
from kimi.fork.release import upstream_release


class DrafterConfigError(ValueError):
    """The EAGLE-3 drafter does not fit the target; the message names the fix."""


# Findings that stop start-up; a guessed convention is read literally (as upstream does) with a
# warning, an unknown layout is left to vLLM's own loader, and a bad t2d (which vLLM never reads) is a warning.
SERVE_BLOCKING = ("config", "architectures", "ids", "conflict", "shape", "vocab", "rope", "weights")

#: ``model_type`` of the targets whose decoder is vLLM's ``DeepseekV2Model`` (DeepSeek-V2/V3/R1/V3.2, Kimi-K2, and
#: the text model of Kimi-K2.5), which in the v0.32 line's vLLM does not pass aux states from one pipeline stage to the
#: next.
DEEPSEEK_DECODERS = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"})


def _logger():
    from vllm.logger import init_logger

    return init_logger("vllm.kimi.eagle3")


def dummy_load(spec_config: Any) -> bool:
    """Whether the drafter's weights will be drawn at random (``load_format=dummy``), so that a folder without
    weight files is served: the draft load config says so, or the target is a local folder without weight files
    too (the target's load config is not passed to the speculative config; :mod:`kimi.models.kimi_slice` pairs)."""
    from kimi.drafter.checkpoint import weight_files

    load = getattr(spec_config, "draft_load_config", None)
    if load is not None:
        return str(getattr(load, "load_format", "")) == "dummy"
    target = Path(str(spec_config.target_model_config.model))
    try:
        return target.is_dir() and not weight_files(target)
    except KimiError:
        return False


def _checkpoint(model: str, revision: str | None, hf_config: Any) -> Checkpoint:
    """The drafter's folder (local path, or the Hugging Face cache's snapshot, no download);
    config-only from ``hf_config`` when the files are not on this machine yet."""
    path = Path(model)
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model, revision=revision, local_files_only=True))
        except Exception:  # not cached: vLLM downloads it later; check the config alone
            return Checkpoint(path=Path(model), config=hf_config.to_dict())
    try:
        return Checkpoint.open(path)
    except KimiError as exc:
        raise DrafterConfigError(f"EAGLE-3 drafter {model}: {exc}") from None


def check_drafter_architectures(model: str) -> None:
    """Refuse the EAGLE-3 drafter folder ``model`` when its ``config.json`` names no (or malformed)
    ``architectures``, before vLLM builds the draft config from it: a Llama-style one would make ``update_arch_``
    list every class vLLM has, an MLA one fails in ``hf_config_override`` with a ``TypeError`` (called by patch 0004;
    :func:`kimi.drafter.inspect.architectures_findings`). A drafter not on this machine is left to vLLM.

    Raises:
        DrafterConfigError: the problem and its fix.
    """
    path = Path(model)
    if not (path / "config.json").is_file():
        return
    try:
        config = read_config(path)
    except KimiError as exc:
        raise DrafterConfigError(f"EAGLE-3 drafter {model}: {exc}") from None
    problems = architectures_findings(config, detect_format(Checkpoint(path=path, config=config))[0])
    if problems:
        raise DrafterConfigError(f"EAGLE-3 drafter {model}: {problems[0].text}. Fix: {problems[0].fix}.")


def prepare_eagle3_drafter(spec_config: Any) -> tuple[int, ...]:
    """Check and fix up the EAGLE-3 drafter of ``spec_config`` (see module docstring).

    The checks are ``kimi drafter inspect``'s, against the target as vLLM has
    configured it (layers, hidden size, vocabulary, ``max_model_len``).

    Args:
        spec_config: ``vllm.config.SpeculativeConfig`` with ``method == "eagle3"``,
            its ``draft_model_config`` and ``target_model_config`` built.

    Returns:
        The aux layer ids (vLLM convention) the target will capture.

    Raises:
        DrafterConfigError: each problem with its own fix: weight files vLLM would not find or that
            name a tensor twice, two id sources that disagree, a config without ``architectures``,
            malformed or unusable ids (out of range, repeated,
            not matching the drafter's ``fc``), a drafter made for another
            hidden size or vocabulary, a bad ``d2t``, tensors that do not fit
            the config or that vLLM would serve uninitialised, reject or drop
            (:func:`kimi.drafter.layout.findings`), a RoPE that cannot cover
            the served context, or pipeline parallelism on a DeepSeek-V3 /
            Kimi target (:func:`check_pipeline_parallel`).
    """
    log = _logger()
    draft, target_config = spec_config.draft_model_config, spec_config.target_model_config
    hf, text = draft.hf_config, target_config.hf_text_config
    name = draft.model
    check_pipeline_parallel(spec_config)
    target = Target(num_layers=int(text.num_hidden_layers), hidden_size=int(text.hidden_size),
                    vocab_size=int(text.vocab_size), max_positions=None, model_type=str(text.model_type))
    served = int(target_config.max_model_len)
    report = inspect_checkpoint(_checkpoint(name, getattr(draft, "revision", None), hf), target, served)
    problems = [f for f in report.blocking(SERVE_BLOCKING) if not (f.kind == "weights" and dummy_load(spec_config))]
    if problems:
        aux = report.aux
        written = f" (aux layer ids {list(aux.written)} in {aux.where}, {aux.convention})" if aux.written else ""
        causes = " ".join(f"({n}) {f.text}. Fix: {f.fix}." for n, f in enumerate(problems, 1))
        raise DrafterConfigError(
            f"EAGLE-3 drafter {name} does not fit the {target.num_layers}-layer target {target_config.model}"
            f"{written}: {causes} `kimi drafter inspect {name} --target {target_config.model}` shows what was found."
        )
    check_lm_head_quantization(spec_config, report)
    for warning in report.blocking(("convention", "format", "t2d")):
        log.warning("EAGLE-3 drafter %s: %s. Fix: %s.", name, warning.text, warning.fix)
    ids = tuple(report.aux_layer_ids)
    aux = report.aux
    if aux.written is None:
        log.warning_once(
            "EAGLE-3 drafter %s names no aux layer ids: using the defaults %s for the %d-layer target. If the "
            "drafter was trained on other layers, acceptance collapses without an error; write the ids with "
            "`kimi drafter convert`.", name, str(list(ids)), target.num_layers)
    elif aux.convention == LAYER_OUTPUT:
        log.warning_once(
            "EAGLE-3 drafter %s: aux layer ids %s in %s are 'output of layer k' (%s); translated to vLLM's "
            "'state entering layer k' ids %s.", name, str(list(aux.written)), aux.where, aux.evidence,
            str(list(ids)))
    else:
        log.info("EAGLE-3 drafter %s: aux layer ids %s (%s).", name, list(ids), aux.evidence)
    hf.eagle_aux_hidden_state_layer_ids = list(ids)
    hf.num_aux_hidden_states = len(ids)
    own = report.rope["max_position_embeddings"]
    if own is not None and own < served and report.rope["cache_only"]:  # a short length-dependent one blocks
        log.warning("EAGLE-3 drafter %s: max_position_embeddings %d < served context %d; its %s RoPE depends only "
                    "on the position, so its length is raised to %d.", name, own, served, report.rope["rope_type"],
                    served)
        hf.max_position_embeddings = served
    return ids


def deepseek_relays_aux_states() -> bool:
    """Whether the installed vLLM's ``DeepseekV2Model`` joins the V2 runner's relay of aux states between pipeline
    stages (``EagleModelMixin.supports_aux_hidden_states_over_pp``: the mainline's vLLM with patch 0022; Llama and Qwen2
    upstream): then both runners' checks pass and EAGLE-3 at ``pipeline_parallel_size > 1`` is served anywhere."""
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    return bool(getattr(DeepseekV2Model, "supports_aux_hidden_states_over_pp", False))


def check_lm_head_quantization(spec_config: Any, report: Report) -> None:
    """Refuse ``draft_lm_head_quantization`` (an option since the mainline's vLLM) for a drafter whose own ``lm_head``
    covers a draft vocabulary other than the target's, before anything loads.

    The option quantizes a copy of the target's ``lm_head`` and installs it on a drafter that shares the target's
    head; vLLM decides sharing only after both models' weights are loaded (``share_target_lm_head``,
    ``v1/worker/gpu/spec_decode/eagle/utils.py``) and then fails with "draft_lm_head_quantization needs a drafter
    that shares the target lm_head". A head with other rows than the target's can never be shared.

    Raises:
        DrafterConfigError: the option is set and the draft vocabulary differs from the target's.
    """
    quantization = getattr(spec_config, "draft_lm_head_quantization", None)
    draft, target = report.draft_vocab_size, report.target_vocab_size
    if quantization is None or draft is None or target is None or draft == target:
        return
    raise DrafterConfigError(
        f"EAGLE-3 drafter {spec_config.draft_model_config.model}: draft_lm_head_quantization={quantization!r} "
        f"quantizes the target's lm_head for a drafter that shares it, but this drafter has its own lm_head over "
        f"a draft vocabulary of {draft} ids (target: {target}); vLLM would fail only after loading both models' "
        "weights. Fix: leave draft_lm_head_quantization out of --speculative-config."
    )


def check_pipeline_parallel(spec_config: Any) -> None:
    """Refuse EAGLE-3 with ``pipeline_parallel_size > 1`` on a target whose decoder is ``DeepseekV2Model``
    (:data:`DEEPSEEK_DECODERS`) where the fork has not made it work, before anything loads: everywhere but vLLM's
    CPU backend.

    Upstream (the v0.32 line's vLLM) fails there in both model runners, and only after the target's weights are loaded:
    the V2 runner (the default on CUDA) raises "DeepseekV3ForCausalLM does not support eagle3 with pipeline parallelism"
    (``verify_supports_aux_hidden_states_over_pp``, ``vllm/v1/worker/gpu/model_runner.py``: ``DeepseekV2Model`` does
    not relay the aux states of earlier stages, vllm#45985), and the V1 runner (every CPU engine) builds the drafter
    on the last stage only and dies on the others with "'CPUModelRunner' object has no attribute 'drafter'"
    (vllm#30436, open). Patch ``0022-eagle3-pipeline-parallel`` (:mod:`kimi.hooks.eagle3_pipeline_parallel`) makes
    the V1 runner serve it, lossless against one stage, and is run on CPU only: on a GPU the V2 runner is vLLM's
    default and the V1 path is untested here (it needs two GPUs).

    Raises:
        DrafterConfigError: the message names the layout and the fix (one pipeline stage on GPUs).
    """
    parallel = spec_config.target_parallel_config
    stages = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
    target_config = spec_config.target_model_config
    model_type = str(getattr(target_config.hf_text_config, "model_type", ""))
    if stages <= 1 or model_type not in DEEPSEEK_DECODERS or deepseek_relays_aux_states():
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # the V1 runner with the aux states relayed (patch 0022)
        return
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    raise DrafterConfigError(
        f"EAGLE-3 with pipeline_parallel_size={stages} on the {model_type} target {target_config.model}: vLLM "
        f"{upstream_release()} cannot serve it on GPUs and would fail only after loading the target's weights (its "
        "DeepSeek decoder does not pass the aux states of earlier pipeline stages to the drafter, vllm#45985, and the "
        "V1 model runner has no drafter on the earlier stages, vllm#30436; the fork serves it on CPU only, patch "
        f"0022). Fix: serve with --pipeline-parallel-size 1 and spread the model with tensor parallelism instead "
        f"(--tensor-parallel-size {tp * stages} over the same GPUs, across nodes if need be), or leave out "
        "--speculative-config."
    )
