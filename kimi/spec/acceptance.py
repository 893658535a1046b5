"""Per-request and per-position draft acceptance kept by the engine under adaptive verification, and each
step's estimated against observed acceptance.

The target's verdict on a step's drafts arrives as vLLM's ``num_sampled`` (tokens emitted per request,
accepted drafts plus the bonus token) and ``num_rejected`` (the first rejected draft and every verified one
after it): request r verified ``admitted[r] = accepted[r] + num_rejected[r]`` drafts, positions
``0 .. admitted[r] - 1``, and accepted positions ``0 .. accepted[r] - 1``.  The estimate is what adaptive
verification ranked the drafts by: the acceptance estimator's per-position confidences, whose running product
is the probability that a draft survives (is accepted with every draft before it); summed over the verified
slots it is the number of accepted drafts the budget expected.  Everything stays on the runner's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepAcceptance:
    """One step's verification summed over its requests, per draft position (device tensors).

    Attributes:
        verified: ``[k]`` float32, drafts verified at each position.
        estimated: ``[k]`` float32, expected accepted drafts at each position (sum of survival probabilities
            of the verified slots).
        observed: ``[k]`` float32, drafts accepted at each position.
    """

    verified: torch.Tensor
    estimated: torch.Tensor
    observed: torch.Tensor


def verdict(num_sampled: torch.Tensor, num_rejected: torch.Tensor, num_bonus_tokens: int = 1
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(admitted, accepted)``, ``[num_reqs]`` int32 each, from vLLM's ``num_sampled`` and ``num_rejected``
    (``[num_reqs]`` ints; a request still in prefill samples 0 tokens and verified nothing)."""
    accepted = torch.clamp(num_sampled.to(torch.int32) - num_bonus_tokens, min=0)
    return accepted + num_rejected.to(torch.int32), accepted


class AcceptanceTracker:
    """Per-request, per-position acceptance, in tensors indexed by vLLM's request-state slot.

    Attributes:
        verified: ``[max_num_reqs, k]`` float32, drafts of the request verified at each position since it
            took its slot.
        accepted: ``[max_num_reqs, k]`` float32, of which accepted.
    """

    def __init__(self, max_num_reqs: int, num_speculative_steps: int, device: torch.device):
        self.positions = torch.arange(num_speculative_steps, dtype=torch.int32, device=device)
        self.verified = torch.zeros(max_num_reqs, num_speculative_steps, dtype=torch.float32, device=device)
        self.accepted = torch.zeros_like(self.verified)

    def reset(self, slots: torch.Tensor) -> None:
        """Forget the requests in ``slots`` (``[n]`` int64): a new request takes the slot."""
        self.verified[slots] = 0.0
        self.accepted[slots] = 0.0

    def observe(self, slots: torch.Tensor, admitted: torch.Tensor, accepted: torch.Tensor,
                confidences: torch.Tensor) -> StepAcceptance:
        """Fold one step's verdict in and return the step's sums.

        Args:
            slots: ``[num_reqs]`` int64, request-state slots (distinct).
            admitted: ``[num_reqs]`` int32, drafts verified per request.
            accepted: ``[num_reqs]`` int32, drafts accepted per request.
            confidences: ``[num_reqs, k]`` float32, the per-position acceptance probabilities the budget ranked
                these drafts by.
        """
        verified = (self.positions[None, :] < admitted[:, None]).to(torch.float32)
        hit = (self.positions[None, :] < accepted[:, None]).to(torch.float32)
        self.verified[slots] += verified
        self.accepted[slots] += hit
        survival = torch.cumprod(confidences.to(torch.float32), dim=1)
        return StepAcceptance(verified.sum(0), (survival * verified).sum(0), hit.sum(0))

    def rate(self, slot: int) -> torch.Tensor:
        """``[k]`` float32: the request in ``slot``'s acceptance rate at each position (NaN where none was
        verified)."""
        return self.accepted[slot] / self.verified[slot]
