"""Reference models: a small DeepSeek-V3-architecture target, its Kimi-K2.5 wrapper and two EAGLE-3 drafters.

Written in the DeepSeek-V3 checkpoint layout (``model.layers.N.self_attn.q_a_proj``,
``kv_a_proj_with_mqa``, ``kv_b_proj``, ``mlp.experts.J.gate_proj``,
``mlp.gate.e_score_correction_bias``, ``mlp.shared_experts.*``; the names of
transformers' ``DeepseekV3ForCausalLM`` and vLLM's ``deepseek_v2.py``):

* MLA with the real head geometry: kv_lora_rank 512, qk_rope_head_dim 64,
  qk_nope_head_dim 128, v_head_dim 128, q_lora_rank set;
* MoE with sigmoid ``noaux_tc`` grouped routing and its correction bias, one
  shared expert, the first layer dense (``first_k_dense_replace: 1``);
* EAGLE-3 drafters: Llama-style (``LlamaForCausalLMEagle3``: ``midlayer.*``,
  ``fc``, ``norm``, ``lm_head`` over a draft vocabulary, ``d2t``, ``t2d``) and
  MLA-style (``Eagle3DeepseekV3ForCausalLM``), both with explicit aux layer
  ids in vLLM's convention.  The draft vocabulary is the most frequent tokens
  of the training corpus (ties by id).
* a Kimi-K2.5 multimodal wrapper (``KimiK25ForConditionalGeneration``) around the
  same text weights, with a small vision tower (``kimi.models.kimi_k25``).

Weights are random (normal, std 0.02; norms 1) from ``torch.Generator(seed)``;
the same seed, spec and Python minor version give the same files (the
tokenizer's corpus is the stdlib, see ``kimi.models.tokenizer``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD, LAYER_INPUT, default_ids
from kimi.fork.fsutil import check_replaceable, default_mode, sha256_file, staged_folder, write_atomic
from kimi.log import sayer
from kimi.models import OUTPUT_KEYS, kimi_k25
from kimi.models.kimi_k25 import VisionSpec
from kimi.models.tokenizer import SPECIAL_TOKENS, save_tokenizer, stdlib_corpus, train_tokenizer


@dataclass(frozen=True)
class ReferenceSpec:
    """Dimensions of the reference target and drafters (small enough for a sub-second CPU decode step)."""

    hidden: int = 256
    layers: int = 8
    heads: int = 4
    q_lora_rank: int = 192
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    intermediate: int = 512
    moe_intermediate: int = 128
    experts: int = 16
    shared_experts: int = 1
    experts_per_token: int = 4
    groups: int = 4
    topk_groups: int = 2
    vocab: int = 4096
    draft_vocab: int = 1024
    max_positions: int = 4096
    seed: int = 0
    vision: VisionSpec = VisionSpec()


def target_config(spec: ReferenceSpec, bos: int, eos: int) -> dict:
    """``config.json`` of the target (DeepSeek-V3 fields as in the released checkpoints)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.heads, "q_lora_rank": spec.q_lora_rank, "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim, "qk_nope_head_dim": spec.qk_nope_head_dim,
        "v_head_dim": spec.v_head_dim, "intermediate_size": spec.intermediate,
        "moe_intermediate_size": spec.moe_intermediate, "n_routed_experts": spec.experts,
        "n_shared_experts": spec.shared_experts, "num_experts_per_tok": spec.experts_per_token,
        "n_group": spec.groups, "topk_group": spec.topk_groups, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "vocab_size": spec.vocab, "max_position_embeddings": spec.max_positions, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16",
    }


class _Weights:
    """Deterministic bf16 tensors: fan-in scaled normal matrices (std 1/sqrt(cols)), unit norms.

    With every projection keeping unit variance, each layer adds an O(1) update to the residual stream,
    so a token's output depends on its context; with the usual 0.02 init the stream is its own
    embedding and greedy decoding falls into one-token loops whose logits cross by arbitrarily small
    margins (where any change in summation order flips the argmax).
    """

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.gen = torch.Generator().manual_seed(seed)

    def matrix(self, rows: int, cols: int):
        return (self.torch.randn(rows, cols, generator=self.gen) * cols**-0.5).to(self.torch.bfloat16)

    def norm(self, n: int):
        return self.torch.ones(n, dtype=self.torch.bfloat16)

    def bias(self, n: int):
        return self.torch.randn(n, generator=self.gen) * 0.01  # float32, as DeepSeek-V3 ships it


