"""``kimi drafter inspect``: what a published EAGLE-3 drafter is, and what would go wrong serving it.

Reads ``config.json`` and safetensors headers only (plus the small ``d2t`` /
``t2d`` maps).  Formats recognised (DESIGN.md, "Public drafters"):

* ``eagle3-llama`` - EAGLE / SpecForge Llama-style: ``LlamaForCausalLMEagle3``,
  ``midlayer.*``, ``fc``, ``norm``, ``lm_head`` over a draft vocabulary, ``d2t``, ``t2d``;
* ``speculators`` - ``speculators_model_type`` with ``transformer_layer_config``,
  ``layers.0.*`` tensors, top-level ids;
* ``modelopt`` - NVIDIA Model Optimizer export (nested ``eagle_config`` with
  modelopt keys, or ``hf_quant_config.json``);
* ``eagle3-mla`` - ``Eagle3DeepseekV3ForCausalLM`` with an MLA attention layer.

Vocabulary maps (EAGLE-3 reference layout): ``d2t`` holds int64 offsets, so a
draft id ``i`` maps to target id ``i + d2t[i]``; ``t2d`` is a bool mask over
the target vocabulary with one true entry per draft id (vLLM never reads it).
The tensors are held against what vLLM builds from the config by
:mod:`kimi.drafter.layout`; ``docs/drafter-assumptions.md`` lists every check
with what upstream vLLM does without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kimi.drafter import layout
from kimi.drafter.checkpoint import Checkpoint, read_config, text_config
from kimi.drafter.conventions import LAYER_OUTPUT, AuxIds, check_ids, conflicting_ids, read_aux_ids
from kimi.drafter.findings import Finding, finding
from kimi.errors import KimiError
from kimi.fork.release import upstream_release

FORMATS = ("eagle3-llama", "speculators", "modelopt", "eagle3-mla")
# (not ``use_aux_hidden_state``: SpecForge writes it too, configs/deepseek-v3-671b-eagle3.json)
_MODELOPT_KEYS = {"use_input_layernorm_in_first_layer", "use_last_layernorm", "eagle_decoder_type",
                  "use_mtp_layernorm"}
# RoPE variants whose frequencies do not depend on max_position_embeddings: raising it only
# lengthens the cos/sin cache (vllm/model_executor/layers/rotary_embedding: default, linear, llama3).
CACHE_ONLY_ROPE = (None, "default", "linear", "llama3")
# Findings that stop `kimi drafter convert` (the rest are warnings).
CONVERT_BLOCKING = ("config", "ids", "conflict", "shape", "vocab", "convention", "format", "weights")
_T2D_UNREAD = " (vLLM never reads t2d, so it serves the drafter; other servers may use it)"


def positive_int(value: object) -> int | None:
    """``value`` if it is a positive plain integer (not a bool, float or string), else None."""
    return value if type(value) is int and value > 0 else None


def describe_quantization(config: dict) -> str | None:
    """The target's weight quantization in words, from ``quantization_config`` (top level, else the text
    config's); None for an unquantized one. Reads vLLM's ``fp8`` (per block or per tensor) and
    ``compressed-tensors`` configs field by field; any other method is named as written."""
    quant = config.get("quantization_config") or text_config(config).get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method", "unknown"))
    if method == "fp8":
        block = quant.get("weight_block_size")
        scales = f"blocks {block[0]}x{block[1]}" if isinstance(block, list) and len(block) == 2 else "per tensor"
        return (f"fp8 {quant.get('fmt', 'e4m3')} weights, {scales}, "
                f"{quant.get('activation_scheme', 'dynamic')} activations")
    if method == "compressed-tensors":
        groups = []
        for group in (quant.get("config_groups") or {}).values():
            if not isinstance(group, dict):
                continue
            weights = group.get("weights") or {}
            size = f" {weights['group_size']}" if weights.get("group_size") else ""
            acts = "" if not group.get("input_activations") else ", quantized activations"
            groups.append(f"{weights.get('num_bits')}-bit {weights.get('type')} weights, "
                          f"{weights.get('strategy')}{size}{acts}")
        ignored = quant.get("ignore") or []
        return (f"compressed-tensors {quant.get('format')}: {'; '.join(groups) or 'no groups'}"
                + (f" ({len(ignored)} modules left unquantized)" if ignored else ""))
    return method


@dataclass
class Target:
    """What inspection needs of the target model."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    max_positions: int | None
    model_type: str
    quantization: str | None = None

    @classmethod
    def from_config(cls, config: dict, where: str) -> Target:
        """From a target's config dict (a multimodal wrapper's ``text_config`` is used).

        Raises:
            KimiError: a required field is missing or not a positive integer.
        """
        cfg = text_config(config)
        values = {}
        for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
            values[key] = positive_int(cfg.get(key))
            if values[key] is None:
                raise KimiError(f"target {where}: {key} must be a positive integer, not {cfg.get(key)!r}")
        return cls(num_layers=values["num_hidden_layers"], hidden_size=values["hidden_size"],
                   vocab_size=values["vocab_size"], max_positions=positive_int(cfg.get("max_position_embeddings")),
                   model_type=str(cfg.get("model_type", "")), quantization=describe_quantization(config))

    @classmethod
    def from_path(cls, path: Path) -> Target:
        return cls.from_config(read_config(path), str(path))


