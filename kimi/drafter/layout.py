"""The tensors vLLM's EAGLE-3 drafter classes build from a config, held against a checkpoint.

Upstream loads a drafter's weights without asking whether they are all there: ``load_weights`` of
``Eagle3LlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle3.py``) and of
``Eagle3DeepseekV2ForCausalLM`` (``deepseek_eagle3.py``) return None, so ``DefaultModelLoader.load_weights``
(``model_loader/default_loader.py``) skips its "weights were not initialized from checkpoint" check and a
missing tensor is served uninitialised. A tensor of another shape stops the load - after the target's
weights have loaded - and so does a name with no parameter (``AutoWeightsLoader._load_module``: "There is no
module or parameter named ..."), except names ending in ``.bias``, which ``AutoWeightsLoader.load_weights``
drops without a word, names containing ``t2d`` (skipped), ``mask_hidden`` (the Llama class drops it with a
warning) and ``input_norm.*`` where ``norm_before_fc`` is off (the Llama class maps it to nothing).

Config fields missing from ``config.json`` take the defaults of the transformers config class that
``model_type`` names (:data:`DEFAULTS`, transformers 5.19, the version the v0.32 line's vLLM installs). Only the two
layouts below are checked; quantized checkpoints and other classes are left to vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kimi.drafter.checkpoint import Checkpoint
from kimi.drafter.findings import Finding, finding
from kimi.fork.release import upstream_release

#: ``model_type`` -> (config class, its defaults for the fields the drafter classes read).
_LLAMA = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
          "vocab_size": 32000}
_DEEPSEEK_V3 = {"hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 128, "num_hidden_layers": 61,
                "vocab_size": 129280, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128}
_DEEPSEEK_V2 = {**_DEEPSEEK_V3, "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                "num_hidden_layers": 32, "vocab_size": 102400}
DEFAULTS = {"llama": ("LlamaConfig", _LLAMA), "deepseek_v3": ("DeepseekV3Config", _DEEPSEEK_V3),
            "kimi_k2": ("DeepseekV3Config", _DEEPSEEK_V3), "deepseek_v2": ("DeepseekV2Config", _DEEPSEEK_V2)}

#: Architectures (as written, and as vLLM renames them) -> (vLLM class, layout).
LLAMA, MLA = "llama", "mla"
CLASSES = {"LlamaForCausalLMEagle3": ("Eagle3LlamaForCausalLM", LLAMA),
           "Eagle3LlamaForCausalLM": ("Eagle3LlamaForCausalLM", LLAMA),
           "LlamaForCausalLM": ("Eagle3LlamaForCausalLM", LLAMA),
           "Eagle3DeepseekV3ForCausalLM": ("Eagle3DeepseekV2ForCausalLM", MLA),
           "Eagle3DeepseekV2ForCausalLM": ("Eagle3DeepseekV2ForCausalLM", MLA),
           "DeepseekV3ForCausalLM": ("Eagle3DeepseekV2ForCausalLM", MLA),
           "DeepseekV2ForCausalLM": ("Eagle3DeepseekV2ForCausalLM", MLA)}
# Names the loaders handle themselves (inspect checks them): t2d is never read.
_HANDLED = ("fc.weight", "embed_tokens.weight", "d2t")
_SHOWN = 3


@dataclass(frozen=True)
class Slot:
    """A parameter upstream builds: the checkpoint shape it loads, and the config fields that shape comes from."""

    shape: tuple[int, ...]
    reads: str


@dataclass
class Values:
    """The config values upstream builds a drafter from, and the fields it took from the class defaults."""

    fields: dict
    defaulted: dict[str, str]

    def __getitem__(self, key: str):
        return self.fields[key]

    def defaulted_in(self, reads: str) -> list[str]:
        """The defaulted fields among ``reads`` ("a x b")."""
        words = set(re.findall(r"\w+", reads))
        return [key for key in self.defaulted if key in words]

    def why(self, reads: str) -> str:
        """The defaulted fields among ``reads``, as a clause ('' if none)."""
        notes = [self.defaulted[key] for key in self.defaulted_in(reads)]
        return f" ({'; '.join(notes)})" if notes else ""

    def fix(self, reads: list[str]) -> str:
        """The fix of tensors that do not fit the fields ``reads`` name: write the fields that took a class default
        (the checkpoint's values), else make the written ones match or use the right drafter."""
        defaulted = sorted({key for r in reads for key in self.defaulted_in(r)})
        if defaulted:
            return (f"write {', '.join(defaulted)} in the drafter's config.json with the values its tensors have "
                    "(vLLM takes the class default for a missing field)")
        fields = sorted({w for r in reads for w in re.findall(r"[a-z]+_[a-z_]+", r)})
        return (f"make {', '.join(fields)} in config.json the values the tensors were made with, or use the drafter "
                "made for this target")


def drafter_class(cfg: dict) -> tuple[str, str] | None:
    """(vLLM class, layout) for a drafter config's first architecture, or None for other classes."""
    archs = cfg.get("architectures")
    first = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return CLASSES.get(first)


def values(cfg: dict) -> Values | None:
    """The fields the drafter classes read, with the config class defaults for missing ones (None when the
    ``model_type`` is not one of :data:`DEFAULTS` or a field is not a positive integer: inspect names that)."""
    known = DEFAULTS.get(cfg.get("model_type"))
    if known is None:
        return None
    class_name, defaults = known
    fields, defaulted = {}, {}
    for key, default in defaults.items():
        value = cfg.get(key, default)
        if key not in cfg:
            defaulted[key] = f"{key} is not in config.json: vLLM takes {class_name}'s default {default}"
        if value is None and key == "q_lora_rank":
            fields[key] = None
            continue
        if type(value) is not int or value <= 0:
            return None
        fields[key] = value
    heads = fields["num_attention_heads"]
    derived = {"num_key_value_heads": (heads, "num_attention_heads"),
               "head_dim": (fields["hidden_size"] // heads, "hidden_size / num_attention_heads"),
               "draft_vocab_size": (fields["vocab_size"], "vocab_size")}
    for key, (value, source) in derived.items():
        fields[key] = cfg.get(key) or value
        if not cfg.get(key):
            defaulted[key] = f"{key} is not in config.json: vLLM takes {source} ({value})"
    if any(type(fields[k]) is not int or fields[k] <= 0 for k in ("num_key_value_heads", "head_dim")):
        return None
    for flag in ("attention_bias", "bias", "mlp_bias", "norm_before_fc", "fc_norm"):
        fields[flag] = bool(cfg.get(flag, False))
    nested = cfg.get("eagle_config")
    if isinstance(nested, dict) and "norm_before_fc" in nested:
        fields["norm_before_fc"] = bool(nested["norm_before_fc"])
    return Values(fields, defaulted)


def _llama_layer(v: Values, i: int) -> tuple[dict[str, Slot], dict[str, Slot]]:
    """(needed, accepted) parameters of decoder layer ``i`` of ``Eagle3LlamaForCausalLM`` (its ``LlamaDecoderLayer``
    with ``qkv_proj`` rebuilt for ``2 x hidden_size`` inputs in layer 0)."""
    h, q, kv, inter = v["hidden_size"], v["num_attention_heads"] * v["head_dim"], \
        v["num_key_value_heads"] * v["head_dim"], v["intermediate_size"]
    width, into = (2 * h, "2 x hidden_size") if i == 0 else (h, "hidden_size")
    needed = {
        "input_layernorm.weight": Slot((h,), "hidden_size"),
        "post_attention_layernorm.weight": Slot((h,), "hidden_size"),
        "self_attn.q_proj.weight": Slot((q, width), f"num_attention_heads x head_dim, {into}"),
        "self_attn.k_proj.weight": Slot((kv, width), f"num_key_value_heads x head_dim, {into}"),
        "self_attn.v_proj.weight": Slot((kv, width), f"num_key_value_heads x head_dim, {into}"),
        "self_attn.o_proj.weight": Slot((h, q), "hidden_size, num_attention_heads x head_dim"),
        "mlp.gate_proj.weight": Slot((inter, h), "intermediate_size, hidden_size"),
        "mlp.up_proj.weight": Slot((inter, h), "intermediate_size, hidden_size"),
        "mlp.down_proj.weight": Slot((h, inter), "hidden_size, intermediate_size"),
    }
    accepted = {"self_attn.qkv_proj.weight": Slot((q + 2 * kv, width), f"(num_attention_heads + 2 x "
                                                                     f"num_key_value_heads) x head_dim, {into}"),
                "mlp.gate_up_proj.weight": Slot((2 * inter, h), "2 x intermediate_size, hidden_size")}
    norm = Slot((h,), "hidden_size")
    (needed if i == 0 else accepted)["hidden_norm.weight"] = norm  # read by layer 0 only
    if v["attention_bias"]:
        needed.update({"self_attn.q_proj.bias": Slot((q,), "attention_bias"),
                       "self_attn.k_proj.bias": Slot((kv,), "attention_bias"),
                       "self_attn.v_proj.bias": Slot((kv,), "attention_bias")})
    if v["attention_bias"] or v["bias"]:
        needed["self_attn.o_proj.bias"] = Slot((h,), "attention_bias")
    if v["mlp_bias"]:
        needed.update({"mlp.gate_proj.bias": Slot((inter,), "mlp_bias"), "mlp.up_proj.bias": Slot((inter,), "mlp_bias"),
                       "mlp.down_proj.bias": Slot((h,), "mlp_bias")})
    return needed, accepted


def _mla_layer(v: Values, i: int) -> tuple[dict[str, Slot], dict[str, Slot]] | None:
    """(needed, accepted) parameters of decoder layer ``i`` of ``Eagle3DeepseekV2ForCausalLM`` (MLA attention with
    a query LoRA, a dense MLP); None without ``q_lora_rank`` (left to vLLM)."""
    if v["q_lora_rank"] is None:
        return None
    h, heads, q_lora, kv_lora = v["hidden_size"], v["num_attention_heads"], v["q_lora_rank"], v["kv_lora_rank"]
    rope, nope, vdim, inter = v["qk_rope_head_dim"], v["qk_nope_head_dim"], v["v_head_dim"], v["intermediate_size"]
    width, into = (2 * h, "2 x hidden_size") if i == 0 else (h, "hidden_size")
    needed = {
        "input_layernorm.weight": Slot((h,), "hidden_size"),
        "post_attention_layernorm.weight": Slot((h,), "hidden_size"),
        "hidden_norm.weight": Slot((h,), "hidden_size"),
        "self_attn.q_a_proj.weight": Slot((q_lora, width), f"q_lora_rank, {into}"),
        "self_attn.q_a_layernorm.weight": Slot((q_lora,), "q_lora_rank"),
        "self_attn.q_b_proj.weight": Slot((heads * (nope + rope), q_lora),
                                          "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank"),
        "self_attn.kv_a_proj_with_mqa.weight": Slot((kv_lora + rope, width),
                                                    f"kv_lora_rank + qk_rope_head_dim, {into}"),
        "self_attn.kv_a_layernorm.weight": Slot((kv_lora,), "kv_lora_rank"),
        "self_attn.kv_b_proj.weight": Slot((heads * (nope + vdim), kv_lora),
                                           "num_attention_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank"),
        "self_attn.o_proj.weight": Slot((h, heads * vdim), "hidden_size, num_attention_heads x v_head_dim"),
        "mlp.gate_proj.weight": Slot((inter, h), "intermediate_size, hidden_size"),
        "mlp.up_proj.weight": Slot((inter, h), "intermediate_size, hidden_size"),
        "mlp.down_proj.weight": Slot((h, inter), "hidden_size, intermediate_size"),
    }
    accepted = {"mlp.gate_up_proj.weight": Slot((2 * inter, h), "2 x intermediate_size, hidden_size"),
                "self_attn.fused_qkv_a_proj.weight": Slot((q_lora + kv_lora + rope, width),
                                                          f"q_lora_rank + kv_lora_rank + qk_rope_head_dim, {into}")}
    return needed, accepted


#: A split checkpoint name -> the fused parameter that also takes the whole (a fused name stands for its parts).
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
          "up_proj": "gate_up_proj", "q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj"}


def expected(layout: str, v: Values) -> tuple[dict[str, Slot], dict[str, Slot]] | None:
    """(needed, accepted) parameters, by canonical name (layer 0 is ``layers.0.``, which a checkpoint may write
    ``midlayer.``): needed ones stay uninitialised when absent, accepted ones load when present; None when the
    layout is left to vLLM."""
    build = _llama_layer if layout == LLAMA else _mla_layer
    needed = {"norm.weight": Slot((v["hidden_size"],), "hidden_size")}
    accepted: dict[str, Slot] = {}
    for i in range(v["num_hidden_layers"]):
        layer = build(v, i)
        if layer is None:
            return None
        needed.update({f"layers.{i}.{k}": s for k, s in layer[0].items()})
        accepted.update({f"layers.{i}.{k}": s for k, s in layer[1].items()})
    return needed, accepted


def _canonical(name: str) -> str:
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _written(name: str) -> str:
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def _stands_for(name: str, present: set[str]) -> bool:
    """Whether a fused checkpoint tensor holds the split parameter ``name``."""
    module = name.rsplit(".", 2)
    return len(module) == 3 and module[1] in _FUSED and f"{module[0]}.{_FUSED[module[1]]}.{module[2]}" in present


def findings(ckpt: Checkpoint, target_vocab: int | None, target_hidden: int | None) -> list[Finding]:
    """What upstream vLLM would get wrong loading ``ckpt``: (kind, sentence) pairs, kinds ``shape`` and ``vocab``.

    Checks (the two layouts of :data:`CLASSES`, unquantized checkpoints with weights; ``fc``,
    ``embed_tokens`` shapes and ``d2t`` / ``t2d`` values are inspect's): shapes against the config, naming
    the fields that took a class default; tensors that would stay uninitialised (also whole layers that
    ``num_hidden_layers`` asks for); names with no parameter (the load stops); non-zero biases and
    ``input_norm`` that upstream drops; a missing ``lm_head`` with a draft vocabulary smaller than the target's
    (upstream then serves the first rows of the target's head); ``d2t`` where the draft vocabulary is the
    target's (upstream has nowhere to load it); no ``embed_tokens`` where the target's cannot be shared.
    """
    cfg = ckpt.config
    found, v = drafter_class(cfg), values(cfg)
    if (found is None or v is None or not ckpt.has_weights or "quantization_config" in cfg
            or (ckpt.path / "hf_quant_config.json").is_file()):
        return []
    cls, layout = found
    if layout == MLA and "kv_lora_rank" not in v.fields:  # an MLA class over a Llama config: left to vLLM
        return []
    built = expected(layout, v)
    if built is None:
        return []
    needed, accepted = built
    present = {_canonical(n): n for n in ckpt.tensors}
    wrong, missing, unknown, dropped, wrong_reads = [], [], [], [], []
    for name, slot in {**needed, **accepted}.items():
        if name in present and ckpt.shape(present[name]) != slot.shape:
            wrong_reads.append(slot.reads)
            wrong.append(f"{present[name]} is {list(ckpt.shape(present[name]))}, config.json gives "
                         f"{list(slot.shape)} ({slot.reads}){v.why(slot.reads)}")
    missing = [n for n in needed if n not in present and not _stands_for(n, set(present))]
    if layout == LLAMA and v["norm_before_fc"] and "input_norm.weight" not in present:
        missing.append("input_norm.weight")
    for name, written in sorted(present.items()):
        if name in needed or name in accepted or "t2d" in name or name in _HANDLED or name == "lm_head.weight":
            continue
        if name.endswith(".bias"):
            if not ckpt.is_zero(written):
                flag = "mlp_bias" if ".mlp." in name else "attention_bias"
                dropped.append(f"{written} holds non-zero values but {cls} builds no such bias ({flag} is not set "
                               "in config.json)")
        elif layout == LLAMA and name.startswith("input_norm."):
            if not v["norm_before_fc"]:
                dropped.append(f"{written} is in the checkpoint but norm_before_fc is not set in config.json")
        elif not ((layout == LLAMA and (name == "mask_hidden" or (name.startswith("fc_norm.") and v["fc_norm"])))
                  or name.endswith(("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached"))):
            unknown.append(written)
    out: list[Finding] = []
    vllm = f"vLLM {upstream_release()}"
    if wrong:
        out.append(finding("shape", _listed(wrong, "do not fit config.json") + f": {vllm} stops with a shape "
                           "error after the target's weights have loaded", v.fix(wrong_reads)))
    if missing:
        said = _missing(missing, present, v)
        out.append(finding("shape", said + f": {vllm} does not check an EAGLE-3 drafter for missing tensors and "
                           "would serve them uninitialised",
                           "write num_hidden_layers as the number of decoder layers the checkpoint holds"
                           if "num_hidden_layers" in said else "ship the missing tensors from the drafter's training "
                           "checkpoint"))
    if unknown:
        out.append(finding("shape", _listed(unknown, f"have no parameter in vLLM's {cls}") + f": {vllm} stops "
                           "loading there (\"There is no module or parameter named ...\"), after the target's "
                           "weights have loaded", "remove those tensors, or rename them to the parameter names "
                           f"{cls} has (`kimi drafter convert` renames speculators' layers.0.*)"))
    if dropped:
        flags = sorted({flag for flag in ("attention_bias", "mlp_bias", "norm_before_fc")
                        if any(flag in text for text in dropped)})
        out.append(finding("shape", "; ".join(dropped) + f": {vllm} drops it without a word and the drafter "
                           "runs without it", f"set {' / '.join(flags)} in config.json if the drafter was trained "
                           "with it, else remove the tensor"))
    return out + _head(ckpt, v, target_vocab, target_hidden)


def _head(ckpt: Checkpoint, v: Values, target_vocab: int | None,
          target_hidden: int | None) -> list[Finding]:
    """The vocabulary head and the embedding against what upstream shares from the target."""
    out = []
    vllm = f"vLLM {upstream_release()}"
    draft_vocab, hidden = v["draft_vocab_size"], v["hidden_size"]
    head = ckpt.shape("lm_head.weight")
    reads = "draft_vocab_size, hidden_size"
    if head is not None and head != (draft_vocab, hidden):
        text = (f"lm_head.weight is {list(head)}, config.json gives [{draft_vocab}, {hidden}] ({reads})"
                f"{v.why(reads)}: {vllm} stops with a shape error after the target's weights have loaded")
        fix = (f"write draft_vocab_size: {head[0]} (the lm_head's rows) in config.json if that is the draft "
               "vocabulary, else ship the lm_head made with it" if head[1:] == (hidden,) else v.fix([reads]))
        out.append(finding("shape", text, fix))
    if target_vocab is None:
        return out
    if head is None and draft_vocab != target_vocab:
        text = (f"no lm_head.weight but a draft vocabulary of {draft_vocab} (the target's has {target_vocab}): "
                f"{vllm} then puts the target's lm_head on the drafter and keeps its first {draft_vocab} rows "
                "as the draft vocabulary, so the drafts are scored with the wrong rows, without an error")
        out.append(finding("vocab", text, f"ship the drafter's own lm_head.weight [{draft_vocab}, {hidden}]"))
    if "d2t" in ckpt.tensors and draft_vocab == target_vocab:
        text = (f"a d2t tensor although the draft vocabulary is the target's ({target_vocab}"
                f"{v.why('draft_vocab_size')}): {vllm} builds no draft-to-target map then and stops loading "
                "at d2t (\"There is no module or parameter named 'draft_id_to_target_id'\")")
        out.append(finding("vocab", text, "remove d2t and t2d, or set draft_vocab_size to the lm_head's rows"))
    if "embed_tokens.weight" not in ckpt.tensors and target_hidden is not None and target_hidden != hidden:
        text = (f"no embed_tokens.weight and the drafter's hidden size {hidden} is not the target's "
                f"{target_hidden}: {vllm} cannot share the target's embeddings and serves the drafter's "
                "own, uninitialised")
        out.append(finding("shape", text, f"ship the drafter's embed_tokens.weight [vocab_size, {hidden}]"))
    return out


def _listed(items: list[str], verb: str) -> str:
    more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return f"{len(items)} tensor{'s' if len(items) > 1 else ''} {verb}: " + "; ".join(items[:_SHOWN]) + more


def _missing(names: list[str], present: dict[str, str], v: Values) -> str:
    """The missing tensors; layers with no tensor at all are named as layers (``num_hidden_layers`` is too big)."""
    empty = sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")}
                   - {int(n.split(".")[1]) for n in present if n.startswith("layers.") and n.split(".")[1].isdigit()})
    parts = []
    if empty:
        span = f"layer {empty[0]}" if len(empty) == 1 else f"layers {empty[0]}..{empty[-1]}"
        parts.append(f"no tensors for {span} although num_hidden_layers is {v['num_hidden_layers']}"
                     f"{v.why('num_hidden_layers')}")
    rest = [_written(n) for n in names if not (n.startswith("layers.") and int(n.split(".")[1]) in empty)]
    if rest:
        more = f" (and {len(rest) - _SHOWN} more)" if len(rest) > _SHOWN else ""
        parts.append(f"no {', '.join(rest[:_SHOWN])}{more} in the checkpoint")
    return "; ".join(parts)