def _mla(w: _Weights, p: str, spec: ReferenceSpec, in_features: int) -> dict:
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    return {
        f"{p}q_a_proj.weight": w.matrix(spec.q_lora_rank, in_features),
        f"{p}q_a_layernorm.weight": w.norm(spec.q_lora_rank),
        f"{p}q_b_proj.weight": w.matrix(spec.heads * qk, spec.q_lora_rank),
        f"{p}kv_a_proj_with_mqa.weight": w.matrix(spec.kv_lora_rank + spec.qk_rope_head_dim, in_features),
        f"{p}kv_a_layernorm.weight": w.norm(spec.kv_lora_rank),
        f"{p}kv_b_proj.weight": w.matrix(spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank),
        f"{p}o_proj.weight": w.matrix(spec.hidden, spec.heads * spec.v_head_dim),
    }


def _mlp(w: _Weights, p: str, hidden: int, inter: int) -> dict:
    return {f"{p}gate_proj.weight": w.matrix(inter, hidden), f"{p}up_proj.weight": w.matrix(inter, hidden),
            f"{p}down_proj.weight": w.matrix(hidden, inter)}


def target_weights(spec: ReferenceSpec) -> dict:
    """The target's tensors in the DeepSeek-V3 checkpoint layout."""
    w = _Weights(spec.seed)
    out = {"model.embed_tokens.weight": w.matrix(spec.vocab, spec.hidden), "model.norm.weight": w.norm(spec.hidden),
           "lm_head.weight": w.matrix(spec.vocab, spec.hidden)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out[f"{p}input_layernorm.weight"] = w.norm(spec.hidden)
        out[f"{p}post_attention_layernorm.weight"] = w.norm(spec.hidden)
        out.update(_mla(w, f"{p}self_attn.", spec, spec.hidden))
        if i == 0:
            out.update(_mlp(w, f"{p}mlp.", spec.hidden, spec.intermediate))
            continue
        out[f"{p}mlp.gate.weight"] = w.matrix(spec.experts, spec.hidden)
        out[f"{p}mlp.gate.e_score_correction_bias"] = w.bias(spec.experts)
        for j in range(spec.experts):
            out.update(_mlp(w, f"{p}mlp.experts.{j}.", spec.hidden, spec.moe_intermediate))
        out.update(_mlp(w, f"{p}mlp.shared_experts.", spec.hidden, spec.moe_intermediate * spec.shared_experts))
    return out


def draft_vocabulary(token_counts: np.ndarray, draft_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``d2t`` (int64 offsets) and ``t2d`` (bool mask) for the ``draft_vocab`` most frequent target ids.

    Args:
        token_counts: int64 [target_vocab], occurrences of each token in the corpus.
        draft_vocab: size of the draft vocabulary.

    Returns:
        (d2t [draft_vocab] int64 with target_id = draft_id + d2t[draft_id],
         t2d [target_vocab] bool), in the EAGLE-3 reference layout.
    """
    order = np.lexsort((np.arange(len(token_counts)), -token_counts))  # by count, then by id
    chosen = np.sort(order[:draft_vocab]).astype(np.int64)
    t2d = np.zeros(len(token_counts), dtype=bool)
    t2d[chosen] = True
    return chosen - np.arange(draft_vocab, dtype=np.int64), t2d


def drafter_common(spec: ReferenceSpec, ids: tuple[int, ...]) -> dict:
    """``config.json`` fields every EAGLE-3 drafter of ``spec`` shares: sizes, vocabularies, aux ids ``ids``."""
    return {"num_hidden_layers": 1, "vocab_size": spec.vocab, "draft_vocab_size": spec.draft_vocab,
            "target_hidden_size": spec.hidden, "hidden_size": spec.hidden,
            "max_position_embeddings": spec.max_positions,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", IDS_FIELD: list(ids), CONVENTION_FIELD: LAYER_INPUT,
            "num_aux_hidden_states": len(ids)}


def _drafter_head(w: _Weights, spec: ReferenceSpec, d2t: np.ndarray, t2d: np.ndarray, states: int) -> dict:
    torch = w.torch
    return {"fc.weight": w.matrix(spec.hidden, states * spec.hidden), "norm.weight": w.norm(spec.hidden),
            "lm_head.weight": w.matrix(spec.draft_vocab, spec.hidden), "d2t": torch.from_numpy(d2t),
            "t2d": torch.from_numpy(t2d), "midlayer.input_layernorm.weight": w.norm(spec.hidden),
            "midlayer.hidden_norm.weight": w.norm(spec.hidden),
            "midlayer.post_attention_layernorm.weight": w.norm(spec.hidden)}


def llama_drafter(spec: ReferenceSpec, ids: tuple[int, ...], d2t: np.ndarray, t2d: np.ndarray) -> tuple[dict, dict]:
    """(config, tensors) of the Llama-style EAGLE-3 drafter (attention over [embedding, hidden])."""
    head_dim = spec.hidden // spec.heads
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **drafter_common(spec, ids),
              "num_attention_heads": spec.heads, "num_key_value_heads": spec.heads, "head_dim": head_dim,
              "intermediate_size": spec.intermediate}
    w = _Weights(spec.seed + 1)
    q = spec.heads * head_dim
    tensors = {**_drafter_head(w, spec, d2t, t2d, len(ids)),
               "midlayer.self_attn.q_proj.weight": w.matrix(q, 2 * spec.hidden),
               "midlayer.self_attn.k_proj.weight": w.matrix(q, 2 * spec.hidden),
               "midlayer.self_attn.v_proj.weight": w.matrix(q, 2 * spec.hidden),
               "midlayer.self_attn.o_proj.weight": w.matrix(spec.hidden, q),
               **_mlp(w, "midlayer.mlp.", spec.hidden, spec.intermediate)}
    return config, tensors


def mla_drafter(spec: ReferenceSpec, ids: tuple[int, ...], d2t: np.ndarray, t2d: np.ndarray) -> tuple[dict, dict]:
    """(config, tensors) of the MLA-style EAGLE-3 drafter (``Eagle3DeepseekV3ForCausalLM``)."""
    # model_type kimi_k2, as Kimi's MLA drafters ship: vLLM turns a deepseek_v3 draft config into its MTP
    # model (SpeculativeConfig.hf_config_override), and treats kimi_k2 as MLA with patch 0005.
    config = {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
              **drafter_common(spec, ids), "num_attention_heads": spec.heads, "num_key_value_heads": spec.heads,
              "q_lora_rank": spec.q_lora_rank, "kv_lora_rank": spec.kv_lora_rank,
              "qk_rope_head_dim": spec.qk_rope_head_dim, "qk_nope_head_dim": spec.qk_nope_head_dim,
              "v_head_dim": spec.v_head_dim, "intermediate_size": spec.intermediate,
              "first_k_dense_replace": 1}
    w = _Weights(spec.seed + 2)
    tensors = {**_drafter_head(w, spec, d2t, t2d, len(ids)), **_mla(w, "midlayer.self_attn.", spec, 2 * spec.hidden),
               **_mlp(w, "midlayer.mlp.", spec.hidden, spec.intermediate)}
    return config, tensors


def _write_model(folder: Path, config: dict, tensors: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(folder / "model.safetensors", default_mode())


def write_kimi_k25(folder: Path, text: dict, text_tensors: dict, vision_tensors: dict, vision: VisionSpec,
                   tokenizer, max_positions: int) -> dict:
    """Write a Kimi-K2.5 wrapper (``KimiK25ForConditionalGeneration``) into the new folder ``folder``.

    Args:
        text: the text model's config.json (a DeepSeek-V3 dict); ``text_tensors`` its tensors (checkpoint names).
        vision_tensors: the tower's and projector's tensors (``kimi_k25.vision_weights`` names and shapes).
        tokenizer: the text model's ``tokenizers.Tokenizer``; written with the image placeholder named
            (``kimi_k25.media_tokenizer``) and ``max_positions`` as its length.

    Returns:
        The manifest's ``kimi_k25`` entry: architecture, placeholder id and token.
    """
    renamed, media_id = kimi_k25.media_tokenizer(tokenizer)
    _write_model(folder, kimi_k25.wrapper_config(text, vision, media_id),
                 {**kimi_k25.text_weights(text_tensors), **vision_tensors})
    preprocessor = kimi_k25.preprocessor_config(vision)
    write_atomic(folder / "preprocessor_config.json", json.dumps(preprocessor, indent=2) + "\n")
    save_tokenizer(renamed, folder, max_positions, pad_token=SPECIAL_TOKENS[1])
    return {"architecture": kimi_k25.ARCHITECTURE, "media_placeholder_token_id": media_id,
            "media_placeholder_token": kimi_k25.MEDIA_TOKEN,
            "note": f"the target's tokenizer with {kimi_k25.REPLACED_TOKEN} renamed {kimi_k25.MEDIA_TOKEN} "
                    "(same id; pad is <|eos|>); text weights = the target's under language_model."}


say = sayer("models")


def make_reference_models(out: Path, spec: ReferenceSpec = ReferenceSpec(), force: bool = False) -> dict:
    """Write ``out/target``, ``out/kimi-k25``, ``out/drafter-llama``, ``out/drafter-mla`` and ``out/MANIFEST.json``.

    Everything is written in a temporary folder beside ``out`` and renamed
    into place.

    Returns:
        The manifest: spec, corpus (Python version, file count, bytes, sha256),
        aux layer ids, and the sha256 of every file written.

    Raises:
        KimiError: ``out`` exists (without ``force``), is not an earlier output of this command
            (``OUTPUT_KEYS["make"]``), holds the working directory, or writing fails (nothing is left behind).
    """
    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), marker_keys=OUTPUT_KEYS["make"])
    corpus = stdlib_corpus()
    say(f"training the tokenizer on {len(corpus.files)} stdlib files ({corpus.nbytes / 1e6:.1f} MB, "
        f"Python {corpus.python})")
    tokenizer = train_tokenizer(corpus, spec.vocab)
    counts = np.zeros(spec.vocab, dtype=np.int64)
    for encoding in tokenizer.encode_batch([p.read_text(errors="replace") for p in corpus.files]):
        counts += np.bincount(np.asarray(encoding.ids, dtype=np.int64), minlength=spec.vocab)
    d2t, t2d = draft_vocabulary(counts, spec.draft_vocab)
    ids = default_ids(spec.layers)
    bos, eos = tokenizer.token_to_id(SPECIAL_TOKENS[0]), tokenizer.token_to_id(SPECIAL_TOKENS[1])
    with staged_folder(out) as staging:
        say(f"writing the target ({spec.layers} layers, MLA, {spec.experts} experts), its Kimi-K2.5 wrapper "
            "and two drafters")
        text, weights = target_config(spec, bos, eos), target_weights(spec)
        _write_model(staging / "target", text, weights)
        save_tokenizer(tokenizer, staging / "target", spec.max_positions)
        vision = kimi_k25.vision_weights(_Weights(spec.seed + 3), spec.vision, spec.hidden)  # a random tower
        wrapper = write_kimi_k25(staging / "kimi-k25", text, weights, vision, spec.vision, tokenizer,
                                 spec.max_positions)
        for name, make in (("drafter-llama", llama_drafter), ("drafter-mla", mla_drafter)):
            _write_model(staging / name, *make(spec, ids, d2t, t2d))
        manifest = {
            "spec": asdict(spec), "aux_layer_ids": list(ids), "kimi_k25": wrapper,
            "corpus": {"python": corpus.python, "files": len(corpus.files), "bytes": corpus.nbytes,
                       "sha256": corpus.digest},
            "files": {p.relative_to(staging).as_posix(): sha256_file(p)
                      for p in sorted(staging.rglob("*")) if p.is_file()},
        }
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out}")
    return manifest