@dataclass
class Report:
    """The result of an inspection; ``as_dict`` is the ``--json`` form.

    ``findings`` are the problems (:class:`~kimi.drafter.findings.Finding`: kind, problem, fix); ``notes`` say
    where the fork serves the drafter otherwise than upstream vLLM would read it (translated or defaulted aux layer
    ids), which is not a problem.
    """

    path: str
    format: str
    format_evidence: str
    architecture: str
    model_type: str
    hidden_size: int | None
    target_hidden_size: int | None
    draft_vocab_size: int | None
    target_vocab_size: int | None
    vocab_map: dict
    aux: AuxIds
    aux_layer_ids: list[int] | None
    fc_hidden_states: int | None
    rope: dict
    target: dict | None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """The findings as sentences."""
        return [f.text for f in self.findings]

    def blocking(self, kinds: tuple[str, ...] = CONVERT_BLOCKING) -> list[Finding]:
        """The findings of the given kinds (keys of :data:`kimi.drafter.findings.FIXES`)."""
        return [f for f in self.findings if f.kind in kinds]

    def as_dict(self) -> dict:
        return {
            "path": self.path, "format": self.format, "format_evidence": self.format_evidence,
            "architecture": self.architecture, "model_type": self.model_type,
            "hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
            "draft_vocab_size": self.draft_vocab_size, "target_vocab_size": self.target_vocab_size,
            "vocab_map": self.vocab_map,
            "aux_layer_ids_written": list(self.aux.written) if self.aux.written else None,
            "aux_layer_ids_field": self.aux.where, "convention": self.aux.convention,
            "convention_evidence": self.aux.evidence, "aux_layer_ids": self.aux_layer_ids,
            "fc_hidden_states": self.fc_hidden_states, "rope": self.rope, "target": self.target,
            "problems": self.problems, "fixes": [f.fix for f in self.findings], "notes": self.notes,
        }

    def render(self) -> str:
        d = self.as_dict()
        vm = self.vocab_map
        rows = [
            f"drafter        {self.path}",
            f"format         {self.format} ({self.format_evidence})",
            f"architecture   {self.architecture} (model_type {self.model_type})",
            f"hidden         {self.hidden_size}, target hidden {self.target_hidden_size}",
            f"vocab          draft {self.draft_vocab_size}, target {self.target_vocab_size}",
            f"d2t / t2d      {vm.get('summary', 'absent')}",
            f"aux ids        written {d['aux_layer_ids_written']} in {self.aux.where or '-'}",
            f"convention     {self.aux.convention}: {self.aux.evidence}",
            f"vLLM ids       {self.aux_layer_ids} (state entering layer k); fc takes {self.fc_hidden_states} states",
            f"RoPE           {self.rope.get('summary')}",
        ]
        if self.target:
            t = self.target
            rows.append(f"target         {t['model_type']}, {t['num_layers']} layers, hidden {t['hidden_size']}, "
                        f"vocab {t['vocab_size']}; quantization {t.get('quantization') or 'none'}")
        rows += [f"note           {n}" for n in self.notes]
        rows += [f"problem        {f.text}\n  fix          {f.fix}" for f in self.findings] or ["problems       none"]
        return "\n".join(rows)


