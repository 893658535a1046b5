"""The trained reference target: a small DeepSeek-V3-architecture LM trained on the stdlib's source.

``kimi models train-target OUT`` (default ``.kimi/models/trained/target``) trains transformers'
``DeepseekV3ForCausalLM`` (MLA, sigmoid ``noaux_tc`` MoE with a shared expert, first layer dense) of
:data:`TRAINED_SPEC` on the reference tokenizer's corpus (``kimi.models.tokenizer.stdlib_corpus``:
the stdlib without its tests and without the held-out packages used for prompts) and writes it in the
DeepSeek-V3 checkpoint layout (experts unfused: ``mlp.experts.J.gate_proj``), bf16, with the tokenizer
and a ``MANIFEST.json`` (spec, steps, loss, seconds, corpus digest, file digests).

Seeded: the tokenizer is trained on the same sorted files, the weights start from ``torch.manual_seed(seed)``
and the training windows come from ``torch.Generator(seed)``; with a step budget (the CPU recipe) one thread count
and one torch build give the same files, while a time budget (``max_seconds``, the H200 recipe) stops after as
many steps as the device manages, recorded in the manifest. The shipped target is ``--recipe h200-unlikelihood``
(:data:`H200_UNLIKELIHOOD_TRAINING`); the CPU recipe trains a weak one in minutes.
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
from kimi.models import OUTPUT_KEYS
from kimi.models.reference import ReferenceSpec, target_config
from kimi.models.selection import greedy_quality
from kimi.models.tokenizer import (
    MAX_CORPUS_BYTES,
    SPECIAL_TOKENS,
    held_out_files,
    save_tokenizer,
    site_corpus,
    stdlib_corpus,
    train_tokenizer,
)

#: (qk_nope, qk_rope, v) head dims that vLLM's FLASH_ATTN MLA prefill takes on CUDA (``supports_mla_dimensions``
#: in ``vllm/v1/attention/backends/mla/prefill/flash_attn.py``, the same set in the v0.26 and v0.32 lines' releases); a
#: target outside them runs on CPU, but no GPU engine starts ("No valid MLA prefill backend found").
GPU_MLA_PREFILL_HEAD_DIMS = frozenset({(128, 64, 128), (192, 64, 256), (64, 64, 128)})

#: Dimensions of the trained target (the shipped pair's, ``models/pair/target``): 6 layers 192 wide, 2 MLA heads
#: with Kimi's latent geometry (vLLM's MLA decode backends take only kv_lora_rank + qk_rope_head_dim = 576; the
#: prefill head dims (64, 64, 128) are in :data:`GPU_MLA_PREFILL_HEAD_DIMS`), 8 routed experts of 48 plus the
#: shared one, first layer dense, 8192 positions. 5.4 M parameters: 10.25 MiB in bf16; with its drafter the pair is
#: 12.4 MiB (the tracked tree travels with every device call).
TRAINED_SPEC = replace(ReferenceSpec(), hidden=192, layers=6, heads=2, q_lora_rank=64, qk_nope_head_dim=64,
                       v_head_dim=128, intermediate=384, moe_intermediate=48, experts=8, experts_per_token=2,
                       groups=2, topk_groups=1, max_positions=8192)


@dataclass(frozen=True)
class TargetTraining:
    """Optimisation settings of :func:`train_target` (defaults: a few minutes on 2 CPU cores, a weak model).

    The learning rate warms up linearly, then follows a cosine to a tenth of ``lr``; its progress is
    ``max(step / steps, elapsed / max_seconds)``, so a time budget ends the schedule properly instead of
    cutting it. The last ``long_share`` of that progress trains on ``long_seq_len``-token windows (batch
    scaled to keep the tokens per step), so the positions up to the context length are trained too.
    """

    steps: int = 160
    batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    max_seconds: float | None = None
    long_share: float = 0.0
    long_seq_len: int = 8192
    corpus_bytes: int = MAX_CORPUS_BYTES
    site_bytes: int = 0  # more training code from the installed packages (kimi.models.tokenizer.site_corpus)
    eval_windows: int = 64
    #: Seconds of sequence-level unlikelihood fine-tuning after the next-token training (kimi.models.unlikelihood;
    #: 0: none) and the weight of its term.
    unlikelihood_seconds: float = 0.0
    unlikelihood_weight: float = 1.0


#: The recipe of the formerly shipped target: one H200 (bf16 autocast), 390 s of training on the whole stdlib
#: corpus (2.9 M tokens of the host's Python 3.12). It memorises that corpus (5483 steps, ~124 epochs: corpus loss 0.84,
#: held-out 4.13) and writes varied, plausible stdlib-style code. This recipe with ``site_bytes=150_000_000``
#: (``--site-mb 150``) and a 360 s budget (58 M tokens, 5.4 epochs) generalises far better (held-out loss 2.32) but its
#: greedy code loops (6 of 8 held-out prompts ended repeating one n-gram; distinct-2 0.28 against 0.68 for that one): a
#: drafter would be measured on trivial loops, which is what this pair must not do. So did 10, 25, 50 and 100 MB trained
#: side by side (``benchmarks/train_targets.sh``: held-out 2.65-2.69, loop share 0.25-0.56 on the selection prompts;
#: benchmarks/results/logs/pair-target-h200/README.md).
H200_TRAINING = TargetTraining(steps=12000, batch=64, seq_len=1024, lr=2e-3, warmup=300, weight_decay=0.1,
                               threads=8, device="cuda", max_seconds=390.0, long_share=0.08,
                               corpus_bytes=40_000_000)

#: The way out of that tension: the same 25 MB of installed packages' code for 170 s, then 190 s of
#: sequence-level unlikelihood against greedy repeats (:mod:`kimi.models.unlikelihood`, weight 4). On one H200 it
#: generalised (held-out 2.56) without looping: loop share 0.00 and distinct-2 0.60 on the selection prompts
#: (benchmarks/results/logs/pair-unlikelihood-h200/README.md, target ``ul4b``); the same with 230 + 170 s sharing
#: the GPU with a second run (``ul4``) gave a drafter served at tau 2.29 (k = 3) with a shifted-id gap of 0.36.
H200_UNLIKELIHOOD_TRAINING = replace(H200_TRAINING, site_bytes=25_000_000, max_seconds=170.0,
                                     unlikelihood_seconds=190.0, unlikelihood_weight=4.0)

#: Recipes by the name ``kimi models train-target --recipe`` takes.
RECIPES = {"cpu": TargetTraining(), "h200": H200_TRAINING, "h200-unlikelihood": H200_UNLIKELIHOOD_TRAINING}

#: How transformers may run the routed experts (``config._experts_implementation``), fastest first: the
#: first that runs a training step on this device is used (grouped_mm needs CUDA bf16 in some torch builds).
EXPERTS_IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")


say = sayer("models")


def corpus_tokens(tokenizer, files: list[Path], batch: int = 512):
    """All corpus files encoded and joined with ``<|eos|>``: int64 tensor [n_tokens]."""
    import numpy as np
    import torch

    eos = np.array([tokenizer.token_to_id(SPECIAL_TOKENS[1])], dtype=np.int32)
    parts = []
    for first in range(0, len(files), batch):
        texts = [p.read_text(errors="replace") for p in files[first:first + batch]]
        for enc in tokenizer.encode_batch(texts):
            parts += [np.asarray(enc.ids, dtype=np.int32), eos]
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)).long()


def checkpoint_tensors(state: dict, dtype) -> dict:
    """transformers' DeepSeek-V3 state dict in the checkpoint layout: fused experts split per expert.

    ``mlp.experts.gate_up_proj`` [E, 2*I, H] becomes ``mlp.experts.J.gate_proj.weight`` [I, H] (first half)
    and ``up_proj.weight`` (second half); ``down_proj`` [E, H, I] becomes ``experts.J.down_proj.weight``.
    The routing correction bias stays float32, as DeepSeek-V3 ships it.
    """
    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
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


class _Schedule:
    """Progress in [0, 1] by steps or wall time (whichever is further), and the learning rate at it."""

    def __init__(self, cfg: TargetTraining) -> None:
        self.cfg, self.started = cfg, time.monotonic()

    def progress(self, step: int) -> float:
        by_time = (time.monotonic() - self.started) / self.cfg.max_seconds if self.cfg.max_seconds else 0.0
        return min(1.0, max(step / self.cfg.steps, by_time))

    def lr(self, step: int, progress: float) -> float:
        cfg = self.cfg
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _windows(tokens, count: int, seq_len: int, gen):
    """``count`` windows of ``seq_len`` tokens at seeded random starts: [count, seq_len] on ``tokens``' device."""
    import torch

    starts = torch.randint(0, len(tokens) - seq_len - 1, (count,), generator=gen)
    index = starts[:, None] + torch.arange(seq_len)[None, :]
    return tokens[index.to(tokens.device)]


