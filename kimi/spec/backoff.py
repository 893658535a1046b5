"""Draft back-off under adaptive verification: a request whose drafts keep failing stops drafting, and is
probed again after a pause that doubles each time the probe fails.

The rule, per request; steps are the runner's sampling steps (one per engine step that runs the model):

- a *verified* step of a request is one in which at least one of its drafts was verified (admitted by the
  draft budget); it *fails* when none of them was accepted;
- after ``patience`` failed verified steps in a row the request is paused: the confidences of its drafts are
  set to 0 before the budget reads them, so the budget admits none of them, for ``first_steps`` steps;
- after the pause its drafts are priced again (a probe); its next verified step decides: a draft accepted
  clears the back-off (the request is treated as new), none accepted pauses it again at once, for twice the
  last pause, at most ``max_steps``.

Verification during a pause (the budget reads host copies of the confidences one step late, so the first
paused step can still verify) is not counted.  The drafter keeps running for a paused request (vLLM's V2
drafter proposes for the whole batch), which keeps its KV cache current, so a probe measures the drafter as it
is; what a pause saves is verifying the request's drafts in the target.  Greedy output does not change: the
budget only decides how many drafts are verified, and a token is emitted only where the target samples it.

The knobs are fields of vLLM's speculative config (patch ``eagle3-collapsing-acceptance``), resolved and
checked by :func:`backoff_options` before any weights load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: speculative-config field -> :class:`BackoffOptions` attribute.
FIELDS = {
    "adaptive_backoff_patience": "patience",
    "adaptive_backoff_steps": "first_steps",
    "adaptive_backoff_max_steps": "max_steps",
}


@dataclass(frozen=True)
class BackoffOptions:
    """The rule's thresholds (module docstring), in requests' verified steps and engine steps.

    Attributes:
        patience: failed verified steps in a row before a request pauses; 0 turns the back-off off.
        first_steps: the first pause, in steps.
        max_steps: the longest pause, in steps (pauses double from ``first_steps`` up to it).
    """

    patience: int = 8
    first_steps: int = 16
    max_steps: int = 256

    @property
    def enabled(self) -> bool:
        return self.patience > 0


def backoff_options(spec: Any) -> BackoffOptions:
    """The back-off thresholds of vLLM's ``SpeculativeConfig`` ``spec``: its ``adaptive_backoff_*`` fields, the
    defaults of :class:`BackoffOptions` where a field is None.

    Raises:
        ValueError: a field is set while ``enable_adaptive_verification`` is off (the back-off acts through
            the adaptive draft budget), is not an integer, or is out of range (``patience`` >= 0,
            ``first_steps`` >= 1, ``max_steps`` >= ``first_steps``); the message names the field and the fix.
    """
    given = {field: getattr(spec, field, None) for field in FIELDS}
    given = {field: value for field, value in given.items() if value is not None}
    if given and not getattr(spec, "enable_adaptive_verification", False):
        names = ", ".join(sorted(given))
        raise ValueError(
            f"{names}: the draft back-off works through adaptive verification's draft budget; add "
            f"\"enable_adaptive_verification\": true to the speculative config, or remove {names}")
    for field, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{field} must be an integer number of steps, got {value!r}")
    defaults = BackoffOptions()
    values = {attr: given.get(field, getattr(defaults, attr)) for field, attr in FIELDS.items()}
    options = BackoffOptions(**values)
    if options.patience < 0:
        raise ValueError(f"adaptive_backoff_patience must be >= 0 (0 turns the draft back-off off), got "
                         f"{options.patience}")
    if options.first_steps < 1:
        raise ValueError(f"adaptive_backoff_steps (the first pause, in steps) must be >= 1, got "
                         f"{options.first_steps}")
    if options.max_steps < options.first_steps:
        raise ValueError(f"adaptive_backoff_max_steps ({options.max_steps}) must be >= adaptive_backoff_steps "
                         f"({options.first_steps}): pauses double from the first up to the longest")
    return options


class DraftBackoff:
    """The rule's per-request state, in tensors indexed by vLLM's request-state slot, on the runner's device
    (updated without a host sync).

    Attributes:
        streak: ``[max_num_reqs]`` int32, failed verified steps in a row.
        pause: ``[max_num_reqs]`` int32, the last pause in steps; 0 while the request is not backing off.
        resume_at: ``[max_num_reqs]`` int64, the first step whose verification counts again (and may hold the
            request's drafts); the request is paused at steps before it.
    """

    def __init__(self, options: BackoffOptions, max_num_reqs: int, device: torch.device):
        self.options = options
        self.streak = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.pause = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.resume_at = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)

    def reset(self, slots: torch.Tensor) -> None:
        """Forget the requests in ``slots`` (``[n]`` int64 slot indices): a new request takes the slot."""
        self.streak[slots] = 0
        self.pause[slots] = 0
        self.resume_at[slots] = 0

    def update(self, step: int, slots: torch.Tensor, admitted: torch.Tensor, accepted: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold step ``step``'s verification into the rule.

        Args:
            step: the step number (increasing by one per sampling step).
            slots: ``[num_reqs]`` int64, the batch's request-state slots (distinct).
            admitted: ``[num_reqs]`` int, drafts verified per request this step.
            accepted: ``[num_reqs]`` int, drafts accepted per request this step.

        Returns:
            ``(paused_now, probed)``: ``[num_reqs]`` bool, the requests that start a pause at this step, and
            the requests whose probe this step's verification decided.
        """
        opts = self.options
        counts = step >= self.resume_at[slots]
        verified = counts & (admitted > 0)
        failed = verified & (accepted == 0)
        succeeded = verified & (accepted > 0)
        streak = self.streak[slots]
        pause = self.pause[slots]
        probing = pause > 0
        streak = torch.where(failed, streak + 1, torch.where(succeeded, torch.zeros_like(streak), streak))
        start = failed & ((streak >= opts.patience) | probing)
        longer = torch.where(probing, torch.clamp(pause * 2, max=opts.max_steps),
                             torch.full_like(pause, opts.first_steps))
        pause = torch.where(start, longer, torch.where(succeeded, torch.zeros_like(pause), pause))
        self.resume_at[slots] = torch.where(start, step + 1 + pause.to(torch.int64), self.resume_at[slots])
        self.streak[slots] = torch.where(start, torch.zeros_like(streak), streak)
        self.pause[slots] = pause
        return start, probing & verified

    def paused_next(self, step: int, slots: torch.Tensor) -> torch.Tensor:
        """``[num_reqs]`` bool: the requests in ``slots`` whose drafts proposed at ``step`` (verified at
        ``step + 1``) are withheld from the budget."""
        return self.resume_at[slots] > step + 1