def architectures(cfg: dict) -> list[str]:
    """The config's ``architectures`` names (non-strings dropped)."""
    archs = cfg.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def detect_format(ckpt: Checkpoint) -> tuple[str, str]:
    """(format, evidence) of a drafter checkpoint (see module docstring)."""
    cfg = ckpt.config
    archs = architectures(cfg)
    nested = cfg.get("eagle_config")
    if "speculators_model_type" in cfg:
        return "speculators", f"speculators_model_type {cfg['speculators_model_type']!r}"
    if isinstance(nested, dict) and _MODELOPT_KEYS & nested.keys():
        return "modelopt", f"eagle_config holds modelopt keys {sorted(_MODELOPT_KEYS & nested.keys())}"
    if (ckpt.path / "hf_quant_config.json").is_file():
        return "modelopt", "hf_quant_config.json (modelopt export)"
    if any("Deepseek" in a for a in archs) or "kv_lora_rank" in cfg:
        return "eagle3-mla", f"architectures {archs}" + (" with kv_lora_rank" if "kv_lora_rank" in cfg else "")
    if any(name.startswith("midlayer.") for name in ckpt.tensors) or "LlamaForCausalLMEagle3" in archs:
        return "eagle3-llama", f"architectures {archs}, midlayer.* tensors"
    return "unknown", f"architectures {archs}; no known EAGLE-3 layout"


def vllm_architecture(cfg: dict, fmt: str) -> str:
    """The architecture name vLLM 0.26 resolves for this drafter (EAGLEConfig's renaming, speculators' map)."""
    if fmt == "speculators":
        inner = cfg.get("transformer_layer_config")
        inner_type = inner.get("model_type", "llama") if isinstance(inner, dict) else None
        return {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}.get(
            inner_type, f"unsupported model_type {inner_type!r}")
    arch = (architectures(cfg) or ["?"])[0]
    return arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else f"Eagle3{arch}"


def _vocab_map(ckpt: Checkpoint, draft_vocab: int | None,
               target_vocab: int | None) -> tuple[dict, list[tuple[str, str]]]:
    """(summary of ``d2t`` / ``t2d``, findings): kind ``vocab`` for ``d2t``, ``t2d`` for ``t2d``, which vLLM never
    reads (``load_weights`` of both EAGLE-3 drafter classes skips every name containing "t2d")."""
    info: dict = {"d2t": "d2t" in ckpt.tensors, "t2d": "t2d" in ckpt.tensors}
    found: list[Finding] = []

    def add(kind: str, text: str, fix: str = "") -> None:
        found.append(finding(kind, text + (_T2D_UNREAD if kind == "t2d" else ""), fix))

    if draft_vocab and target_vocab and draft_vocab > target_vocab:
        add("vocab", f"the draft vocabulary ({draft_vocab}) is larger than the target's ({target_vocab}): a draft "
                     "vocabulary is a subset of the target's, so this drafter was made for another target's "
                     "vocabulary", f"use the drafter made for this target; if {draft_vocab} is a wrong "
                     "draft_vocab_size, write the lm_head's rows there")
    if not info["d2t"]:
        if ckpt.has_weights and draft_vocab and target_vocab and draft_vocab < target_vocab:
            add("vocab", f"no d2t tensor but the draft vocabulary ({draft_vocab}) is smaller than the target's "
                         f"({target_vocab}): vLLM {upstream_release()} then maps every draft id i to target id "
                         "i, without an error, and the drafts are wrong",
                "ship the drafter's d2t (int64 offsets, draft id i -> target id i + d2t[i]) as its training wrote it")
        info["summary"] = "absent" if ckpt.has_weights else "not read (no weight files)"
        return info, found
    d2t_info = ckpt.tensors["d2t"]
    if d2t_info.dtype not in ("I64", "I32") or len(d2t_info.shape) != 1 or d2t_info.shape[0] == 0:
        add("vocab", f"d2t must be a non-empty 1-D int64 tensor of draft-to-target offsets, not "
                     f"{d2t_info.dtype}{list(d2t_info.shape)}", "write d2t as a 1-D int64 tensor of "
                     "draft_vocab_size offsets (target id = draft id + d2t[draft id])")
        info["summary"] = "malformed d2t"
        return info, found
    d2t = ckpt.read("d2t").astype(np.int64)
    mapped = np.arange(d2t.shape[0], dtype=np.int64) + d2t
    info.update(d2t_len=int(d2t.shape[0]), min_target_id=int(mapped.min()), max_target_id=int(mapped.max()))
    if draft_vocab and d2t.shape[0] != draft_vocab:
        add("vocab", f"d2t has {d2t.shape[0]} entries but the draft vocabulary has {draft_vocab}",
            f"set draft_vocab_size to {d2t.shape[0]} if that is the lm_head's row count, else ship the d2t made "
            "with this lm_head")
    if target_vocab and (mapped.min() < 0 or mapped.max() >= target_vocab):
        outside = int(((mapped < 0) | (mapped >= target_vocab)).sum())
        add("vocab", f"d2t maps {outside} draft ids outside the target vocabulary 0..{target_vocab - 1} "
                     f"(target ids {int(mapped.min())}..{int(mapped.max())})",
            "use the drafter made for this target's vocabulary (its d2t points past it)")
    if len(np.unique(mapped)) != len(mapped):
        add("vocab", "d2t maps several draft ids to the same target id",
            "write d2t again from the draft vocabulary's target ids (each draft id maps to its own target id)")
    if info["t2d"]:
        t2d_info = ckpt.tensors["t2d"]
        if t2d_info.dtype != "BOOL" or len(t2d_info.shape) != 1:
            add("t2d", f"t2d must be a 1-D bool mask over the target vocabulary, not "
                       f"{t2d_info.dtype}{list(t2d_info.shape)}")
            info["summary"] = "malformed t2d"
            return info, found
        t2d = ckpt.read("t2d")
        info.update(t2d_len=int(t2d.shape[0]), t2d_true=int(t2d.sum()))
        if target_vocab and t2d.shape[0] != target_vocab:
            add("t2d", f"t2d covers {t2d.shape[0]} ids but the target vocabulary has {target_vocab}")
        if int(t2d.sum()) != d2t.shape[0]:
            add("t2d", f"t2d marks {int(t2d.sum())} target ids but the draft vocabulary has {d2t.shape[0]}")
        inside = mapped[(mapped >= 0) & (mapped < t2d.shape[0])]
        if not t2d[inside].all():
            add("t2d", "t2d does not mark every target id that d2t maps to")
    info["summary"] = (f"{info['d2t_len']} draft ids -> target ids {info['min_target_id']}..{info['max_target_id']}"
                       + (f"; t2d marks {info['t2d_true']} of {info['t2d_len']}" if info["t2d"] else "; no t2d"))
    return info, found


