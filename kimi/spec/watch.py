"""The model runner's side of collapsing acceptance: one call per sampling step, after the drafter has proposed
and before adaptive verification records the new drafts' confidences.

Per step it (1) folds the step's verdict into the per-request, per-position acceptance
(:class:`~kimi.spec.acceptance.AcceptanceTracker`) and the draft back-off
(:class:`~kimi.spec.backoff.DraftBackoff`), (2) sets the confidences of the requests the back-off pauses to 0,
so that the budget gives them no drafts, (3) starts copying the step's sums to the host, and reads the
previous step's (one step late, so the GPU is never waited for), which feed the collapse warning
(:class:`~kimi.spec.collapse.CollapseMonitor`) and ride to ``/metrics`` on the runner's output
(:mod:`kimi.spec.metrics`).  All of it runs only with adaptive verification on.

The V2 model runner calls :func:`step_done` (through the hook :mod:`kimi.hooks.eagle3_collapsing_acceptance`),
which builds the runner's :class:`VerificationWatch` on first use (:func:`watch_of`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kimi.spec.acceptance import AcceptanceTracker, verdict
from kimi.spec.backoff import DraftBackoff, backoff_options
from kimi.spec.collapse import CollapseMonitor
from kimi.spec.metrics import OUTPUT_ATTR, StepSummary

#: The runner attribute that holds its :class:`VerificationWatch`.
RUNNER_ATTR = "_kimi_verification_watch"


def _first_rank() -> bool:
    """Whether this worker logs: tensor-parallel rank 0, or no parallel state (tests)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:
        return True


