"""Sequence-level unlikelihood fine-tuning: a small target that has learnt general code stops looping under greedy.

Welleck et al. 2019 ("Neural Text Generation with Unlikelihood Training", section 5.2): the model continues
prefixes of its training text greedily; every token of a continuation that belongs to an n-gram already seen
earlier in that continuation is a negative candidate, and the loss ``-log(1 - p(x_t | x_<t))`` pushes its
probability down, while the usual next-token loss on training windows keeps the language model. The paper uses
n = 4 and mixes both losses; here each update adds the two.

Why the reference target needs it: trained on more than the stdlib, the 5.4 M-parameter target
generalises (held-out loss 2.3-2.7 against 4.1) but its greedy code ends in repeats (loop share 0.25-0.75,
distinct-2 0.23-0.28; ``benchmarks/results/logs/pair-target-h200/README.md``), so a drafter's τ on it would
measure loops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class UnlikelihoodOptions:
    """The fine-tuning phase after the next-token training (``seconds`` 0: none).

    It stops after ``seconds`` or ``max_steps`` updates (None: no step limit), whichever comes first. Each update
    continues ``batch`` windows of ``prefix`` training tokens greedily for ``tokens`` tokens, marks n-grams of
    ``ngram`` tokens, and steps on ``next-token CE + weight * unlikelihood`` at a constant learning rate ``lr``.
    """

    seconds: float = 0.0
    batch: int = 256
    prefix: int = 64
    tokens: int = 64
    ngram: int = 4
    weight: float = 1.0
    lr: float = 5e-4
    max_steps: int | None = None


def repeated_ngram_mask(continuations: torch.Tensor, n: int) -> torch.Tensor:
    """Which tokens of each continuation lie in an n-gram that occurred earlier in the same continuation.

    An n-gram starting at ``s`` repeats when the same ``n`` tokens start at some ``s' <= s - n`` (the earlier copy
    ends before this one starts: Welleck et al.'s "already in the prefix"); all of its ``n`` tokens are marked.

    Args:
        continuations: int64 [B, L] token ids.
        n: n-gram length (>= 1).

    Returns:
        bool [B, L].
    """
    b, length = continuations.shape
    mask = torch.zeros(b, length, dtype=torch.bool)
    for row, tokens in enumerate(continuations.tolist()):
        first_end: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its first copy
        for s in range(length - n + 1):
            gram = tuple(tokens[s:s + n])
            end = first_end.setdefault(gram, s + n)
            if end <= s:
                mask[row, s:s + n] = True
    return mask


def unlikelihood_loss(logits: torch.Tensor, sequences: torch.Tensor, candidates: torch.Tensor,
                      start: int) -> torch.Tensor:
    """``sum over marked t of -log(1 - p(x_t | x_<t))`` per continuation token.

    Args:
        logits: float [B, T, V], the model's output on ``sequences`` (row t predicts token t + 1).
        sequences: int64 [B, T], prefix then continuation.
        candidates: bool [B, T - start], the continuation's tokens to push down.
        start: where the continuation begins (>= 1).

    Returns:
        A scalar tensor: the sum divided by B x (T - start); zero when nothing is marked.
    """
    targets = sequences[:, start:, None]
    logp = torch.log_softmax(logits[:, start - 1:-1].float(), -1).gather(-1, targets)[..., 0]
    one_minus = torch.clamp(-torch.expm1(logp), min=1e-5)  # 1 - p, accurate when p is small
    marked = candidates.to(logp.device)
    return -(torch.log(one_minus) * marked).sum() / marked.numel()


def finetune(model, windows, lm_shape: tuple[int, int], opts: UnlikelihoodOptions, pad_id: int, autocast,
             say) -> dict:
    """Unlikelihood fine-tuning of ``model`` (see the module docstring; a transformers causal LM).

    Args:
        windows: ``(count, length) -> int64 [count, length]``, seeded random windows of the training corpus on the
            model's device: the prefixes (their first ``opts.prefix`` tokens) and the next-token term's batches.
        lm_shape: (rows, tokens) of the next-token term's batch (the training recipe's).
        autocast: a context manager factory for the forward passes (bf16 on CUDA).
        say: progress printer.

    Returns:
        {"steps", "seconds", "repeat_share_first", "repeat_share_last"}: the share of continuation tokens in a
        repeated n-gram at the first and the last update (how much the greedy output still repeats itself).
    """
    from kimi.models.selection import greedy_completions

    opt = torch.optim.AdamW(model.parameters(), lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.0)
    started, steps, shares = time.monotonic(), 0, []
    while time.monotonic() - started < opts.seconds and (opts.max_steps is None or steps < opts.max_steps):
        prefixes = windows(opts.batch, opts.prefix)
        cont = torch.tensor(greedy_completions(model, prefixes.tolist(), opts.tokens, pad_id))
        marked = repeated_ngram_mask(cont, opts.ngram)
        shares.append(float(marked.float().mean()))
        sequences = torch.cat([prefixes, cont.to(prefixes.device)], 1)
        batch = windows(*lm_shape)
        model.train()
        with autocast():
            lm = model(input_ids=batch, labels=batch).loss
            ul = unlikelihood_loss(model(input_ids=sequences).logits, sequences, marked, opts.prefix)
            loss = lm + opts.weight * ul
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 20 == 1:
            say(f"unlikelihood step {steps}: next-token loss {lm.item():.3f}, unlikelihood {ul.item():.4f}, "
                f"{shares[-1]:.3f} of the greedy tokens in a repeated {opts.ngram}-gram")
    return {"steps": steps, "seconds": round(time.monotonic() - started, 1),
            "repeat_share_first": round(shares[0], 4) if shares else None,
            "repeat_share_last": round(shares[-1], 4) if shares else None}