def _logits_width(vocab_map: dict, own_vocab: int | None, draft_vocab: int | None,
                  target_vocab: int | None) -> list[Finding]:
    """The drafter's ``vocab_size`` as the width ``compute_logits`` scatters the draft logits into (both EAGLE-3
    classes): a larger one than the target's is harmless for drafting, a narrower one fails the first step."""
    if not own_vocab or not target_vocab or own_vocab == target_vocab:
        return []
    top = vocab_map.get("max_target_id")
    if top is not None and top >= own_vocab and top < target_vocab:
        text = (f"d2t maps draft ids to target ids up to {top} but the drafter's vocab_size is {own_vocab}: vLLM "
                f"{upstream_release()} scatters the draft logits into a row of vocab_size and fails at the first draft "
                "step")
        return [finding("vocab", text, f"set the drafter's vocab_size to the target's ({target_vocab})")]
    if not vocab_map.get("d2t") and draft_vocab == target_vocab:
        text = (f"the drafter's vocab_size {own_vocab} is not its draft vocabulary {draft_vocab} (the target's) "
                f"and there is no d2t: vLLM {upstream_release()}'s compute_logits asserts vocab_size-wide logits and "
                "fails at the first draft step")
        return [finding("vocab", text, f"set the drafter's vocab_size to {draft_vocab}")]
    return []