class HostCopy:
    """A small float32 device vector read on the host one step later: :meth:`push` starts the copy, the next
    :meth:`pop` returns it (after waiting for that copy only)."""

    def __init__(self, size: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.float32, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.extra: Any = None
        self.full = False

    def push(self, values: torch.Tensor, extra: Any) -> None:
        self.host.copy_(values, non_blocking=self.cuda)
        if self.event is not None:
            self.event.record()
        self.extra, self.full = extra, True

    def pop(self) -> tuple[np.ndarray, Any] | None:
        if not self.full:
            return None
        if self.event is not None:
            from vllm.utils.gpu_sync_debug import gpu_sync_allowed

            # the copy of a step ago, as record_confidences waits for its own copy of a step ago
            with gpu_sync_allowed():
                self.event.synchronize()
        self.full = False
        return self.host.numpy().copy(), self.extra


class VerificationWatch:
    """Per-runner state (module docstring).

    Args:
        max_num_reqs: request-state slots of the runner.
        num_speculative_steps: ``k``, drafts per request and step.
        device: the runner's device.
        spec: vLLM's ``SpeculativeConfig`` (back-off thresholds, the drafter's name).
        logger: where the collapse warning goes.
    """

    def __init__(self, max_num_reqs: int, num_speculative_steps: int, device: torch.device, spec: Any,
                 logger: Any):
        self.k = num_speculative_steps
        self.device = device
        options = backoff_options(spec)
        self.tracker = AcceptanceTracker(max_num_reqs, num_speculative_steps, device)
        self.backoff = DraftBackoff(options, max_num_reqs, device) if options.enabled else None
        self.monitor = CollapseMonitor(str(getattr(spec, "model", None) or spec.method), logger, emit=_first_rank())
        self.copy = HostCopy(3 + 3 * num_speculative_steps, device)
        self.owners: dict[int, str] = {}
        self.pending: StepSummary | None = None
        self.step = 0

    def reset(self) -> None:
        """Forget every request and pending number (after warm-up and profiling steps)."""
        slots = torch.tensor(sorted(self.owners), dtype=torch.int64, device=self.device)
        self.tracker.reset(slots)
        if self.backoff is not None:
            self.backoff.reset(slots)
        self.owners.clear()
        self.copy.pop()
        self.pending = None

    def _take_slots(self, req_ids: list[str], slots_np: np.ndarray) -> None:
        """Reset the slots that a new request took since the last step."""
        fresh = [int(s) for r, s in zip(req_ids, slots_np, strict=True) if self.owners.get(int(s)) != r]
        if not fresh:
            return
        slots = torch.tensor(fresh, dtype=torch.int64, device=self.device)
        self.tracker.reset(slots)
        if self.backoff is not None:
            self.backoff.reset(slots)
        for r, s in zip(req_ids, slots_np, strict=True):
            self.owners[int(s)] = r

    def _read_previous(self) -> None:
        got = self.copy.pop()
        if got is None:
            return
        values, budget = got
        k = self.k
        summary = StepSummary(budget=[budget], verified=values[3:3 + k].tolist(),
                              estimated=values[3 + k:3 + 2 * k].tolist(), observed=values[3 + 2 * k:].tolist(),
                              paused=float(values[0]), pauses=float(values[1]), probes=float(values[2]))
        self.monitor.observe(sum(summary.verified), sum(summary.observed))
        if self.pending is None:
            self.pending = summary
        else:
            self.pending.add(summary)

    def step_done(self, input_batch: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                  budget_confidences: torch.Tensor, new_confidences: torch.Tensor, output: Any) -> None:
        """One sampling step.

        Args:
            input_batch: vLLM's ``InputBatch`` of the step (``idx_mapping`` ``[num_reqs]`` int64 slots,
                ``num_draft_tokens`` the drafts verified, ``num_draft_tokens_per_req`` None when no draft was
                scheduled).
            num_sampled: ``[num_reqs]`` int32, tokens emitted per request (accepted drafts + 1).
            num_rejected: ``[num_reqs]`` int32, verified drafts not accepted per request.
            budget_confidences: ``[max_num_reqs, k]`` float32, by slot: the confidences the budget ranked this
                step's drafts by (adaptive verification's ``_confidence_probs``, not yet overwritten).
            new_confidences: ``[>= num_reqs, k]`` float32, by batch row: the confidences of the drafts just
                proposed, which the back-off zeroes in place for paused requests.
            output: the step's ``ModelRunnerOutput``; gets the summaries read so far when drafts were
                scheduled this step (so the scheduler has spec-decode stats to put them in).
        """
        step = self.step
        self.step += 1
        self._read_previous()
        num_reqs = input_batch.num_reqs
        if num_reqs == 0:
            return
        slots = input_batch.idx_mapping[:num_reqs]
        self._take_slots(list(input_batch.req_ids[:num_reqs]), input_batch.idx_mapping_np[:num_reqs])
        verifying = input_batch.num_draft_tokens_per_req is not None
        if verifying:
            admitted, accepted = verdict(num_sampled[:num_reqs], num_rejected[:num_reqs])
            sums = self.tracker.observe(slots, admitted, accepted, budget_confidences[slots])
            if self.backoff is not None:
                started, probed = self.backoff.update(step, slots, admitted, accepted)
        if self.backoff is not None:
            withheld = self.backoff.paused_next(step, slots)
            new_confidences[:num_reqs].masked_fill_(withheld[:, None], 0.0)
        if not verifying:
            return  # nothing verified: nothing to count (the back-off only withholds the new drafts)
        paused = pauses = probes = torch.zeros(1, dtype=torch.float32, device=self.device)
        if self.backoff is not None:
            paused = withheld.sum(0, keepdim=True)
            pauses, probes = started.sum(0, keepdim=True), probed.sum(0, keepdim=True)
        values = torch.cat([paused.float(), pauses.float(), probes.float(), sums.verified, sums.estimated,
                            sums.observed])
        self.copy.push(values, float(input_batch.num_draft_tokens))
        if self.pending is not None:
            setattr(output, OUTPUT_ATTR, self.pending.as_dict())
            self.pending = None


def watch_of(model_runner: Any) -> VerificationWatch:
    """``model_runner``'s :class:`VerificationWatch` (its attribute :data:`RUNNER_ATTR`), built on first use from
    the runner's ``max_num_reqs``, ``num_speculative_steps``, ``device`` and ``speculative_config``; the collapse
    warning goes to vLLM's logger ``vllm.kimi.spec.collapse``."""
    watch = getattr(model_runner, RUNNER_ATTR, None)
    if watch is None:
        from vllm.logger import init_logger

        watch = VerificationWatch(model_runner.max_num_reqs, model_runner.num_speculative_steps,
                                  model_runner.device, model_runner.speculative_config,
                                  init_logger("vllm.kimi.spec.collapse"))
        setattr(model_runner, RUNNER_ATTR, watch)
    return watch


def step_done(model_runner: Any, input_batch: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
              model_runner_output: Any) -> None:
    """One sampling step of the V2 model runner ``model_runner`` (after the drafter proposed, before adaptive
    verification records the confidences): :meth:`VerificationWatch.step_done` of :func:`watch_of` the runner, with
    the confidences the budget ranked this step's drafts by (adaptive verification's ``_confidence_probs``) and
    those of the drafts just proposed (the speculator's ``draft_token_confidence_probs``)."""
    watch_of(model_runner).step_done(input_batch, num_sampled, num_rejected,
                                     model_runner.adaptive_verification._confidence_probs,
                                     model_runner.speculator.draft_token_confidence_probs, model_runner_output)
