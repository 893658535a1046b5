"""Stage d, train: the EAGLE-3 drafter on the captured states with the training-time test (TTT).

Per batch of captured sequences (padded), the drafter unrolls ``ttt_steps`` steps
(:meth:`kimi.train.eagle3.Eagle3Drafter.unroll`); step ``j`` at row ``t`` is scored against the target's
distribution at row ``t + 1 + j`` (its LM head on the captured final state, softmax over the draft
vocabulary) by cross-entropy, where the token it predicts is a response token and the target's
greedy choice is in the draft vocabulary. The loss is ``sum_j 0.8**j * CE_j`` (EAGLE-3's position
weights). Logged per step: the loss, each TTT step's acceptance (drafter argmax == target argmax,
out-of-vocabulary choices counting as misses) and ``tau_ttt`` = 1 + the expected accepted length of a
``ttt_steps`` chain.

AdamW with warm-up and cosine decay; ``train/checkpoint.pt`` (weights, optimiser, step) every
``save_every`` steps and at the end; ``--resume`` continues from it with the same batch order;
``--init DIR`` starts from an exported drafter (its LM head rows moved to this vocabulary).
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kimi.errors import KimiError
from kimi.train.capture import target_shape
from kimi.train.eagle3 import DrafterShape, Eagle3Drafter
from kimi.train.engine import say
from kimi.train.store import read_json
from kimi.train.targethead import target_head

STEP_WEIGHT = 0.8


@dataclass(frozen=True)
class TrainOptions:
    """Drafter size and optimisation."""

    epochs: int = 8
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.01
    ttt_steps: int = 3
    heads: int = 4
    intermediate: int = 0  # 0: 3 x hidden
    seed: int = 0
    save_every: int = 100
    threads: int = 2


def _sequences(capture: Path) -> list[dict]:
    """All captured sequences (one shard at a time on disk; the small pairs here fit in memory)."""
    from kimi.train.store import iter_sequences

    return list(iter_sequences(capture))


def _batches(count: int, opts: TrainOptions, epoch: int) -> list[list[int]]:
    order = list(range(count))
    random.Random(opts.seed * 1000 + epoch).shuffle(order)
    return [order[i:i + opts.batch] for i in range(0, count, opts.batch)]


def _collate(seqs: list[dict], device: str = "cpu") -> dict:
    """Pad to the longest, on ``device``: input_ids int64 [B, T], loss_mask bool [B, T], aux/final float32,
    lengths [B]."""
    t = max(len(s["input_ids"]) for s in seqs)

    def pad(x: torch.Tensor, dtype) -> torch.Tensor:
        out = torch.zeros((t, *x.shape[1:]), dtype=dtype)
        out[:len(x)] = x.to(dtype)
        return out

    batch = {"input_ids": torch.stack([pad(s["input_ids"], torch.int64) for s in seqs]),
             "loss_mask": torch.stack([pad(s["loss_mask"], torch.bool) for s in seqs]),
             "aux": torch.stack([pad(s["aux"], torch.float32) for s in seqs]),
             "final": torch.stack([pad(s["final"], torch.float32) for s in seqs]),
             "lengths": torch.tensor([len(s["input_ids"]) for s in seqs])}
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def ttt_loss(model: Eagle3Drafter, batch: dict, lm_head: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor,
             steps: int) -> tuple[torch.Tensor, dict]:
    """Position-weighted TTT loss of one batch and its metrics {"loss", "acc": [steps], "tau_ttt"}.

    Args:
        lm_head: float32 [vocab, H], the target's LM head.
        d2t: int64 [draft_vocab]; t2d: bool [vocab]. Every tensor on the batch's device.
    """
    ids, lengths = batch["input_ids"], batch["lengths"]
    b, t = ids.shape
    draft_ids = torch.arange(len(d2t), device=d2t.device) + d2t
    with torch.no_grad():
        full = batch["final"] @ lm_head.T  # [B, T, vocab]
        greedy = full.argmax(-1)
        target_p = torch.softmax(full[..., draft_ids], -1)
    logits = model.unroll(ids, batch["aux"], lengths, steps)
    rows = torch.arange(t, device=ids.device)
    loss, acc, hits, scores = 0.0, [], [], []
    for j, step_logits in enumerate(logits):
        r = (rows + 1 + j).clamp(max=t - 1)
        nxt = (rows + 2 + j).clamp(max=t - 1)
        scored = ((rows + 2 + j)[None, :] < lengths[:, None]) & batch["loss_mask"][:, nxt]
        in_vocab = scored & t2d[greedy[:, r]]
        ce = -(target_p[:, r] * torch.log_softmax(step_logits.float(), -1)).sum(-1)
        loss = loss + STEP_WEIGHT ** j * (ce * in_vocab).sum() / in_vocab.sum().clamp(min=1)
        hit = (draft_ids[step_logits.argmax(-1)] == greedy[:, r]) & scored
        acc.append(float(hit.sum() / scored.sum().clamp(min=1)))
        hits.append(hit)
        scores.append(scored)
    every = torch.stack(scores).all(0)  # rows scored at every step: a whole chain
    chain, tau = every.clone(), 1.0
    for hit in hits:
        chain &= hit
        tau += float(chain.sum() / every.sum().clamp(min=1))
    return loss, {"loss": float(loss.detach()) if torch.is_tensor(loss) else loss, "acc": acc, "tau_ttt": tau}


def _lr(step: int, total: int, opts: TrainOptions) -> float:
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    return opts.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - opts.warmup) / max(1, total - opts.warmup))))


def build_drafter(target: str, capture_index: dict, draft_vocab: int, opts: TrainOptions) -> tuple[Eagle3Drafter, dict]:
    """A new drafter for ``target`` (seeded init) and the target's LM head weights."""
    layers, hidden = target_shape(target)
    head = target_head(target)
    config = json.loads((Path(target) / "config.json").read_text())
    shape = DrafterShape(hidden=hidden, target_hidden=hidden, num_aux=len(capture_index["aux_layer_ids"]),
                         vocab=head["lm_head"].shape[0], draft_vocab=draft_vocab, heads=opts.heads,
                         head_dim=hidden // opts.heads, intermediate=opts.intermediate or 3 * hidden,
                         rope_theta=float(config.get("text_config", config).get("rope_theta", 10000.0)))
    torch.manual_seed(opts.seed)
    return Eagle3Drafter(shape, head["embed"]), head