def _autocast(device: str):
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def _pick_experts_implementation(model, tokens, cfg: TargetTraining) -> str:
    """Set the first of :data:`EXPERTS_IMPLEMENTATIONS` that runs a forward and backward here; returns it."""
    import torch

    probe = _windows(tokens, 2, 16, torch.Generator().manual_seed(cfg.seed))
    errors = []
    for name in EXPERTS_IMPLEMENTATIONS:
        model.config._experts_implementation = name
        try:
            with _autocast(cfg.device):
                model(input_ids=probe, labels=probe).loss.backward()
        except Exception as exc:  # noqa: BLE001 (any failure means: try the next implementation)
            errors.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        finally:
            model.zero_grad(set_to_none=True)
        for line in errors:
            say(f"experts implementation {line} (skipped)")
        return name
    raise RuntimeError("no experts implementation runs here: " + "; ".join(errors))


def _train(model, tokens, cfg: TargetTraining) -> tuple[list[float], dict]:
    """AdamW on random windows of ``tokens``; returns the loss of every step and what the run did."""
    import torch
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            **({"fused": True} if cfg.device == "cuda" else {}))
    schedule, losses, seen, long_steps = _Schedule(cfg), [], 0, 0
    model.train()
    bar = tqdm(total=cfg.steps, desc="train-target", file=sys.stderr, mininterval=10)
    step = 0
    while step < cfg.steps and (progress := schedule.progress(step)) < 1.0:
        long = progress >= 1.0 - cfg.long_share
        seq_len = cfg.long_seq_len if long else cfg.seq_len
        batch = _windows(tokens, max(1, cfg.batch * cfg.seq_len // seq_len) if long else cfg.batch, seq_len, gen)
        for group in opt.param_groups:
            group["lr"] = schedule.lr(step, progress)
        with _autocast(cfg.device):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seen, long_steps, step = seen + batch.numel(), long_steps + long, step + 1
        bar.update()
        bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}", seq=seq_len, refresh=False)
    bar.close()
    seconds = time.monotonic() - schedule.started
    return losses, {"steps_done": step, "long_steps": long_steps, "tokens_seen": seen,
                    "train_seconds": round(seconds, 1), "tokens_per_s": round(seen / max(seconds, 1e-9))}


def _unlikelihood(model, tokens, cfg: TargetTraining, pad_id: int) -> dict:
    """The unlikelihood phase (:func:`kimi.models.unlikelihood.finetune`) on seeded windows of ``tokens``; what it
    did, with its options."""
    import torch

    from kimi.models.unlikelihood import UnlikelihoodOptions, finetune

    opts = UnlikelihoodOptions(seconds=cfg.unlikelihood_seconds, weight=cfg.unlikelihood_weight)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    say(f"unlikelihood fine-tuning for {opts.seconds:.0f} s (weight {opts.weight}, {opts.ngram}-grams)")
    done = finetune(model, lambda count, length: _windows(tokens, count, length, gen), (cfg.batch, cfg.seq_len),
                    opts, pad_id, lambda: _autocast(cfg.device), say)
    return {**done, "options": asdict(opts)}


def eval_loss(model, tokens, cfg: TargetTraining) -> float:
    """Mean next-token loss (nats) of ``model`` on ``cfg.eval_windows`` seeded windows of ``cfg.seq_len`` tokens."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    windows = _windows(tokens, cfg.eval_windows, min(cfg.seq_len, len(tokens) - 2), gen)
    model.eval()
    total = 0.0
    with torch.no_grad(), _autocast(cfg.device):
        for chunk in windows.split(8):
            total += model(input_ids=chunk, labels=chunk).loss.item() * len(chunk)
    return total / len(windows)


def train_target(out: Path, spec: ReferenceSpec = TRAINED_SPEC, cfg: TargetTraining = TargetTraining(),
                 force: bool = False) -> dict:
    """Train the target and write ``out`` (config, bf16 safetensors, tokenizer, MANIFEST.json) atomically.

    Returns:
        The manifest: spec, training settings, the loss of every n-th step (about 500 kept), what the run did
        (steps, tokens, seconds), the loss on the training corpus and on the held-out packages (``heldout_loss``,
        nats per token), the greedy completions' loop share and distinct-2 (``quality``,
        :func:`kimi.models.selection.greedy_quality`), corpus identity, file digests, torch/transformers versions
        and the device.

    Raises:
        KimiError: ``out`` exists (without ``force``) or is not an earlier trained target
            (``OUTPUT_KEYS["train-target"]``); ``cfg.device`` is ``cuda`` on a machine without one.
    """
    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), marker_keys=OUTPUT_KEYS["train-target"])
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from kimi.errors import KimiError

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise KimiError("this recipe trains on CUDA and torch sees no GPU here: run the same `kimi models "
                        "train-target` on a CUDA host, or `--recipe cpu` for a weak target trained here")
    torch.set_num_threads(cfg.threads)
    corpus = stdlib_corpus(cfg.corpus_bytes)
    say(f"training the tokenizer on {len(corpus.files)} stdlib files, {corpus.nbytes / 1e6:.1f} MB "
        f"(Python {corpus.python})")
    tokenizer = train_tokenizer(corpus, spec.vocab)
    site = site_corpus(cfg.site_bytes, cfg.seed) if cfg.site_bytes else None
    if site:
        say(f"adding {len(site.files)} files of installed packages' code, {site.nbytes / 1e6:.1f} MB")
    tokens = corpus_tokens(tokenizer, corpus.files + (site.files if site else [])).to(cfg.device)
    heldout = corpus_tokens(tokenizer, held_out_files()).to(cfg.device)
    bos, eos = tokenizer.token_to_id(SPECIAL_TOKENS[0]), tokenizer.token_to_id(SPECIAL_TOKENS[1])
    config = target_config(spec, bos, eos)
    torch.manual_seed(cfg.seed)
    hf_config = DeepseekV3Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    model = DeepseekV3ForCausalLM(hf_config).to(cfg.device)
    experts = _pick_experts_implementation(model, tokens, cfg)
    say(f"training the target ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, experts: "
        f"{experts}) on {cfg.device} for {cfg.steps} steps x {cfg.batch} x {cfg.seq_len} tokens"
        + (f" or {cfg.max_seconds:.0f} s" if cfg.max_seconds else "")
        + f" on {len(tokens) / 1e6:.2f} M corpus tokens ({len(heldout) / 1e6:.2f} M held out)")
    pad_id = tokenizer.token_to_id(SPECIAL_TOKENS[2])
    losses, run = _train(model, tokens, cfg)
    if cfg.unlikelihood_seconds:
        run["unlikelihood"] = _unlikelihood(model, tokens, cfg, pad_id)
    evaluation = {"train_loss": round(eval_loss(model, tokens, cfg), 4),
                  "heldout_loss": round(eval_loss(model, heldout, cfg), 4),
                  "quality": greedy_quality(model, tokenizer, pad_id)}
    with staged_folder(out) as staging:
        staging.mkdir(parents=True, exist_ok=True)
        write_atomic(staging / "config.json", json.dumps(config, indent=2) + "\n")
        save_file(checkpoint_tensors(model.state_dict(), torch.bfloat16), str(staging / "model.safetensors"),
                  metadata={"format": "pt"})
        save_tokenizer(tokenizer, staging, spec.max_positions)
        manifest = {"spec": asdict(spec), "training": asdict(cfg), **run, "seconds": run["train_seconds"],
                    "experts_implementation": experts, "final_loss": sum(losses[-10:]) / len(losses[-10:]),
                    **evaluation, "loss": [round(x, 4) for x in losses[::max(1, len(losses) // 500)]],
                    "site_corpus": {"files": len(site.files), "bytes": site.nbytes, "sha256": site.digest}
                    if site else None,
                    "corpus": {"python": corpus.python, "files": len(corpus.files), "sha256": corpus.digest,
                               "tokens": len(tokens), "heldout_tokens": len(heldout)},
                    "made_on": {"device": torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu",
                                "torch": torch.__version__, "transformers": transformers.__version__},
                    "files": {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    quality = evaluation["quality"]
    say(f"wrote {out}: {run['steps_done']} steps in {run['train_seconds']:.0f} s, loss {manifest['final_loss']:.3f}, "
        f"held-out loss {evaluation['heldout_loss']:.3f} (corpus {evaluation['train_loss']:.3f}); greedy on "
        f"{quality['prompts']}: loop share {quality['loop_share']:.2f}, distinct-2 {quality['distinct_2']:.2f}")
    return manifest
