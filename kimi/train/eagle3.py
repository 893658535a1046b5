"""The Llama-style EAGLE-3 drafter in plain torch, with the training-time test (TTT) unroll.

Parameter names are those of the ``LlamaForCausalLMEagle3`` checkpoint vLLM loads (``fc``,
``midlayer.*``, ``norm``, ``lm_head``), so a state dict is an export. The forward is the one vLLM's
``llama_eagle3.py`` serves:

* first step: ``g = fc(concat(aux_0, ..., aux_{n-1}))`` (target states in layer order);
* ``x = concat(input_layernorm(embed(token)), hidden_norm(g))`` [.., 2H] -> attention (q/k/v over 2H,
  RoPE on the positions) -> ``r = o_proj(..) + g`` -> ``r = mlp(post_attention_layernorm(r)) + r``;
* logits over the draft vocabulary: ``lm_head(norm(r))``; the next step's ``g`` is ``r`` (pre-norm).

Training-time test (EAGLE-3): row ``t`` of step 0 sees token ``x[t+1]`` and the target's aux states at
``t`` (position ``t``) and predicts ``x[t+2]``; step ``j`` feeds the drafter's own ``r`` of step ``j-1``
with token ``x[t+1+j]`` at position ``t+j`` and predicts ``x[t+2+j]``. Its query attends to the step-0
keys of rows ``<= t`` and to its own chain's keys of steps ``1..j`` (the diagonal), exactly the KV cache a
served draft chain sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DrafterShape:
    """Sizes of a drafter: its own width, the target's width and aux count, vocabularies, attention."""

    hidden: int
    target_hidden: int
    num_aux: int
    vocab: int
    draft_vocab: int
    heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    eps: float = 1e-6


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * weight``, computed in float32 like vLLM's RMSNorm."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        width = s.heads * s.head_dim
        self.q_proj = nn.Linear(2 * s.hidden, width, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden, width, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden, width, bias=False)
        self.o_proj = nn.Linear(width, s.hidden, bias=False)


class _Mlp(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Midlayer(nn.Module):
    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.hidden_norm = RMSNorm(s.hidden, s.eps)
        self.self_attn = _Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = _Mlp(s)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style RoPE (Llama's ``rotate_half``) of x [B, heads, T, D] at positions [B, T] (int64)."""
    dim = x.shape[-1]
    inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim)
    angles = positions[:, None, :, None].float() * inv  # [B, 1, T, D/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Eagle3Drafter(nn.Module):
    """EAGLE-3 drafter; ``embed`` [vocab, hidden] is the target's embedding (frozen, not exported)."""

    def __init__(self, shape: DrafterShape, embed: torch.Tensor) -> None:
        super().__init__()
        self.shape = shape
        self.register_buffer("embed", embed.float(), persistent=False)
        self.fc = nn.Linear(shape.num_aux * shape.target_hidden, shape.hidden, bias=False)
        self.midlayer = _Midlayer(shape)
        self.norm = RMSNorm(shape.hidden, shape.eps)
        self.lm_head = nn.Linear(shape.hidden, shape.draft_vocab, bias=False)

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One TTT step.

        Args:
            tokens: int64 [B, T] input token per row.
            hidden: float [B, T, H] (``fc`` output at step 0, the previous step's ``r`` after).
            positions: int64 [B, T].
            cache: keys/values [B, heads, T, D] of the earlier steps (step 0 first); this step's are appended.
            valid: bool [B, T], rows that exist (padding is False).

        Returns:
            (logits [B, T, draft_vocab], r [B, T, H]).
        """
        s, layer = self.shape, self.midlayer
        x = torch.cat([layer.input_layernorm(self.embed[tokens]), layer.hidden_norm(hidden)], -1)
        b, t, _ = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)

        q = rotate(heads(layer.self_attn.q_proj), positions, s.rope_theta)
        k = rotate(heads(layer.self_attn.k_proj), positions, s.rope_theta)
        v = heads(layer.self_attn.v_proj)
        cache.append((k, v))
        scale = s.head_dim ** -0.5
        k0, v0 = cache[0]
        scores = (q @ k0.transpose(-1, -2)) * scale  # [B, h, T, T] against step 0, causal
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~(causal & valid[:, None, None, :]), float("-inf"))
        diag = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in cache[1:]]  # [B, h, T, 1] each
        probs = torch.softmax(torch.cat([scores, *diag], -1), -1)
        out = probs[..., :t] @ v0
        for i, (_, vj) in enumerate(cache[1:]):
            out = out + probs[..., t + i:t + i + 1] * vj
        attn = layer.self_attn.o_proj(out.transpose(1, 2).reshape(b, t, s.heads * s.head_dim))
        r = attn + hidden
        r = layer.mlp(layer.post_attention_layernorm(r)) + r
        return self.lm_head(self.norm(r)), r

    def unroll(self, input_ids: torch.Tensor, aux: torch.Tensor, lengths: torch.Tensor,
               steps: int) -> list[torch.Tensor]:
        """The TTT unroll: draft-vocab logits [B, T, draft_vocab] of steps ``0..steps-1``.

        Args:
            input_ids: int64 [B, T] (padded with anything).
            aux: float [B, T, num_aux * target_hidden], the target's aux states.
            lengths: int64 [B], tokens per row.
        """
        b, t = input_ids.shape
        rows = torch.arange(t, device=input_ids.device)
        valid = rows[None, :] < lengths[:, None]
        hidden, cache, logits = self.fc(aux), [], []
        for j in range(steps):
            idx = (rows + 1 + j).clamp(max=t - 1)
            tokens = input_ids[:, idx]
            positions = (rows + j)[None, :].expand(b, t)
            step_logits, hidden = self.step(tokens, hidden, positions, cache, valid)
            logits.append(step_logits)
        return logits