def warm_start(model: Eagle3Drafter, init: Path, d2t: torch.Tensor) -> None:
    """Load an exported drafter's weights; its LM head rows follow their target ids into this vocabulary."""
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(init.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    own = model.state_dict()
    for name, value in tensors.items():
        if name in own and name != "lm_head.weight":
            if own[name].shape != value.shape:
                raise KimiError(f"--init {init}: {name} has shape {list(value.shape)}, this drafter "
                                f"{list(own[name].shape)}")
            own[name] = value.float()
    if "lm_head.weight" in tensors and "d2t" in tensors:
        theirs = {int(t): i for i, t in enumerate(torch.arange(len(tensors["d2t"])) + tensors["d2t"])}
        mine = torch.arange(len(d2t)) + d2t
        for i, tok in enumerate(mine.tolist()):
            if tok in theirs:
                own["lm_head.weight"][i] = tensors["lm_head.weight"][theirs[tok]].float()
    model.load_state_dict(own)
    say(f"train: warm start from {init}")


def _save(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def train(work: Path, target: str, opts: TrainOptions, resume: bool = False, init: Path | None = None) -> dict:
    """Train on ``work/capture`` with ``work/vocab.safetensors``; returns the last logged metrics.

    On a CUDA device when torch sees one (float32 there too: the drafter is small), else on the CPU with
    ``opts.threads`` threads; the device is logged and returned with the metrics.

    Raises:
        KimiError: missing capture or vocab, or a checkpoint already there without ``resume``.
    """
    from safetensors.torch import load_file
    from tqdm import tqdm

    torch.set_num_threads(opts.threads)
    index = read_json(work / "capture" / "index.json")
    if not index or not index["shards"]:
        raise KimiError(f"nothing captured in {work / 'capture'}: run `kimi train capture` first")
    if not (work / "vocab.safetensors").is_file():
        raise KimiError(f"no {work / 'vocab.safetensors'}: run `kimi train vocab` first")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = load_file(str(work / "vocab.safetensors"))
    d2t, t2d = vocab["d2t"].to(device), vocab["t2d"].to(device)
    out = work / "train"
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.exists() and not resume:
        raise KimiError(f"{ckpt_path} exists: add --resume to continue it, or use another --work folder")
    model, head = build_drafter(target, index, len(d2t), opts)
    lm_head = head["lm_head"].float().to(device)
    seqs = _sequences(work / "capture")
    per_epoch = len(_batches(len(seqs), opts, 0))
    total = opts.epochs * per_epoch
    step, state = 0, None
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False, map_location="cpu")
        model.load_state_dict(state["model"])
        step = state["step"]
        say(f"train: resuming at step {step} of {total}")
    elif init is not None:
        warm_start(model, init, d2t.cpu())
    model.to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=opts.lr,
                            weight_decay=opts.weight_decay)
    if state is not None:
        opt.load_state_dict(state["optimizer"])  # its moments go to the parameters' device
    out.mkdir(parents=True, exist_ok=True)
    meta = {"options": asdict(opts), "shape": asdict(model.shape), "total_steps": total,
            "aux_layer_ids": index["aux_layer_ids"], "target": index["target"]}
    say(f"train: {len(seqs)} sequences, {per_epoch} batches x {opts.epochs} epochs, TTT {opts.ttt_steps} steps, "
        f"{sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f} M trainable parameters on {device}")
    metrics: dict = {}
    if step >= total and (out / "log.jsonl").is_file():  # resumed after the last step: its logged metrics
        last = [line for line in (out / "log.jsonl").read_text().splitlines() if line.strip()][-1:]
        metrics = {k: v for k, v in json.loads(last[0]).items() if k in ("loss", "acc", "tau_ttt")} if last else {}
    with open(out / "log.jsonl", "a") as log, tqdm(total=total, initial=step, desc="train", unit="step") as bar:
        while step < total:
            epoch, pos = divmod(step, per_epoch)
            batch = _collate([seqs[i] for i in _batches(len(seqs), opts, epoch)[pos]], device)
            for group in opt.param_groups:
                group["lr"] = _lr(step, total, opts)
            loss, metrics = ttt_loss(model, batch, lm_head, d2t, t2d, opts.ttt_steps)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            log.write(json.dumps({"step": step, "epoch": epoch, "lr": _lr(step - 1, total, opts), **metrics}) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc'][0]:.2f}",
                            tau=f"{metrics['tau_ttt']:.2f}")
            if step % opts.save_every == 0 or step == total:
                _save(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                  "meta": meta})
    return {**metrics, "device": device}
