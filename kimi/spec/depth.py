"""Adaptive draft depth under adaptive verification: the drafter runs only as many passes as the draft budget
has lately used.

Adaptive verification (:mod:`kimi.spec.adaptive`) decides each step how many drafts the target verifies, but
vLLM's EAGLE drafter still runs all ``k`` passes (one prefill pass for draft 0, then ``k - 1`` decode passes)
for every request, so a step whose budget admits few drafts, or none, still pays the whole drafter.  Here the
runner asks, before the drafter proposes, how deep to draft:

- ``depth = min(k, 1 + the most drafts the budget admitted to any one request over the last`` :data:`WINDOW`
  ``steps)``, at most the drafts the scheduler asked for;
- once the budget has admitted no draft to any request in :data:`WINDOW` verifying steps in a row (steps that
  verified no draft, a prefill's, do not count), or drafting loses against steps without drafts at the same
  batch sizes (the engine's own step times, :mod:`kimi.spec.payoff`) - clearly over the last :data:`WINDOW`
  drafting steps (a token rate at most :data:`CLEAR_LOSS` times the plain rate) or at all over the last
  :data:`LONG_WINDOW` (eight steps of drafting that pays on average dip below the plain rate by chance, and a
  pause costs at least :data:`PROBE_EVERY` steps without drafts) - drafting pauses: the depth is 0 - the drafter
  runs its one prefill pass without sampling, which keeps its KV cache current (for a drafter of one attention
  layer, deferred to the next drafter pass and done there in one batch: :mod:`kimi.spec.deferred_kv`), and the
  runner hands the scheduler no drafts, so the next step decodes as without speculation (no verification, no
  budget) - except for probes of depth 1, whose drafts are verified whatever the budget says (the budget reads
  confidences a step old, which in a pause are all 0, and an estimator that sees no verified draft never learns
  otherwise): the first :data:`PROBE_EVERY` steps into the pause, and each probe whose drafts all failed doubles
  the wait for the next (up to :data:`MAX_PROBE_EVERY`: a probe's step costs about 1.5 plain steps on the CPU
  engine, so a prompt the drafter does not know should pay ever fewer of them);
  the pause ends when a probe draft is accepted and the probe step's token rate beats the plain rate by
  :data:`~kimi.spec.payoff.RESUME_MARGIN` (no rate is compared before any plain step was timed; a probe whose
  drafts all failed never ends a pause, however fast its step looked on a noisy machine), and
  drafting resumes at depth 1, the depth the probe measured; a pause that starts within :data:`RELAPSE_STEPS`
  steps of such a resume starts at twice the last interval (up to :data:`MAX_PROBE_EVERY`: one lucky probe among
  failing drafts costs a window of slow drafting, so its cost is spread over ever longer pauses), any other
  pause first probes after :data:`PROBE_EVERY` steps; once none of the requests the pause started (or last
  restarted) with is left in the batch, the pause restarts for the requests now there: a probe at once, then
  after :data:`PROBE_EVERY` steps, doubling as before (the failing drafts that lengthened the interval were other
  prompts' drafts);
- while drafting, where the batch size's plain-step time is unknown or older than
  :data:`~kimi.spec.payoff.RESAMPLE_EVERY` steps, :data:`SAMPLE_STEPS` steps decode without drafts to time it
  (at most once in :data:`SAMPLE_GAP` steps);
- for the first :data:`WARMUP_STEPS` steps after warm-up the depth stays at ``k``, so the acceptance estimator
  gets evidence at every position before the budget can shrink the drafting.

A depth of ``d < k`` leaves positions ``d .. k - 1`` undrafted: their draft token is -1 and their confidence 0,
so the budget never admits them.  Two more guards keep a -1 out of the target's input:

- adaptive verification prices the next step from a host copy of the confidences made one step earlier (it
  never waits for the device), which still holds the older, deeper drafts' confidences; the columns not drafted
  are zeroed in that copy as well (:func:`mask_host_copy`);
- the budget, chosen on the host, is bounded by the scheduled drafts whose survival probability (the running
  product of the current confidences, which the device ranks by) is positive (:func:`bound_budget`).  Above
  that bound the device would hand out zero-survival slots as ties in request order, undrafted ones included;
  that happens when the back-off (:mod:`kimi.spec.backoff`) has just zeroed a request's confidences, which the
  host copy shows only a step later.  (So with the rule on, a paused request's drafts are no longer verified in
  the first step of its pause.)

The rule runs on an eager engine only (the torch-only CPU platform: adaptive verification without full CUDA
graphs, tensors on the host): it reads the step's verdict on the host before the drafter runs, which on a GPU
would wait for the device, and a captured drafter graph has its depth fixed.  It also stays off under async
scheduling, where the scheduler schedules ``k`` placeholder drafts for every request whatever was drafted and
the rule, tested with synchronous scheduling only, has no say over them (:func:`applies`).  Greedy output
does not change: the depth only limits which drafts can be verified.

Reached through ``kimi.hooks.eagle3_adaptive_draft_depth`` (patch ``eagle3-adaptive-draft-depth``).
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kimi.spec import deferred_kv
from kimi.spec.acceptance import verdict
from kimi.spec.payoff import RESUME_MARGIN, PlainSteps, TimedStep

#: Steps after warm-up during which the drafter runs all ``k`` passes.
WARMUP_STEPS = 7
#: Steps over which the most drafts admitted to one request is taken; as many steps without an admitted draft
#: start a pause, and as many drafting steps that emit tokens at most :data:`CLEAR_LOSS` times the plain rate.
WINDOW = 8
#: Drafting steps over which drafting must pay on average (shorter windows of steps that pay on average dip below
#: the plain rate by chance: 8 steps of in-domain drafting vary by about 15 %).
LONG_WINDOW = 24
#: A window of :data:`WINDOW` drafting steps whose token rate is at most this times the plain rate pauses at once.
CLEAR_LOSS = 0.8
#: In a pause, the steps before its first probe (a step of depth 1 whose drafts are verified whatever the budget
#: says); after each probe whose drafts all failed the wait doubles.
PROBE_EVERY = 8
#: The longest interval between probes of a pause whose probes keep failing or that keeps relapsing.
MAX_PROBE_EVERY = 128
#: A pause that starts within this many steps of the last resume is a relapse.
RELAPSE_STEPS = 2 * WINDOW
#: Steps without drafts taken in a row to time a plain step while drafting.
SAMPLE_STEPS = 2
#: The fewest steps between two such samplings.
SAMPLE_GAP = 32
#: The runner attribute that holds its :class:`DraftDepth`.
RUNNER_ATTR = "_kimi_draft_depth"


@dataclass
class PassCounts:
    """Drafter work in this process since the last warm-up, over every runner with the rule on.

    Attributes:
        steps: sampling steps in which the drafter ran.
        passes: drafter forward passes in those steps (the depth, or 1 where the depth is 0: the pass that
            keeps the drafter's KV cache current, unless deferred), plus the passes that wrote deferred ones.
        paused: steps of depth 0 while drafts were asked for (a pause, or a plain step timed on purpose: no
            draft handed to the scheduler).
        deferred: steps of depth 0 whose pass was deferred (:mod:`kimi.spec.deferred_kv`).
        catch_ups: passes that wrote the deferred steps' keys and values.
    """

    steps: int = 0
    passes: int = 0
    paused: int = 0
    deferred: int = 0
    catch_ups: int = 0

    def reset(self) -> None:
        self.steps = self.passes = self.paused = self.deferred = self.catch_ups = 0


#: What the runners of this process counted (read by tests and benchmarks).
COUNTS = PassCounts()


def depth_rule(k: int, asked: int, step: int, admitted_recently: list[int], paused_for: int = 0,
               sampling: bool = False, probe_every: int = PROBE_EVERY) -> int:
    """Drafter passes for one step (0: the drafter only keeps its KV cache, no draft is proposed).

    Args:
        k: the drafter's ``num_speculative_tokens``.
        asked: drafts the scheduler asked for this step (``<= k``; 0: the drafter only keeps its KV cache).
        step: steps seen since warm-up, this one excluded.
        admitted_recently: per step of the last :data:`WINDOW` (this step's verdict included), the most drafts
            the budget admitted to one request.
        paused_for: steps of the current pause, this one included (0: no pause).
        sampling: the step decodes without drafts to time a plain step.
        probe_every: the pause's interval between probes.

    Returns:
        ``asked`` during the first :data:`WARMUP_STEPS` steps or when ``asked`` is 0; 0 while sampling; in a
        pause 0, or 1 on every ``probe_every``-th step of it; else ``min(asked, 1 + max(admitted_recently))``,
        at least 1.
    """
    if asked <= 0:
        return 0
    if step < WARMUP_STEPS:
        return asked
    if sampling:
        return 0
    if paused_for > 0:
        return 1 if paused_for % probe_every == 0 else 0
    return max(1, min(asked, k, 1 + max(admitted_recently, default=0)))


def applies(runner: Any) -> bool:
    """Whether the rule runs in ``runner`` (vLLM's ``GPUModelRunner``): adaptive verification on, a draft-model
    speculator, no full CUDA graphs, tensors on the host, synchronous scheduling."""
    if getattr(runner, "adaptive_verification", None) is None:
        return False
    speculator = getattr(runner, "speculator", None)
    if speculator is None or not hasattr(speculator, "draft_token_confidence_probs"):
        return False
    if runner.compilation_config.cudagraph_mode.has_full_cudagraphs():
        return False
    if runner.device.type != "cpu":
        return False
    return not runner.vllm_config.scheduler_config.async_scheduling


class DraftDepth:
    """Per-runner state of the rule.

    Args:
        k: the drafter's ``num_speculative_tokens``.
        counts: where drafter steps and passes are added up.
    """

    def __init__(self, k: int, counts: PassCounts = COUNTS):
        self.k = k
        self.counts = counts
        self.admitted: deque[int] = deque(maxlen=WINDOW)
        #: the timed steps verifying drafts since the last pause, the last :data:`LONG_WINDOW` of them
        self.window: deque[TimedStep] = deque(maxlen=LONG_WINDOW)
        self.reset()

    def reset(self) -> None:
        """Start over (after warm-up and profiling steps)."""
        self.plain = PlainSteps()
        self.step = 0
        self.depth = self.k
        #: ``time.perf_counter()`` at the runner's last call (None: no step since the reset)
        self.clock: float | None = None
        self.idle = self.paused_for = self.sampling = 0
        self.last_sampled = -SAMPLE_GAP
        self.resumed_at = -RELAPSE_STEPS - 1
        self.probe_every = PROBE_EVERY
        self.probing = False
        #: whether the scheduler asked for drafts at the last step (False at its requests' last step; read by
        #: :mod:`deferred_kv`)
        self.drafts_asked = False
        #: the batch's requests when the pause started or last restarted
        self.pause_requests: frozenset[str] = frozenset()
        self.deferred = deferred_kv.DeferredKV()
        self.admitted.clear()
        self.window.clear()

    def plan(self, asked: int, most_admitted: int, verifying: bool = True, any_accepted: bool = False,
             timed: TimedStep | None = None, requests: frozenset[str] = frozenset()) -> int:
        """Fold this step's verdict in and return the depth of the drafts proposed now; :attr:`probing` tells
        whether they are a pause's probe.

        Args:
            asked: drafts the scheduler asked for (``num_spec_tokens_to_schedule``).
            most_admitted: the most drafts the budget admitted to one request this step (0 if none verified).
            verifying: whether drafts were scheduled for verification this step (False in a prefill-only step
                and in the steps after a depth of 0, which count toward no pause).
            any_accepted: whether the target accepted a draft this step (in a pause: a probe's, without which
                the pause goes on; with it the pause ends while no plain step has been timed).
            timed: the step as it ran, where its batch held no prefill: a plain step's time when it verified
                nothing after a depth of 0, a drafting step's otherwise.
            requests: the ids of the batch's requests (empty: not known, the pause never restarts).
        """
        probed = self.probing  # this step verified the last step's probe
        self.drafts_asked = asked > 0
        self.admitted.append(most_admitted)
        if timed is not None and not verifying and self.depth == 0:
            self.plain.add(timed, self.step)
        if timed is not None and verifying and self.paused_for == 0:
            self.window.append(timed)
        if self.paused_for > 0:
            if self._resumes(any_accepted, verifying, timed):
                self.idle = self.paused_for = 0
                self.resumed_at = self.step
                self.window.clear()
                self.admitted.clear()
            elif requests and self.pause_requests.isdisjoint(requests):
                self.probe_every = self.paused_for = PROBE_EVERY  # their first probe now
                self.pause_requests = requests
            else:
                if verifying and probed:  # a probe that did not end the pause: the next one waits twice as long
                    self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY)
                    self.paused_for = 0
                self.paused_for += 1
        else:
            if most_admitted > 0:
                self.idle = 0
            elif verifying:
                self.idle += 1
            if self.idle >= WINDOW or not self._pays():
                self.paused_for = 1
                self.pause_requests = requests
                relapse = self.step - self.resumed_at <= RELAPSE_STEPS
                self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY) if relapse else PROBE_EVERY
                self.window.clear()
        self._plan_sampling(timed)
        self.depth = depth_rule(self.k, asked, self.step, list(self.admitted), self.paused_for, self.sampling > 0,
                                self.probe_every)
        self.probing = self.paused_for > 0 and self.depth > 0
        self.sampling = max(self.sampling - 1, 0)
        self.step += 1
        self.counts.steps += 1
        self.counts.passes += max(self.depth, 1)
        self.counts.paused += int(self.depth == 0 and asked > 0)
        return self.depth

    def _plan_sampling(self, timed: TimedStep | None) -> None:
        """While drafting past warm-up, start timing plain steps where the batch size's plain time is stale."""
        if (self.sampling or self.paused_for or timed is None or self.step < WARMUP_STEPS
                or self.step - self.last_sampled < SAMPLE_GAP or not self.plain.stale(timed.requests, self.step)):
            return
        self.sampling = SAMPLE_STEPS
        self.last_sampled = self.step

    def _pays(self) -> bool:
        """Whether drafting goes on: False where the last :data:`WINDOW` drafting steps emitted tokens at most
        :data:`CLEAR_LOSS` times as fast as plain steps would have, or the last :data:`LONG_WINDOW` ones (once there
        are that many) no faster; True otherwise, and while their batch sizes' plain times are unknown."""
        if len(self.window) < WINDOW:
            return True
        recent = list(self.window)[-WINDOW:]
        if self.plain.beaten_by(recent, CLEAR_LOSS) is False:
            return False
        return len(self.window) < LONG_WINDOW or self.plain.beaten_by(self.window) is not False

    def _resumes(self, any_accepted: bool, verifying: bool, timed: TimedStep | None) -> bool:
        """In a pause, whether the step's verdict (a probe's, when verifying) ends it."""
        if not verifying or not any_accepted:
            return False  # a probe that had no draft accepted emitted what a plain step does, at a higher cost
        beaten = None if timed is None else self.plain.beaten_by([timed], RESUME_MARGIN)
        return beaten is not False


def prepare_drafts(draft_tokens: torch.Tensor, confidences: torch.Tensor, num_reqs: int, depth: int) -> None:
    """Mark the positions the drafter will not reach, before it proposes, in place.

    Args:
        draft_tokens: ``[>= num_reqs, k]`` int64, the speculator's draft buffer (by batch row): -1 from column
            ``depth`` on.
        confidences: ``[>= num_reqs, k]`` float32, its draft confidences (by batch row): 0 from column ``depth``
            on.
        num_reqs: rows of the batch.
        depth: drafter passes this step.
    """
    draft_tokens[:num_reqs, depth:] = -1
    confidences[:num_reqs, depth:] = 0.0


def mask_host_copy(stale: np.ndarray, slots: np.ndarray, depth: int) -> None:
    """Zero the columns from ``depth`` on of the requests in ``slots`` in adaptive verification's host copy of
    the confidences, in place.

    Args:
        stale: ``[max_num_reqs, k]`` float32, the copy the next step's budget reads (made a step before the
            drafts now proposed).
        slots: ``[num_reqs]`` int, request-state slots of the batch.
        depth: the depth of the drafts now proposed.
    """
    stale[np.asarray(slots)[:, None], np.arange(depth, stale.shape[1])[None, :]] = 0.0


def positive_slots(confidences: torch.Tensor, scheduled: np.ndarray) -> int:
    """Scheduled draft slots whose survival probability is positive.

    Args:
        confidences: ``[num_reqs, k]`` float32, per-position confidences of the batch's requests (host tensor:
            the rule runs on the CPU platform only).
        scheduled: ``[num_reqs]`` int, drafts scheduled per request.

    Returns:
        The number of (request, position) slots with position < scheduled and a positive running product of
        confidences, multiplied in float32 position by position as the budget kernel does.
    """
    probs = confidences.detach().to(torch.float32).cpu().numpy()
    running = np.ones(probs.shape[0], dtype=np.float32)
    alive = np.zeros(probs.shape, dtype=bool)
    for position in range(probs.shape[1]):
        running = running * probs[:, position]
        alive[:, position] = running > 0
    eligible = np.arange(probs.shape[1])[None, :] < np.asarray(scheduled)[:, None]
    return int((alive & eligible).sum())


def bound_budget(manager: Any, req_ids: list[str], num_tokens: int, probe: bool = False) -> int:
    """Bound the draft budget that ``manager`` (vLLM's ``AdaptiveVerificationManager``) just chose by the
    scheduled drafts of positive survival (module docstring); for a pause's ``probe``, set it to them.

    Args:
        manager: the manager, right after ``get_num_tokens`` (its ``_batch_budget`` holds the choice).
        req_ids: the batch's request ids, as ``get_num_tokens`` was given them.
        num_tokens: what ``get_num_tokens`` returned: tokens before drafts plus the budget.
        probe: the scheduled drafts are a pause's probe: every one of positive survival is verified.

    Returns:
        The token count with the bounded budget (``_batch_budget`` is updated to match).
    """
    num_drafts, num_non_draft, budget = manager._batch_budget
    if (budget == 0 and not probe) or not req_ids:
        return num_tokens
    slots = [manager.req_states.req_id_to_index[r] for r in req_ids]
    scheduled = np.array([num_drafts[r] for r in req_ids], dtype=np.int64)
    limit = positive_slots(manager._confidence_probs[slots], scheduled)
    if budget == limit or (budget < limit and not probe):
        return num_tokens
    manager._batch_budget = (num_drafts, num_non_draft, limit)
    return num_tokens - (budget - limit)


# ---------------------------------------------------------------------------------------------
# The runner's side (called through the hook)


def _state(runner: Any) -> DraftDepth | None:
    """The runner's :class:`DraftDepth`, made on first use; None where the rule does not apply."""
    if not hasattr(runner, RUNNER_ATTR):
        on = applies(runner)
        setattr(runner, RUNNER_ATTR, DraftDepth(runner.num_speculative_steps) if on else None)
    return getattr(runner, RUNNER_ATTR)


def before_propose(runner: Any, input_batch: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                   asked: int) -> int:
    """The drafter passes of this step (``asked`` where the rule does not apply); marks the undrafted
    positions in the speculator's buffers (:func:`prepare_drafts`).

    Args:
        runner: vLLM's ``GPUModelRunner``, in ``sample_tokens`` before the drafter proposes.
        input_batch: the step's ``InputBatch`` (``num_draft_tokens_per_req`` None when nothing was verified).
        num_sampled: ``[num_reqs]`` int32, tokens emitted per request.
        num_rejected: ``[num_reqs]`` int32, verified drafts rejected per request.
        asked: ``num_spec_tokens_to_schedule`` of the step.
    """
    state = _state(runner)
    if state is None:
        return asked
    now = time.perf_counter()
    elapsed_ms = None if state.clock is None else (now - state.clock) * 1e3
    state.clock = now
    num_reqs = input_batch.num_reqs
    most = 0
    verifying = bool(num_reqs) and input_batch.num_draft_tokens_per_req is not None
    accepted = False
    if verifying:
        admitted, accepted_per_request = verdict(num_sampled[:num_reqs], num_rejected[:num_reqs])
        most = int(admitted.max())
        accepted = bool((accepted_per_request > 0).any())
    timed = None
    if elapsed_ms is not None and num_reqs and not input_batch.has_prefill:
        timed = TimedStep(num_reqs, int(num_sampled[:num_reqs].sum()), rank_zeros(elapsed_ms))
    depth = state.plan(asked, most, verifying, accepted, timed, frozenset(input_batch.req_ids[:num_reqs]))
    if depth < runner.num_speculative_steps:
        speculator = runner.speculator
        prepare_drafts(speculator.draft_tokens, speculator.draft_token_confidence_probs, num_reqs, depth)
    return depth


def rank_zeros(ms: float) -> float:
    """``ms`` as tensor-parallel rank 0 measured it, so that every rank's rule decides alike (each rank runs the
    drafter, whose passes must match across ranks)."""
    from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

    if not model_parallel_is_initialized() or get_tp_group().world_size == 1:
        return ms
    group = get_tp_group()
    shared = torch.tensor([ms], dtype=torch.float64)
    group.broadcast(shared, src=0)
    return float(shared[0])


def keep_for_later(runner: Any, input_batch: Any, depth: int, aux_hidden_states: list[torch.Tensor] | None,
                   slot_mappings: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Where the rule applies, :func:`kimi.spec.deferred_kv.keep_for_later` (the step's undrafted draft tokens
    where its drafter pass is deferred); else None: the drafter runs as before."""
    state = getattr(runner, RUNNER_ATTR, None)
    if state is None:
        return None
    return deferred_kv.keep_for_later(runner, state, input_batch, depth, aux_hidden_states, slot_mappings)


def drafter_scope(runner: Any, depth: int) -> AbstractContextManager:
    """Where the drafter proposes ``depth`` passes: at depth 0 under the rule (a pause; its one pass only keeps the
    drafter's KV cache current) the attention of the torch-only CPU platform skips the output nobody reads
    (:func:`kimi.cpu_platform.ops.attention_output_unused`); otherwise nothing changes."""
    if depth != 0 or getattr(runner, RUNNER_ATTR, None) is None:
        return nullcontext()
    from kimi.cpu_platform.ops import attention_output_unused

    return attention_output_unused()


def after_record(runner: Any, input_batch: Any) -> None:
    """After adaptive verification recorded the step's confidences: :func:`mask_host_copy` for the batch."""
    state = getattr(runner, RUNNER_ATTR, None)
    if state is None or state.depth >= state.k or input_batch.num_reqs == 0:
        return
    manager = runner.adaptive_verification
    stale = manager._stale_confidences[manager._stale_idx].np
    mask_host_copy(stale, input_batch.idx_mapping_np[:input_batch.num_reqs], max(state.depth, 0))


def budget_chosen(runner: Any, num_tokens_per_req: dict[str, int], num_tokens: int) -> int:
    """After adaptive verification chose the step's budget for the requests of ``num_tokens_per_req`` (in its
    order): :func:`bound_budget` where the rule applies (a probe's drafts all verified), else ``num_tokens``."""
    state = _state(runner)
    if state is None:
        return num_tokens
    return bound_budget(runner.adaptive_verification, list(num_tokens_per_req), num_tokens, probe=state.probing)


def reset(runner: Any) -> None:
    """Forget the runner's history and the pass counts (after warm-up and profiling)."""
    state = getattr(runner, RUNNER_ATTR, None)
    if state is not None:
        state.reset()
    COUNTS.reset()
