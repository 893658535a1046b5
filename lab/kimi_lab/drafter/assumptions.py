"""What vLLM (the v0.32 line's release) assumes about an EAGLE-3 drafter checkpoint, as data: one :class:`Assumption`
per thing a checkpoint can get wrong, and the valid variants that must not be refused.

Each entry names what upstream reads (the field or tensor, the file and function of that release), what upstream
does when a checkpoint breaks it (:data:`OUTCOMES`), a way to break it in a copy of a good drafter folder
(``lie``, from :mod:`kimi_lab.drafter.lies`: edits ``config.json`` or ``model.safetensors`` in place), and the
words ``kimi drafter inspect`` must say about that copy (``needle``; empty for a valid variant, which inspect must
pass). ``refused`` says whether ``vllm serve`` on the fork stops at start-up (:mod:`kimi.drafter.serve_checks`,
before any weight loads) or serves it (translated ids, a ``t2d`` vLLM never reads, a valid variant).
:func:`assumption_table` runs inspect on every lying copy; ``docs/drafter-assumptions.md`` is the prose form.

Sources (the v0.32 line's vLLM): ``model_executor/models/llama_eagle3.py`` (``Eagle3LlamaForCausalLM``, ``LlamaModel``,
``LlamaDecoderLayer``), ``deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``), ``models/utils.py``
(``AutoWeightsLoader``), ``v1/spec_decode/llm_base_proposer.py`` (``load_model``, ``_maybe_share_embeddings``,
``_maybe_share_lm_head``), ``v1/worker/gpu_model_runner.py`` and ``v1/worker/gpu/spec_decode/eagle/`` (aux layer
ids), ``config/speculative.py`` (the draft config), ``model_executor/layers/rotary_embedding/__init__.py``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kimi.drafter.checkpoint import SAFETENSORS_INDEX, read_config
from kimi.drafter.conventions import IDS_FIELD
from kimi.drafter.inspect import inspect
from kimi.drafter.layout import LLAMA, MLA, drafter_class
from kimi.errors import KimiError
from kimi_lab.drafter import lies

#: What upstream does with a checkpoint that breaks an assumption, worst first.
FAILS_AT_LOAD = "fails after the target's weights load"
FAILS_AT_STEP = "fails in the first step"
SERVES_WRONG = "serves wrong drafts without an error"
FAILS_AT_START = "fails at start-up, before any weight loads"
IGNORES = "serves it as if the tensor were not there"
SERVES_SAME = "serves it as the original"
SERVES = "serves it"
OUTCOMES = (FAILS_AT_LOAD, FAILS_AT_STEP, SERVES_WRONG, FAILS_AT_START, IGNORES, SERVES_SAME, SERVES)

@dataclass(frozen=True)
class Assumption:
    """One assumption of vLLM (the v0.32 line's release) about a drafter checkpoint, or a valid variant
    (``needle == ""``).

    Attributes:
        name: short name.
        reads: what upstream reads, with the file and function.
        upstream: what upstream does with ``lie``'s copy, in words; ``outcome`` is one of :data:`OUTCOMES`.
        lie: edits a copy of a good drafter folder in place (:data:`kimi_lab.drafter.lies.Lie`).
        needle: what inspect's message for the copy contains ("" for a valid variant: no problem at all).
        refused: whether ``vllm serve`` on the fork stops at start-up.
        layout: ``llama``, ``mla`` or ``any``: the drafter classes it applies to.
        fits: more conditions on (drafter config, target text config), if any.
        fix: what the fix of the finding that holds ``needle`` says ("" where nothing is refused).
    """

    name: str
    reads: str
    upstream: str
    outcome: str
    lie: lies.Lie
    needle: str
    refused: bool
    layout: str = "any"
    fits: Callable[[dict, dict], bool] | None = None
    fix: str = ""

    @property
    def valid(self) -> bool:
        return not self.needle

    def applies(self, drafter: Path, target: Path) -> bool:
        """Whether the entry fits the drafter's class (``layout``) and ``fits``."""
        cfg = read_config(drafter)
        found = drafter_class(cfg)
        if self.layout != "any" and (found is None or found[1] != self.layout):
            return False
        return self.fits is None or self.fits(cfg, lies.target_config(target))


# -- the entries ----------------------------------------------------------------------------------------------

_IDS = ("eagle_aux_hidden_state_layer_ids (top level, else eagle_config's): v1/worker/gpu_model_runner.py "
        "GPUModelRunner._get_eagle3_aux_layers_from_config (V2: v1/worker/gpu/spec_decode/eagle/eagle3_utils.py "
        "get_eagle3_aux_layers_from_config); models/interfaces.py EagleModelMixin._set_aux_hidden_state_layers "
        "keeps sorted(set(ids))")
_FC = ("num_aux_hidden_states (else len(eagle_config ids), else 3) x target_hidden_size (else hidden_size) -> "
       "fc input width: llama_eagle3.py LlamaModel.__init__, deepseek_eagle3.py DeepseekV2Eagle3Model.__init__")
_LAYER = ("{field} -> the decoder layer's tensor shapes: llama_eagle3.py LlamaDecoderLayer.__init__ (llama.py "
          "LlamaAttention, LlamaMLP), deepseek_eagle3.py DeepseekV2Eagle3DecoderLayer.__init__; missing fields take "
          "the transformers config class defaults (LlamaConfig, DeepseekV3Config)")
_LOAD = ("load_weights of Eagle3LlamaForCausalLM / Eagle3DeepseekV2ForCausalLM -> models/utils.py AutoWeightsLoader; "
         "they return None, so model_loader/default_loader.py DefaultModelLoader.load_weights checks no missing "
         "tensor")
_VOCAB = ("draft_vocab_size (else vocab_size) -> lm_head rows and draft_id_to_target_id, built only when it differs "
          "from the target's vocabulary: Eagle3LlamaForCausalLM.__init__ / Eagle3DeepseekV2ForCausalLM.__init__")
_SHARE = ("v1/spec_decode/llm_base_proposer.py SpecDecodeBaseProposer._maybe_share_lm_head / "
          "_maybe_share_embeddings (V2: v1/worker/gpu/spec_decode/eagle/utils.py load_eagle_model)")
_WIDTH = ("vocab_size -> embed_tokens rows and the width compute_logits scatters the draft logits into: "
          "Eagle3LlamaForCausalLM.compute_logits, Eagle3DeepseekV2ForCausalLM.compute_logits")
_FILES = ("weight files: model_loader/default_loader.py DefaultModelLoader._prepare_weights (the first of "
          "*.safetensors, *.bin, *.pt that matches; model.safetensors.index.json filters the safetensors files; "
          "weight_utils.filter_files_not_needed_for_inference), weight_utils.pt_weights_iterator "
          "(torch.load(weights_only=True))")
_ROPE = ("max_position_embeddings, rope_scaling / rope_parameters: config/speculative.py "
         "_maybe_override_draft_max_position_embeddings raises max_position_embeddings to the target's "
         "max_model_len; layers/rotary_embedding/__init__.py get_rope sizes a YaRN cache from "
         "original_max_position_embeddings x factor")


ASSUMPTIONS: tuple[Assumption, ...] = (
    # aux layer ids
    Assumption("aux-ids-outside-target", _IDS,
               "an id past the target's last layer is never captured; the drafter's fc gets fewer states than it "
               "takes and the first draft step fails with a shape error", FAILS_AT_STEP,
               lies.config(**{IDS_FIELD: lambda c, t: [*lies.aux_ids(c)[:-1], t["num_hidden_layers"] + 1]}),
               "outside the target's layers", True, fix="in vLLM's convention (the state entering layer k)"),
    Assumption("aux-ids-repeated", _IDS,
               "repeated ids are captured once (sorted(set(ids))); fc gets fewer states and the first draft step "
               "fails with a shape error", FAILS_AT_STEP,
               lies.config(**{IDS_FIELD: lambda c, t: [*lies.aux_ids(c)[:-1], lies.aux_ids(c)[-2]]}), "repeat [", True,
               fix="write each layer the drafter was trained on once"),
    Assumption("aux-ids-fewer-than-fc", f"{_IDS}; {_FC}",
               "fc is sized from num_aux_hidden_states or eagle_config's ids, else 3, never from the top-level ids: "
               "it loads, the target captures fewer states and the first draft step fails with a shape error",
               FAILS_AT_STEP,
               lies.config(**{IDS_FIELD: lambda c, t: lies.aux_ids(c)[:-1], "num_aux_hidden_states": lies.DROP}),
               "but the drafter's fc takes", True, fix="ids the drafter's fc was trained on"),
    Assumption("aux-ids-not-integers", _IDS,
               "string ids match no layer index: no state is captured and the first draft step fails",
               FAILS_AT_STEP, lies.config(**{IDS_FIELD: lambda c, t: [str(i) for i in lies.aux_ids(c)]}),
               "must be a non-empty list of integer layer ids", True, fix="write the ids as a JSON list of integers"),
    Assumption("aux-ids-output-convention", _IDS,
               "SpecForge's nested 'output of layer k' ids are read literally: every state comes from one layer "
               "too early and the acceptance collapses (vllm#50170, #43671)", SERVES_WRONG, lies.as_layer_outputs,
               "are 'output of layer k'", False),
    Assumption("num-aux-hidden-states-disagrees", _FC,
               "fc is built for num_aux_hidden_states states, not for the ids': shape error at load",
               FAILS_AT_LOAD, lies.config(num_aux_hidden_states=lambda c, t: len(lies.aux_ids(c)) + 1),
               "sizes the drafter's fc for", False),
    # widths
    Assumption("target-hidden-size", _FC,
               "fc is built for the stated target width, the checkpoint's fc for the real one: shape error at load",
               FAILS_AT_LOAD, lies.config(target_hidden_size=lambda c, t: 2 * lies.target_hidden(c)),
               "expects target hidden states of width", True, fix="use the drafter made for this target (hidden size"),
    Assumption("hidden-size", _LAYER.format(field="hidden_size"),
               "every layer is built for the stated width: shape error at load", FAILS_AT_LOAD,
               lies.config(hidden_size=lambda c, t: 2 * c["hidden_size"],
                           target_hidden_size=lambda c, t: lies.target_hidden(c), head_dim=lies.pinned_head_dim),
               "(hidden_size)", True, fix="in config.json the values the tensors were made with"),
    Assumption("hidden-size-absent", _LAYER.format(field="hidden_size"),
               "silent default (LlamaConfig 4096, DeepseekV3Config 7168), then a shape error at load",
               FAILS_AT_LOAD, lies.config(target_hidden_size=lambda c, t: lies.target_hidden(c),
                                      head_dim=lies.pinned_head_dim, hidden_size=lies.DROP),
               "hidden_size is not in config.json", True, fits=lies.not_default("hidden_size"),
               fix="write hidden_size in the drafter's config.json"),
    Assumption("intermediate-size", _LAYER.format(field="intermediate_size"),
               "the MLP is built for the stated width; the weight loaders cut a wider checkpoint tensor down to it "
               "without a word (a narrower one fails at load)", SERVES_WRONG,
               lies.config(intermediate_size=lambda c, t: c["intermediate_size"] - 64),
               "(intermediate_size, hidden_size)", True, fix="make hidden_size, intermediate_size in config.json"),
    Assumption("num-key-value-heads", _LAYER.format(field="num_key_value_heads (else num_attention_heads)"),
               "k/v projections are built for the stated heads; QKVParallelLinear.weight_loader keeps the first rows "
               "of the checkpoint's wider k/v without a word", SERVES_WRONG,
               lies.config(num_key_value_heads=lambda c, t: max(1, c["num_attention_heads"] // 2)),
               "(num_key_value_heads x head_dim", True, LLAMA, fix="num_key_value_heads in config.json the values"),
    Assumption("head-dim", _LAYER.format(field="head_dim (else hidden_size / num_attention_heads)"),
               "q/k/v/o are built for the stated head_dim: shape error at load", FAILS_AT_LOAD,
               lies.config(head_dim=lambda c, t: 2 * lies.head_dim(c)), "x head_dim", True, LLAMA, fix="head_dim"),
    Assumption("kv-lora-rank", _LAYER.format(field="kv_lora_rank"),
               "the MLA projections are built for the stated rank: shape error at load", FAILS_AT_LOAD,
               lies.config(kv_lora_rank=lambda c, t: c["kv_lora_rank"] // 2), "kv_lora_rank", True, MLA,
               fix="kv_lora_rank"),
    Assumption("q-lora-rank-absent", _LAYER.format(field="q_lora_rank"),
               "silent default (DeepseekV3Config 1536), then a shape error at load", FAILS_AT_LOAD,
               lies.config(q_lora_rank=lies.DROP), "q_lora_rank is not in config.json", True, MLA,
               lies.not_default("q_lora_rank"),
               fix="write q_lora_rank in the drafter's config.json"),
    Assumption("num-hidden-layers", f"num_hidden_layers -> decoder layers built; {_LOAD}",
               "the extra layer is built and served uninitialised, without an error", SERVES_WRONG,
               lies.config(num_hidden_layers=lambda c, t: c.get("num_hidden_layers", 1) + 1), "no tensors for layer",
               True, fix="write num_hidden_layers as the number of decoder layers"),
    Assumption("num-hidden-layers-absent", f"num_hidden_layers -> decoder layers built; {_LOAD}",
               "silent default (LlamaConfig 32, DeepseekV3Config 61 layers), all but the first served "
               "uninitialised", SERVES_WRONG, lies.config(num_hidden_layers=lies.DROP),
               "num_hidden_layers is not in config", True, fits=lies.not_default("num_hidden_layers"),
               fix="write num_hidden_layers as the number of decoder layers"),
    # vocabulary
    Assumption("draft-vocab-size", _VOCAB, "lm_head and d2t are built for the stated size: shape error at load",
               FAILS_AT_LOAD, lies.config(draft_vocab_size=lambda c, t: 2 * c["draft_vocab_size"]),
               "(draft_vocab_size, hidden_size)", True, fix="write draft_vocab_size: "),
    Assumption("draft-vocab-size-absent", _VOCAB,
               "silent default to vocab_size: lm_head is built for the full vocabulary, no draft-to-target map: "
               "fails at load", FAILS_AT_LOAD, lies.config(draft_vocab_size=lies.DROP),
               "draft_vocab_size is not in config.json", True, fix="write draft_vocab_size: "),
    Assumption("vocab-size", _WIDTH, "d2t's target ids past vocab_size fail the first draft step (index error)",
               FAILS_AT_STEP, lies.vocab_at_top_d2t_id, "but the drafter's vocab_size is", True,
               fits=lambda c, t: c.get("draft_vocab_size", t["vocab_size"]) < t["vocab_size"],
               fix="set the drafter's vocab_size to the target's"),
    Assumption("d2t-absent", f"{_VOCAB}; {_LOAD}",
               "draft_id_to_target_id stays all zeros: draft id i is proposed as target id i, without an error",
               SERVES_WRONG, lies.drop("d2t"), "no d2t tensor", True, fix="ship the drafter's d2t"),
    Assumption("d2t-outside-target", "d2t -> draft_id_to_target_id: Eagle3LlamaForCausalLM.compute_logits scatters "
               "the draft logits to draft id + d2t", "an index past the target vocabulary fails the first draft step",
               FAILS_AT_STEP, lies.tensors(lies.d2t_outside), "outside the target vocabulary", True,
               fix="use the drafter made for this target's vocabulary"),
    Assumption("d2t-length", _VOCAB, "draft_id_to_target_id has draft_vocab_size entries: shape error at load",
               FAILS_AT_LOAD, lies.tensors(lies.d2t_shorter), "d2t has", True,
               fix="else ship the d2t made with this lm_head"),
    Assumption("d2t-without-draft-vocabulary", _VOCAB,
               "no draft_id_to_target_id is built for a full vocabulary; loading d2t fails (\"There is no module "
               "or parameter named 'draft_id_to_target_id'\")", FAILS_AT_LOAD,
               lies.both(lies.config(draft_vocab_size=lambda c, t: t["vocab_size"]), lies.tensors(lies.identity_maps)),
               "a d2t tensor although the draft vocabulary is the target's", True, fix="remove d2t and t2d"),
    Assumption("t2d-inconsistent", "t2d: skipped by both classes' load_weights (\"t2d\" in name: continue)",
               "never read", IGNORES, lies.tensors(lies.t2d_empty), "t2d marks 0 target ids",
               False),
    Assumption("lm-head-absent", f"lm_head.weight; {_SHARE}",
               "the target's lm_head is put on the drafter and LogitsProcessor keeps its first draft_vocab_size rows: "
               "wrong drafts, without an error", SERVES_WRONG, lies.drop("lm_head.weight"),
               "no lm_head.weight but a draft vocabulary", True, fix="ship the drafter's own lm_head.weight"),
    Assumption("embed-tokens-shape", f"embed_tokens.weight: vocab_size x hidden_size; {_SHARE}",
               "shape error at load", FAILS_AT_LOAD, lies.tensors(lies.embed_narrow), "embed_tokens.weight is", True,
               fix="leave embed_tokens out"),
    # tensors
    Assumption("tensor-absent", _LOAD, "served uninitialised, without an error", SERVES_WRONG,
               lies.drop("midlayer.mlp.down_proj.weight"), "no midlayer.mlp.down_proj.weight", True,
               fix="ship the missing tensors"),
    Assumption("tensor-unknown", _LOAD,
               "fails at load (\"There is no module or parameter named ...\")", FAILS_AT_LOAD,
               lies.add_vector("midlayer.self_attn.rotary_scale.weight", lies.hidden, True),
               "have no parameter in vLLM's", True, fix="remove those tensors, or rename them"),
    Assumption("bias-dropped", f"attention_bias / mlp_bias; {_LOAD}: names ending in .bias without a parameter "
               "are ignored (ignore_unexpected_suffixes)", "dropped without a word", IGNORES,
               lies.add_vector("midlayer.self_attn.o_proj.bias", lies.hidden, True), "holds non-zero values", True,
               fix="set attention_bias in config.json"),
    Assumption("fc-absent", f"fc.weight; {_LOAD}", "fc served uninitialised, without an error", SERVES_WRONG,
               lies.drop("fc.weight"), "no fc.weight tensor", True, fix="ship the EAGLE-3 drafter's fc.weight"),
    Assumption("fc-width", _FC, "shape error at load", FAILS_AT_LOAD, lies.tensors(lies.fc_narrower),
               "does not take a whole number of", True, fix="its fc takes k states of the target's hidden size"),
    Assumption("input-norm-dropped", "norm_before_fc (top level or eagle_config): llama_eagle3.py "
               "Eagle3LlamaForCausalLM.load_weights maps input_norm.* to nothing without it",
               "dropped without a word", IGNORES,
               lies.add_vector("input_norm.weight", lambda c: 3 * lies.target_hidden(c), True),
               "norm_before_fc is not set", True, LLAMA, fix="set norm_before_fc in config.json"),
    Assumption("rope-yarn-short", _ROPE,
               "no error: positions past original_max_position_embeddings x factor index past the drafter's "
               "cos/sin cache", SERVES_WRONG, lies.config(max_position_embeddings=128, rope_scaling={
                   "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}),
               "RoPE (yarn) covers 128 positions", True, fix="serve with a --max-model-len the drafter's RoPE covers"),
    # weight files
    Assumption("weights-absent", _FILES, "\"Cannot find any model weights\" after the target's weights have loaded",
               FAILS_AT_LOAD, lies.no_weights, "no weight file vLLM reads", True,
               fix="ship the drafter's weights beside config.json"),
    Assumption("weights-other-format", _FILES, "a model.pth is not globbed: \"Cannot find any model weights\" after "
               "the target's weights have loaded", FAILS_AT_LOAD, lies.renamed("model.pth"),
               "model.pth, which vLLM's loader does not read", True, fix="save the weights as model.safetensors"),
    Assumption("weights-bin-with-objects", _FILES, "torch.load(weights_only=True) refuses the pickled object after "
               "the target's weights have loaded", FAILS_AT_LOAD, lies.bin_with_objects,
               "torch.load(weights_only=True), as vLLM loads it, refuses it", True,
               fix="save the state dict as safetensors"),
    Assumption("weights-index-missing-shard", _FILES, "FileNotFoundError (\"Weight files referenced in index but "
               "missing\") after the target's weights have loaded", FAILS_AT_LOAD, lies.index_missing_shard,
               "missing from", True, fix="add the missing shards"),
    Assumption("weights-stale-shard", _FILES, "both fc.weight copies are loaded in turn: a shape error after the "
               "target's weights have loaded", FAILS_AT_LOAD, lies.stale_shard(indexed=False),
               "written in more than one weight file: fc.weight in", True, fix="delete the stale file"),
    Assumption("weights-bin-fc-shape", f"{_FILES}; {_FC}", "a bare AssertionError in the fc's weight loader after "
               "the target's weights have loaded", FAILS_AT_LOAD, lies.both(lies.tensors(lies.fc_narrower),
                                                                        lies.as_torch("pytorch_model.bin")),
               "does not take a whole number of", True, fix="its fc takes k states of the target's hidden size"),
    Assumption("weights-bin-lm-head-rows", f"{_FILES}; {_VOCAB}", "shape error at load, after the target's weights",
               FAILS_AT_LOAD, lies.both(lies.tensors(lies.lm_head_rows), lies.as_torch("pytorch_model.bin")),
               "lm_head.weight is", True, fix="write draft_vocab_size: "),
    # sources that disagree, fields vLLM needs
    Assumption("aux-ids-two-sources-disagree", _IDS, "the top-level ids are served and the nested ones ignored "
               "without a word", SERVES, lies.both_ids(lambda ids: [1, *ids[:-1]]), "name different layers", True,
               fix="keep the ids the drafter was trained on in one place"),
    Assumption("architectures-absent", "architectures: config/model.py ModelConfig (the model registry) -> "
               "EAGLEConfig renames it Eagle3*", "\"Model architectures [...] are not supported\" with every class "
               "vLLM has, at start-up", FAILS_AT_START, lies.config(architectures=lies.DROP),
               "no architectures in config.json", True, fix="write architectures: ["),
    Assumption("draft-vocab-larger-than-target", _VOCAB, "lm_head and its map are built for more ids than the "
               "target has: shape error at load", FAILS_AT_LOAD,
               lies.both(lies.drop("d2t", "t2d"), lies.config(draft_vocab_size=lambda c, t: t["vocab_size"] + 64)),
               "is larger than the target's", True, fix="use the drafter made for this target"),
    # valid variants: must not be refused
    Assumption("weights-bin", _FILES, "pytorch_model.bin is read with torch.load(weights_only=True)", SERVES_SAME,
               lies.as_torch("pytorch_model.bin"), "", False),
    Assumption("weights-pt", _FILES, "model.pt is read when there is no *.safetensors or *.bin", SERVES_SAME,
               lies.as_torch("model.pt"), "", False),
    Assumption("weights-sharded-index", _FILES, "the shards the index lists", SERVES_SAME,
               lies.shards("safetensors", SAFETENSORS_INDEX), "", False),
    Assumption("weights-sharded-no-index", _FILES, "every *.safetensors", SERVES_SAME, lies.shards("safetensors", None),
               "", False),
    Assumption("weights-bin-sharded", _FILES, "every *.bin (their index is not read)", SERVES_SAME,
               lies.shards("bin", "pytorch_model.bin.index.json"), "", False),
    Assumption("weights-index-stale-shard", _FILES, "a shard the index does not list is not read", SERVES_SAME,
               lies.stale_shard(indexed=True), "", False),
    Assumption("aux-ids-final-layer", _IDS, "id L is the output of the last layer, captured after the layer loop "
               "(vllm#46973)", SERVES, lies.final_layer("layer_input"), "", False),
    Assumption("aux-ids-final-layer-specforge", _IDS, "SpecForge's L-1 ('output of layer k', nested) is vLLM's L: "
               "the fork translates it", SERVES, lies.final_layer("specforge"), "", False),
    Assumption("aux-ids-final-layer-stated-output", _IDS, "top-level L-1 with the convention stated layer_output is "
               "vLLM's L", SERVES, lies.final_layer("layer_output"), "", False),
    Assumption("aux-ids-two-sources-agree", _IDS, "top-level ids and SpecForge-style nested ids naming the same "
               "layers: the top-level ones are served", SERVES_SAME, lies.both_ids(lambda ids: [i - 1 for i in ids]),
               "", False),
    Assumption("lm-head-shared", f"{_VOCAB}; {_SHARE}",
               "a full-vocabulary drafter without lm_head, d2t or t2d gets the target's lm_head", SERVES,
               lies.both(lies.drop("lm_head.weight", "d2t", "t2d"),
                     lies.config(draft_vocab_size=lambda c, t: t["vocab_size"])), "", False),
    Assumption("embed-tokens-own", f"embed_tokens.weight; {_SHARE}",
               "its own embed_tokens equal to the target's: shared, as without one", SERVES_SAME,
               lies.tensors(lies.embed_from_target), "", False,
               fits=lambda cfg, target: cfg.get("hidden_size") == target.get("hidden_size")),
    Assumption("extra-config-keys", "config.json keys no drafter class reads (tie_word_embeddings, torch_dtype: "
               "the drafter runs in the target's dtype, config/speculative.py)", "ignored", SERVES_SAME,
               lies.config(tie_word_embeddings=True, torch_dtype="float16", transformers_version="4.57.1",
                       use_cache=True, training={"epochs": 3, "lr": 1e-4}), "", False),
    Assumption("head-dim-own", _LAYER.format(field="head_dim"),
               "a head_dim other than hidden_size / num_attention_heads, with tensors to match", SERVES,
               lies.both(lies.tensors(lies.wider_heads), lies.config(head_dim=lambda c, t: 2 * lies.head_dim(c))), "",
               False, LLAMA),
    Assumption("bias-zero", f"{_LOAD}: .bias names without a parameter are ignored",
               "an all-zero bias is dropped, which changes nothing", SERVES_SAME,
               lies.add_vector("midlayer.self_attn.o_proj.bias", lies.hidden, False), "", False),
    Assumption("t2d-absent", "t2d: never read", "served as the original", SERVES_SAME, lies.drop("t2d"), "", False),
    Assumption("aux-ids-unsorted", _IDS, "the states are captured in layer order whatever the ids' order",
               SERVES_SAME, lies.config(**{IDS_FIELD: lambda c, t: list(reversed(lies.aux_ids(c)))}), "", False),
    Assumption("vocab-size-larger", _WIDTH, "a vocab_size above the target's only widens the -inf logits row",
               SERVES_SAME, lies.config(vocab_size=lambda c, t: 2 * t["vocab_size"]), "", False),
    Assumption("weights-float32", "tensor dtypes: default_weight_loader copies into the drafter's parameters, in "
               "the target's dtype", "float32 copies of bf16 weights load to the same values", SERVES_SAME,
               lies.tensors(lies.float32), "", False),
    Assumption("d2t-int32", "d2t dtype: copied into the int64 draft_id_to_target_id", "same offsets", SERVES_SAME,
               lies.tensors(lies.d2t_int32), "", False),
    Assumption("rope-yarn-long", _ROPE,
               "a YaRN drafter whose max_position_embeddings is short but whose factor covers the context",
               SERVES, lies.config(max_position_embeddings=128, rope_scaling={
                   "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 128}), "", False),
)


def entries(drafter: Path, target: Path) -> list[Assumption]:
    """The entries of :data:`ASSUMPTIONS` that apply to the good drafter folder ``drafter`` and ``target``."""
    return [entry for entry in ASSUMPTIONS if entry.applies(drafter, target)]


def make_copy(entry: Assumption, drafter: Path, target: Path, dest: Path) -> Path:
    """Copy the good drafter folder to ``dest`` and apply the entry's ``lie`` there; returns ``dest``.

    Raises:
        KimiError: the drafter is not a single-file checkpoint with top-level aux ids.
    """
    shutil.copytree(drafter, dest)
    entry.lie(dest, target)
    return dest


def message(report) -> str:
    """What inspect says about a copy: its problems and notes, joined ('' when it says nothing)."""
    return "; ".join(report.problems + report.notes)


def assumption_table(drafter: Path, target: Path) -> list[dict]:
    """One row per entry for a good drafter folder and its target folder.

    Rows: ``name``, ``reads``, ``upstream_behaviour`` (outcome: detail), ``message`` (``kimi drafter
    inspect``'s problems and notes for the lying copy, or why it cannot read it; '' when it says nothing), ``valid``
    (a valid variant),
    ``refused`` (whether ``vllm serve`` on the fork stops, by the same findings).

    Raises:
        KimiError: unreadable folders, or a drafter the lies cannot be written into (see :func:`make_copy`).
    """
    from kimi.drafter.serve_checks import SERVE_BLOCKING

    rows = []
    with tempfile.TemporaryDirectory(prefix="kimi-assumptions-") as tmp:
        for entry in entries(drafter, target):
            try:
                report = inspect(make_copy(entry, drafter, target, Path(tmp) / entry.name), target)
            except KimiError as exc:  # weight files it cannot read: refused as they are
                said, refused = str(exc), True
            else:
                said, refused = message(report), bool(report.blocking(SERVE_BLOCKING))
            rows.append({"name": entry.name, "reads": entry.reads,
                         "upstream_behaviour": f"{entry.outcome}: {entry.upstream}", "message": said,
                         "valid": entry.valid, "refused": refused})
    return rows