def rope_type(cfg: dict) -> str | None:
    """The RoPE variant named by ``rope_scaling`` / ``rope_parameters`` (None for plain RoPE)."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None


def rope_positions(cfg: dict) -> int | None:
    """The positions the drafter's RoPE covers: for YaRN, ``original_max_position_embeddings x factor`` (vLLM's
    ``get_rope`` sizes its cache from those, ``vllm/model_executor/layers/rotary_embedding/__init__.py``), else
    ``max_position_embeddings``."""
    own = positive_int(cfg.get("max_position_embeddings"))
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rope_type(cfg) in ("yarn", "deepseek_yarn") and isinstance(scaling, dict):
        original, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
        if positive_int(original) and type(factor) in (int, float) and factor > 0:
            return int(original * factor)
    return own


def rope_check(cfg: dict, served_positions: int | None) -> tuple[dict, list[str]]:
    """The drafter's RoPE length (:func:`rope_positions`) against the positions it will be served at.

    Returns:
        (``{"max_position_embeddings", "rope_type", "served", "cache_only", "summary"}``, problems).
        Too short but cache-only is not a problem (the fork raises the length at
        serve time); too short with a length-dependent RoPE is.
    """
    own = positive_int(cfg.get("max_position_embeddings"))
    covered = rope_positions(cfg)
    kind = rope_type(cfg)
    cache_only = kind in CACHE_ONLY_ROPE
    info = {"max_position_embeddings": own, "rope_type": kind or "default", "served": served_positions,
            "cache_only": cache_only}
    problems = []
    if covered is None or served_positions is None or covered >= served_positions:
        info["summary"] = f"{covered} positions ({info['rope_type']}), served {served_positions}: ok"
    elif cache_only:
        info["summary"] = (f"{own} positions < {served_positions} served; {info['rope_type']} RoPE depends only on "
                           "the position, so the fork raises the drafter's length at serve time")
    else:
        info["summary"] = f"{covered} positions < {served_positions} served, {kind} RoPE"
        problems.append(f"the drafter's RoPE ({kind}) covers {covered} positions but the target serves "
                        f"{served_positions}: serve with --max-model-len {covered} or use a drafter made for the "
                        "longer context")
    return info, problems


def inspect(path: Path, target_path: Path | None = None, served_positions: int | None = None,
            load_format: str = "auto") -> Report:
    """Inspect the drafter folder ``path``, optionally against a target folder or config.json.

    Args:
        path: drafter checkpoint folder.
        target_path: target folder or its config.json; gives the layer count,
            hidden size, vocabulary and context the drafter must fit.
        served_positions: the context it will be served at (default: the
            target's ``max_position_embeddings``).
        load_format: vLLM's ``--load-format``; ``"dummy"`` (weights drawn at random, no file read) drops the
            findings about weight files, as the serve check does.

    Raises:
        KimiError: unreadable drafter or target.
    """
    target = Target.from_path(target_path) if target_path else None
    report = inspect_checkpoint(Checkpoint.open(path), target, served_positions)
    if load_format == "dummy":
        report.findings = [f for f in report.findings if f.kind != "weights"]
    return report


def inspect_checkpoint(ckpt: Checkpoint, target: Target | None, served_positions: int | None = None) -> Report:
    """``inspect`` on an opened checkpoint (a config-only one skips the tensor checks)."""
    cfg = ckpt.config
    fmt, evidence = detect_format(ckpt)
    findings: list[Finding] = _weight_findings(ckpt)

    def add(kind: str, text: str, fix: str = "") -> None:
        findings.append(finding(kind, text, fix))

    def number(source: dict, key: str) -> int | None:
        value = source.get(key)
        if value is not None and positive_int(value) is None:
            add("config", f"config field {key} must be a positive integer, not {value!r}",
                f"write {key} as a positive integer in the drafter's config.json")
        return positive_int(value)

    if fmt == "unknown":
        add("format", f"not a known EAGLE-3 drafter layout ({evidence})")
    findings += architectures_findings(cfg, fmt)
    layer_cfg = cfg
    if fmt == "speculators":
        layer_cfg = cfg.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            add("config", f"transformer_layer_config must be an object, not {layer_cfg!r}",
                "write the drafter layer's LlamaConfig fields as the object transformer_layer_config")
            layer_cfg = {}

    hidden = number(layer_cfg, "hidden_size")
    target_hidden = number(cfg, "target_hidden_size") or number(layer_cfg, "target_hidden_size") or hidden
    lm_head = ckpt.shape("lm_head.weight")
    draft_vocab = number(cfg, "draft_vocab_size") or (lm_head[0] if lm_head else None)
    own_vocab = number(layer_cfg, "vocab_size")
    target_vocab = target.vocab_size if target else own_vocab
    if target and target_hidden and target_hidden != target.hidden_size:
        add("shape", f"the drafter expects target hidden states of width {target_hidden} but the target's hidden "
                     f"size is {target.hidden_size}: this drafter was made for another model",
            f"use the drafter made for this target (hidden size {target.hidden_size}); if the tensors were made for "
            f"it, write target_hidden_size: {target.hidden_size}")
    embed = ckpt.shape("embed_tokens.weight")
    rows = own_vocab or target_vocab  # vLLM builds embed_tokens with the drafter's vocab_size
    if embed and (len(embed) != 2 or (rows and embed[0] != rows) or (hidden and embed[1] != hidden)):
        add("shape", f"embed_tokens.weight is {list(embed)}, expected [{rows}, {hidden}] (vocab_size x hidden_size)",
            "leave embed_tokens out (vLLM shares the target's when the hidden sizes match), or ship the drafter's "
            "own [vocab_size, hidden_size] one")
    if embed and target and own_vocab and own_vocab < target.vocab_size:
        add("vocab", f"the drafter's vocab_size {own_vocab} is smaller than the target's {target.vocab_size}: its "
                     f"embed_tokens has no row for target ids {own_vocab} and up",
            "use the drafter made for this target's vocabulary")
    vocab_map, vocab_findings = _vocab_map(ckpt, draft_vocab, target_vocab)
    findings += vocab_findings
    findings += _logits_width(vocab_map, own_vocab, draft_vocab, target_vocab)
    findings += layout.findings(ckpt, target.vocab_size if target else None, target.hidden_size if target else None)

    fc = ckpt.shape("fc.weight")
    fc_states = None
    if fc and (len(fc) != 2 or (hidden and fc[0] != hidden)):
        add("shape", f"fc.weight is {list(fc)}, expected [{hidden}, k x {target_hidden}]",
            f"use the drafter made for this target; if hidden_size is wrong, write the fc's rows ({fc[0]}) there")
    elif fc and target_hidden:
        if fc[1] % target_hidden:
            add("shape", f"fc.weight {list(fc)} does not take a whole number of {target_hidden}-wide states",
                "use the drafter made for this target (its fc takes k states of the target's hidden size)")
        else:
            fc_states = fc[1] // target_hidden
    elif not fc and ckpt.has_weights:
        add("shape", "no fc.weight tensor: not an EAGLE-3 drafter (EAGLE-3 fuses target states through fc)",
            "ship the EAGLE-3 drafter's fc.weight (an EAGLE-1/2 drafter is served with method eagle, not eagle3)")

    aux = read_aux_ids(cfg, modelopt=fmt == "modelopt")
    if aux.malformed:
        add("ids", aux.malformed, "write the ids as a JSON list of integers, e.g. [2, 30, 58]")
    conflict = conflicting_ids(cfg, modelopt=fmt == "modelopt")
    if conflict:
        add("conflict", conflict, f"keep the ids the drafter was trained on in one place and delete the other "
                                  f"list (`kimi drafter convert` keeps {aux.where} and records the other)")
    if aux.ambiguous:
        add("convention", f"the convention of {aux.where} {list(aux.written)} is a guess ({aux.evidence})")
    try:
        ids = aux.vllm_ids(target.num_layers if target else None)
    except ValueError as exc:
        add("ids", str(exc), "serve an EAGLE-3 drafter with a target of at least 3 layers")
        ids = None
    if ids is not None and target:
        findings += check_ids(ids, target.num_layers, fc_states)
    elif ids is not None and fc_states is not None and fc_states != len(ids):
        findings += check_ids(ids, max(ids), fc_states)

    notes = _id_notes(cfg, aux, ids, target)
    served = served_positions or (target.max_positions if target else None)
    number(layer_cfg, "max_position_embeddings")
    rope, rope_problems = rope_check(layer_cfg, served)
    findings += [finding("rope", p) for p in rope_problems]
    return Report(
        path=str(ckpt.path), format=fmt, format_evidence=evidence, architecture=vllm_architecture(cfg, fmt),
        model_type=str(layer_cfg.get("model_type", "")), hidden_size=hidden, target_hidden_size=target_hidden,
        draft_vocab_size=draft_vocab, target_vocab_size=target_vocab, vocab_map=vocab_map, aux=aux,
        aux_layer_ids=list(ids) if ids is not None else None, fc_hidden_states=fc_states, rope=rope,
        target=None if target is None else vars(target), findings=findings, notes=notes,
    )


def architectures_findings(cfg: dict, fmt: str) -> list[Finding]:
    """A malformed or missing ``architectures`` (a speculators config needs none): without one, upstream vLLM stops
    while it builds the draft config (``SpeculativeConfig.update_arch_``: "Model architectures [...] are not
    supported" and every class it has; ``hf_config_override``: a TypeError for an MLA config)."""
    fix = f"write architectures: [\"{default_architecture(cfg)}\"] in config.json (`kimi drafter convert` writes it)"
    if "architectures" in cfg and architectures(cfg) != cfg["architectures"]:
        return [finding("config", f"architectures must be a list of class names, not {cfg['architectures']!r}", fix)]
    if not architectures(cfg) and fmt != "speculators":
        return [finding("architectures", f"no architectures in config.json: vLLM {upstream_release()} cannot "
                        "pick the drafter class and stops with \"Model architectures [...] are not supported\", "
                        "listing every class it has (an MLA config: a TypeError)", fix)]
    return []


def default_architecture(cfg: dict) -> str:
    """The ``architectures`` name of the drafter class a config's fields ask for: MLA with ``kv_lora_rank``, else
    Llama-style."""
    return "Eagle3DeepseekV3ForCausalLM" if "kv_lora_rank" in cfg else "LlamaForCausalLMEagle3"


def _weight_findings(ckpt: Checkpoint) -> list[Finding]:
    """No weight file vLLM reads in an opened folder, and tensors written in more than one weight file."""
    found = []
    if ckpt.opened and not ckpt.has_weights:
        others = f"; it holds {', '.join(ckpt.unread)}, which vLLM's loader does not read" if ckpt.unread else ""
        found.append(finding(
            "weights", f"no weight file vLLM reads (*.safetensors, *.bin, *.pt) in {ckpt.path}{others}: vLLM "
                       f"{upstream_release()} stops with \"Cannot find any model weights\" after the target's weights "
                       "have loaded",
            "save the weights as model.safetensors (safetensors.torch.save_file(state_dict, ...)) beside config.json"
            if ckpt.unread else ""))
    if ckpt.duplicates:
        named = "; ".join(f"{name} in {', '.join(f.name for f in files)}"
                          for name, files in sorted(ckpt.duplicates.items())[:3])
        more = f" (and {len(ckpt.duplicates) - 3} more)" if len(ckpt.duplicates) > 3 else ""
        found.append(finding(
            "conflict", f"{len(ckpt.duplicates)} tensor(s) written in more than one weight file: {named}{more}: vLLM "
                        f"{upstream_release()} loads every copy in turn, so the last file's wins or the load stops on "
                        "its shape",
            "delete the stale file, or list the shards to load in model.safetensors.index.json (vLLM then reads "
            "only those)"))
    return found


def _id_notes(cfg: dict, aux: AuxIds, ids: tuple[int, ...] | None, target: Target | None) -> list[str]:
    """Where the served aux ids differ from what upstream vLLM reads (``gpu_model_runner.py``,
    ``_get_eagle3_aux_layers_from_config``: top-level ids, else nested ``eagle_config`` ids, literally; else
    ``(2, L // 2, L - 3)``, ``interfaces.py``), and a ``num_aux_hidden_states`` that the fork rewrites (the
    drafter classes size ``fc`` from it)."""
    if ids is None or aux.malformed:
        return []
    stated = cfg.get("num_aux_hidden_states")
    if stated is not None and stated != len(ids):
        text = (f"num_aux_hidden_states {stated!r} in config.json but {len(ids)} aux layer ids: vLLM "
                f"{upstream_release()} sizes the drafter's fc for {stated!r} states and stops with a shape error "
                f"after loading; the fork writes {len(ids)}")
        return [text]
    if aux.convention == LAYER_OUTPUT:
        text = (f"aux layer ids {list(aux.written)} in {aux.where} are 'output of layer k' ({aux.evidence}): vLLM "
                f"{upstream_release()} would capture the states entering layers {list(aux.written)}, one layer early, "
                f"and lose the acceptance without an error; the fork serves them as {list(ids)}")
        return [text]
    if aux.written is None and target is not None:
        layers = target.num_layers
        upstream = [2, layers // 2, layers - 3]
        same = "the same" if list(ids) == upstream else f"vLLM {upstream_release()} takes {upstream}, which collide"
        text = (f"no aux layer ids in config.json: served with the defaults {list(ids)} for the {layers}-layer "
                f"target ({same}); a drafter trained on other layers loses its acceptance without an error")
        return [text]
    return []
