"""The trained reference target: a small DeepSeek-V3-architecture LM trained on the stdlib's source.

``kimi models train-target OUT`` (default ``.kimi/models/trained/target``) trains transformers'
``DeepseekV3ForCausalLM`` (MLA, sigmoid ``noaux_tc`` MoE with a shared expert, first layer dense) of
:data:`TRAINED_SPEC` on the reference tokenizer's corpus (``kimi.models.tokenizer.stdlib_corpus``:
the stdlib without its tests and without the held-out packages used for prompts) and writes it in the
DeepSeek-V3 checkpoint layout (experts unfused: ``mlp.experts.J.gate_proj``), bf16, with the tokenizer
and a ``MANIFEST.json`` (spec, steps, loss, seconds, corpus digest, file digests).

Deterministic: the tokenizer is trained on the same sorted files, the weights start from
``torch.manual_seed(seed)`` and the training windows come from ``torch.Generator(seed)``; one thread
count and one torch build give the same files. It is small enough to train on 2 CPU cores in a few
minutes; its greedy code is repetitive, which is what a drafter can learn.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kimi.fork.fsutil import check_replaceable, sha256_file, staged_folder, write_atomic
from kimi.log import sayer
from kimi.models.reference import ReferenceSpec, target_config
from kimi.models.tokenizer import SPECIAL_TOKENS, save_tokenizer, stdlib_corpus, train_tokenizer

#: (qk_nope, qk_rope, v) head dims that vLLM 0.26.0's FLASH_ATTN MLA prefill takes on CUDA (``supports_mla_dimensions``
#: in ``vllm/v1/attention/backends/mla/prefill/flash_attn.py``); a target outside them runs on CPU, but no GPU engine
#: starts ("No valid MLA prefill backend found").
GPU_MLA_PREFILL_HEAD_DIMS = frozenset({(128, 64, 128), (192, 64, 256), (64, 64, 128)})

#: Dimensions of the trained target: the reference's 8 layers, vocabulary and MLA heads, narrower elsewhere.
#: MLA keeps Kimi's head geometry: vLLM's MLA decode backends take only kv_lora_rank + qk_rope_head_dim = 576,
#: and the prefill head dims must be in :data:`GPU_MLA_PREFILL_HEAD_DIMS`.
TRAINED_SPEC = replace(ReferenceSpec(), hidden=128, heads=4, q_lora_rank=64, qk_nope_head_dim=128, v_head_dim=128,
                       intermediate=384, moe_intermediate=64, experts=8, experts_per_token=2, groups=2, topk_groups=1,
                       max_positions=2048)


@dataclass(frozen=True)
class TargetTraining:
    """Optimisation settings of :func:`train_target` (defaults: a few minutes on 2 CPU cores)."""

    steps: int = 160
    batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2


say = sayer("models")


def corpus_tokens(tokenizer, files: list[Path]):
    """All corpus files encoded and joined with ``<|eos|>``: int64 tensor [n_tokens]."""
    import torch

    eos = tokenizer.token_to_id(SPECIAL_TOKENS[1])
    ids: list[int] = []
    for enc in tokenizer.encode_batch([p.read_text(errors="replace") for p in files]):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def checkpoint_tensors(state: dict, dtype) -> dict:
    """transformers' DeepSeek-V3 state dict in the checkpoint layout: fused experts split per expert.

    ``mlp.experts.gate_up_proj`` [E, 2*I, H] becomes ``mlp.experts.J.gate_proj.weight`` [I, H] (first half)
    and ``up_proj.weight`` (second half); ``down_proj`` [E, H, I] becomes ``experts.J.down_proj.weight``.
    The routing correction bias stays float32, as DeepSeek-V3 ships it.
    """
    out = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix, inter = name.removesuffix("gate_up_proj"), tensor.shape[1] // 2
            for j, w in enumerate(tensor):
                out[f"{prefix}{j}.gate_proj.weight"] = w[:inter].to(dtype).contiguous()
                out[f"{prefix}{j}.up_proj.weight"] = w[inter:].to(dtype).contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for j, w in enumerate(tensor):
                out[f"{prefix}{j}.down_proj.weight"] = w.to(dtype).contiguous()
        elif name.endswith("e_score_correction_bias"):
            out[name] = tensor.float().contiguous()
        else:
            out[name] = tensor.to(dtype).contiguous()
    return out


def _lr(step: int, cfg: TargetTraining) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _train(model, tokens, cfg: TargetTraining) -> list[float]:
    """AdamW on random windows of ``tokens``; returns the loss of every step."""
    import torch
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    losses: list[float] = []
    model.train()
    bar = tqdm(range(cfg.steps), desc="train-target", file=sys.stderr, mininterval=5)
    for step in bar:
        starts = torch.randint(0, len(tokens) - cfg.seq_len - 1, (cfg.batch,), generator=gen)
        batch = torch.stack([tokens[s:s + cfg.seq_len] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}", refresh=False)
    return losses


def train_target(out: Path, spec: ReferenceSpec = TRAINED_SPEC, cfg: TargetTraining = TargetTraining(),
                 force: bool = False) -> dict:
    """Train the target and write ``out`` (config, bf16 safetensors, tokenizer, MANIFEST.json) atomically.

    Returns:
        The manifest: spec, training settings, per-step loss, seconds, corpus identity, file digests.

    Raises:
        KimiError: ``out`` exists (without ``force``) or is not an earlier output.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),))
    torch.set_num_threads(cfg.threads)
    corpus = stdlib_corpus()
    say(f"training the tokenizer on {len(corpus.files)} stdlib files (Python {corpus.python})")
    tokenizer = train_tokenizer(corpus, spec.vocab)
    tokens = corpus_tokens(tokenizer, corpus.files)
    bos, eos = tokenizer.token_to_id(SPECIAL_TOKENS[0]), tokenizer.token_to_id(SPECIAL_TOKENS[1])
    config = target_config(spec, bos, eos)
    torch.manual_seed(cfg.seed)
    hf_config = DeepseekV3Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    hf_config._experts_implementation = "grouped_mm"  # several times faster than the per-expert loop on CPU
    model = DeepseekV3ForCausalLM(hf_config)
    say(f"training the target ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters) for "
        f"{cfg.steps} steps x {cfg.batch} x {cfg.seq_len} tokens on {len(tokens) / 1e6:.2f} M corpus tokens")
    started = time.monotonic()
    losses = _train(model, tokens, cfg)
    seconds = time.monotonic() - started
    with staged_folder(out) as staging:
        staging.mkdir(parents=True, exist_ok=True)
        write_atomic(staging / "config.json", json.dumps(config, indent=2) + "\n")
        save_file(checkpoint_tensors(model.state_dict(), torch.bfloat16), str(staging / "model.safetensors"),
                  metadata={"format": "pt"})
        save_tokenizer(tokenizer, staging, spec.max_positions)
        manifest = {"spec": asdict(spec), "training": asdict(cfg), "seconds": round(seconds, 1),
                    "final_loss": sum(losses[-10:]) / len(losses[-10:]), "loss": [round(x, 4) for x in losses],
                    "corpus": {"python": corpus.python, "files": len(corpus.files), "sha256": corpus.digest,
                               "tokens": len(tokens)},
                    "files": {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out} (loss {manifest['final_loss']:.3f} after {seconds:.0f} s)")
    return manifest
