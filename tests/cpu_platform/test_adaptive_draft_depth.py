"""Adaptive draft depth under adaptive verification on the torch-only CPU platform (mainline, patch 0027,
``kimi/spec/depth.py``): the drafter runs ``min(k, 1 + the most drafts admitted to one request over the last 8
steps)`` passes, all ``k`` for the first 7 steps after warm-up, and none (a pause: the drafter only keeps its KV
cache, the scheduler gets no drafts) after 8 steps without an admitted draft, but for a probe every 8th step;
positions not drafted are never admitted, in
the device's ranking nor in the host's one-step-old copy of the confidences, nor through a budget above the
drafts of positive survival; the rule stays off under async scheduling, full CUDA graphs and without adaptive
verification; an engine whose drafts always fail runs far fewer drafter passes and keeps greedy output.

Part of the mainline's suite (``python3 -m kimi test``); the ``line("mainline")`` marker skips it elsewhere.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import installed_line
from engine_script import run_engine_script, wrong_drafter

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = [pytest.mark.line("mainline"), pytest.mark.long_file]

if installed_line() == "mainline":
    import numpy as np
    import torch

    # what the CPU worker installs first: placeholder CUDA events and streams, which the manager creates
    import vllm.v1.worker.cpu.shm  # noqa: F401
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
        build_cost_tables_from_curves,
    )

    from kimi.spec import depth
    from kimi.spec.adaptive import dense_curve
    from kimi.spec.depth import (
        CLEAR_LOSS,
        LONG_WINDOW,
        MAX_PROBE_EVERY,
        PROBE_EVERY,
        RELAPSE_STEPS,
        SAMPLE_STEPS,
        WINDOW,
        DraftDepth,
        PassCounts,
        depth_rule,
    )
    from kimi.spec.payoff import EMA_WEIGHT, RESAMPLE_EVERY, PlainSteps, TimedStep, bucket

K = 3
MAX_REQS = 4
MAX_TOKENS = 64


# ---------------------------------------------------------------------------------------------
# The rule


def test_the_rule_keeps_k_through_warm_up_then_follows_the_most_admitted():
    assert [depth_rule(K, K, step, [0]) for step in range(depth.WARMUP_STEPS)] == [K] * 7
    assert depth_rule(K, K, 7, [0] * 8) == 1, "at least one pass"
    assert depth_rule(K, K, 7, [0, 1, 0]) == 2
    assert depth_rule(K, K, 7, [2, 0]) == 3
    assert depth_rule(K, K, 7, [3]) == K, "never above k"
    assert depth_rule(K, 2, 7, [3]) == 2, "never above what the scheduler asked for"
    assert depth_rule(K, 0, 9, [3]) == 0, "no drafts asked: the drafter only keeps its KV cache"


def test_the_depth_falls_after_the_window_and_climbs_one_step_at_a_time():
    counts = PassCounts()
    state = DraftDepth(K, counts)
    admitted = [3] * 10 + [0] * 12 + [1, 2, 3, 3]
    depths = [state.plan(K, a, any_accepted=a > 0) for a in admitted]
    # the window of 8 steps still holds a 3 up to step 16; from step 17 on it holds only zeros: a pause
    assert depths[:17] == [K] * 17
    assert depths[17:22] == [0] * 5
    assert depths[22:] == [1, 3, 3, 3], "resumed at depth 1; then 1 + the most drafts admitted"
    assert counts.steps == len(admitted) and counts.passes == sum(max(d, 1) for d in depths)
    assert counts.paused == 5
    state.reset()
    assert [state.plan(K, 1) for _ in range(8)] == [K] * 7 + [2], "warm-up starts again after a reset"


def test_a_pause_drafts_nothing_but_probes_ever_more_rarely_and_ends_on_an_accepted_draft():
    """The first probe comes PROBE_EVERY steps into the pause; each probe whose drafts all failed doubles the wait for
    the next (8, 16, 32, ... up to MAX_PROBE_EVERY): a prompt the drafter does not know pays ever fewer probes."""
    state = DraftDepth(K, PassCounts())
    depths, probing = [], []
    for _ in range(7 + 8 + 16 + 32 + 64 + 128 + 128 + 1):
        depths.append(state.plan(K, 0))
        probing.append(state.probing)
    assert depths[:7] == [K] * 7, "warm-up"
    intervals = [8, 16, 32, 64, 128, 128]
    assert depths[7:] == [d for n in intervals for d in [0] * (n - 1) + [1]] + [0], \
        "paused from the 8th step without an admitted draft"
    assert MAX_PROBE_EVERY == 128
    assert probing == [d == 1 for d in depths], "the depth-1 steps of the pause are its probes"
    assert state.plan(K, 1) == 0, "a probe's draft verified but rejected: the pause goes on"
    assert state.plan(K, 1, any_accepted=True) == 1, "a probe's draft accepted: drafting resumes at its depth"
    assert not state.probing
    assert state.plan(K, 1) == 2, "then climbs as drafts are admitted"
    assert depth_rule(K, K, 9, [0] * 8, paused_for=1) == 0
    assert depth_rule(K, K, 9, [0] * 8, paused_for=8) == 1, "a probe"
    assert depth_rule(K, K, 9, [0] * 8) == 1, "no pause"
    assert depth_rule(K, K, 3, [0] * 8, paused_for=5) == K, "no pause in warm-up"


def test_plain_steps_are_averaged_per_bucket_scaled_by_requests_and_go_stale():
    plain = PlainSteps()
    assert [bucket(r) for r in (1, 7, 8, 15, 16, 33)] == [1, 7, 8, 8, 16, 32]
    assert plain.ms(3) is None and plain.stale(3, now=0)
    plain.add(TimedStep(3, 3, 12.0), at=10)
    plain.add(TimedStep(3, 3, 22.0), at=11)
    assert plain.ms(3) == pytest.approx(12.0 + EMA_WEIGHT * 10.0)
    plain.add(TimedStep(8, 8, 40.0), at=12)
    assert plain.ms(12) == pytest.approx(60.0), "a bucket's average scaled by the request count"
    assert plain.ms(4) is None, "no sample in that bucket"
    assert not plain.stale(3, now=11 + RESAMPLE_EVERY - 1) and plain.stale(3, now=11 + RESAMPLE_EVERY)


def test_drafting_pays_when_its_tokens_come_faster_than_plain_steps_at_the_same_batch_sizes():
    plain = PlainSteps()
    plain.add(TimedStep(2, 2, 10.0), at=0)  # 0.2 tokens a ms without drafts
    assert plain.beaten_by([TimedStep(2, 3, 12.0)]) is True  # 0.25 a ms
    assert plain.beaten_by([TimedStep(2, 3, 16.0)]) is False  # 0.1875 a ms
    assert plain.beaten_by([TimedStep(2, 3, 14.5), TimedStep(2, 3, 14.5)], margin=1.05) is False  # 0.207 < 0.21
    assert plain.beaten_by([TimedStep(2, 3, 12.0), TimedStep(5, 9, 1.0)]) is None, "no plain time for 5 requests"


def drafting_then(state: DraftDepth, step: TimedStep, steps: int) -> list[int]:
    """``steps`` verifying steps timed as ``step`` (a draft admitted and accepted in each)."""
    return [state.plan(K, 1, any_accepted=True, timed=step) for _ in range(steps)]


def test_plain_steps_are_timed_while_drafting_and_a_slow_window_pauses_until_a_probe_beats_them():
    """Drafts admitted and accepted every step, but the steps emit tokens more slowly than steps without drafts
    (off-domain prompts on a drafter that costs more than it brings): after warm-up two steps decode without drafts
    to time a plain step, then a window of slower drafting steps pauses drafting; a probe step that beats the
    plain rate by the margin ends the pause, one that does not keeps it, and so does one that looks fast but had
    no draft accepted."""
    state = DraftDepth(K, PassCounts())
    slow = TimedStep(2, 3, 20.0)  # 0.15 tokens a ms
    assert drafting_then(state, slow, depth.WARMUP_STEPS) == [K] * 7
    assert drafting_then(state, slow, 1) == [0] and state.sampling == 1, "a plain step is timed"
    assert not state.probing and not state.paused_for
    assert state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0)) == 0  # 0.2 tokens a ms
    assert state.paused_for == 1, "the warm-up window's 8 drafting steps at 0.15 < 0.2: paused once it is known"
    state = DraftDepth(K, PassCounts())
    drafting_then(state, TimedStep(2, 5, 15.0), depth.WARMUP_STEPS + 1)
    [state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0)) for _ in range(SAMPLE_STEPS)]
    assert not state.paused_for, "drafting at 0.33 tokens a ms pays"
    depths = drafting_then(state, slow, WINDOW)
    assert depths == [2] * 7 + [0] and state.paused_for == 1, \
        f"8 steps at 0.15 tokens a ms, at most {CLEAR_LOSS} x 0.2: a clear loss"
    assert len(state.window) == 0, "the pause starts a new window"
    while not state.probing:
        state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0))
    assert state.plan(K, 1, any_accepted=True, timed=TimedStep(2, 3, 14.5)) == 0, "0.207 a ms: within the margin"
    while not state.probing:
        state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0))
    assert state.plan(K, 0, any_accepted=False, timed=TimedStep(2, 2, 5.0)) == 0, \
        "0.4 a ms but no draft accepted (a noisy clock): the pause goes on"
    while not state.probing:
        state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0))
    assert state.plan(K, 1, any_accepted=True, timed=TimedStep(2, 3, 12.0)) == 1, "0.25 a ms: drafting resumes"
    assert not state.paused_for and not state.window
    fast = drafting_then(state, TimedStep(2, 5, 15.0), 2 * WINDOW)
    assert 0 not in fast, "drafting that pays neither pauses nor samples again within RESAMPLE_EVERY steps"


def test_drafting_that_loses_a_little_pauses_only_once_the_long_window_loses():
    """Eight steps at 0.94 of the plain rate (in-domain drafting dips that far by chance) do not pause drafting; it
    pauses once the last LONG_WINDOW drafting steps emit tokens no faster than plain steps: here when fewer than 3 of
    them are the fast steps of before."""
    state = DraftDepth(K, PassCounts())
    drafting_then(state, TimedStep(2, 5, 15.0), depth.WARMUP_STEPS + 1)  # 0.33 tokens a ms
    [state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0)) for _ in range(SAMPLE_STEPS)]  # 0.2
    dip = TimedStep(2, 3, 16.0)  # 0.1875 tokens a ms
    assert 0 not in drafting_then(state, dip, WINDOW), "a window above CLEAR_LOSS x the plain rate drafts on"
    assert LONG_WINDOW == 24
    depths = drafting_then(state, dip, LONG_WINDOW)
    assert depths.index(0) == 13 and state.paused_for, "the 22nd dip leaves 2 fast steps among the last 24"


def test_a_pause_that_relapses_soon_after_a_resume_probes_ever_more_rarely():
    """Off domain a probe is sometimes lucky (an accepted draft at depth 1 beats the plain rate) and the window
    after it does not pay: each such relapse doubles the interval between probes, up to MAX_PROBE_EVERY; a pause
    that starts long after its resume probes every PROBE_EVERY steps again."""
    state = DraftDepth(K, PassCounts())
    plain, slow = TimedStep(1, 1, 10.0), TimedStep(1, 1, 15.0)
    drafting_then(state, slow, depth.WARMUP_STEPS + 1)
    state.plan(K, 0, verifying=False, timed=plain)
    assert state.paused_for and state.probe_every == PROBE_EVERY
    intervals = []
    for _ in range(6):
        steps = 0
        while not state.probing:
            state.plan(K, 0, verifying=False, timed=plain)
            steps += 1
        intervals.append(steps + 1)
        state.plan(K, 1, any_accepted=True, timed=TimedStep(1, 2, 12.0))  # lucky: 0.167 tokens a ms > 0.1
        assert not state.paused_for
        drafting_then(state, slow, WINDOW)  # the resumed window: 0.067 tokens a ms
        assert state.paused_for
    assert intervals == [8, 16, 32, 64, 128, 128]
    while not state.probing:
        state.plan(K, 0, verifying=False, timed=plain)
    state.plan(K, 1, any_accepted=True, timed=TimedStep(1, 2, 12.0))
    drafting_then(state, TimedStep(1, 3, 12.0), RELAPSE_STEPS)  # drafting that pays, longer than a relapse
    drafting_then(state, slow, WINDOW)
    assert state.paused_for and state.probe_every == PROBE_EVERY


def test_a_pause_restarts_its_probes_once_its_requests_have_all_left():
    """A pause whose relapses stretched its probe interval to 64 steps (off-domain requests "a" and "b") keeps that
    interval while either request is in the batch, joiners or not; once both have left, the requests now there
    (code prompts, say) are probed at once and then every PROBE_EVERY steps, and a probe of theirs that pays ends
    the pause."""
    state = DraftDepth(K, PassCounts())
    plain, slow, lucky = TimedStep(2, 2, 10.0), TimedStep(2, 2, 15.0), TimedStep(2, 3, 12.0)
    old, mixed, new = frozenset("ab"), frozenset("bc"), frozenset("cd")
    drafting_then(state, slow, depth.WARMUP_STEPS + 1)
    state.plan(K, 0, verifying=False, timed=plain, requests=old)
    for _ in range(3):  # three relapses: 8 -> 16 -> 32 -> 64
        while not state.probing:
            state.plan(K, 0, verifying=False, timed=plain, requests=old)
        state.plan(K, 1, any_accepted=True, timed=lucky, requests=old)
        for _ in range(WINDOW):
            state.plan(K, 1, any_accepted=True, timed=slow, requests=old)
        assert state.paused_for
    assert state.probe_every == 64 and state.pause_requests == old
    for _ in range(20):
        state.plan(K, 0, verifying=False, timed=plain, requests=mixed)
    assert state.probe_every == 64 and state.paused_for == 21, "b is still there: the interval stands"
    assert state.plan(K, 0, verifying=False, timed=plain, requests=new) == 1, "the new requests' probe, at once"
    assert state.probing and state.probe_every == PROBE_EVERY and state.pause_requests == new
    assert state.plan(K, 1, any_accepted=False, timed=plain, requests=new) == 0, "it failed: the pause goes on"
    steps = 1
    while not state.probing:
        state.plan(K, 0, verifying=False, timed=plain, requests=new)
        steps += 1
    assert steps == 2 * PROBE_EVERY, "the failed probe doubled the wait for the next"
    assert state.plan(K, 1, any_accepted=True, timed=lucky, requests=new) == 1 and not state.paused_for


def test_a_plain_step_is_timed_again_once_stale_and_never_during_a_prefill():
    state = DraftDepth(K, PassCounts())
    fast = TimedStep(2, 6, 12.0)
    drafting_then(state, fast, depth.WARMUP_STEPS)
    assert [state.plan(K, 1, any_accepted=True) for _ in range(3)] == [2] * 3, "untimed steps (prefill): no sample"
    assert drafting_then(state, fast, 1) == [0]
    [state.plan(K, 0, verifying=False, timed=TimedStep(2, 2, 10.0)) for _ in range(2)]
    depths = drafting_then(state, fast, RESAMPLE_EVERY + SAMPLE_STEPS)
    first = depths.index(0)
    assert depths[first:first + SAMPLE_STEPS] == [0] * SAMPLE_STEPS and first >= RESAMPLE_EVERY - 3


def test_steps_that_verify_nothing_start_no_pause():
    """A long prompt's prefill chunks verify no draft: they neither start a pause nor end one."""
    state = DraftDepth(K, PassCounts())
    assert [state.plan(K, 0, verifying=False) for _ in range(20)] == [K] * 7 + [1] * 13
    assert [state.plan(K, 0) for _ in range(8)] == [1] * 7 + [0], "eight verifying steps without an admitted draft"
    assert [state.plan(K, 0, verifying=False) for _ in range(8)] == [0] * 6 + [1, 0], "the pause goes on, probing"


def test_undrafted_positions_get_token_minus_one_and_confidence_zero():
    tokens = torch.arange(12).reshape(4, K)
    confidences = torch.full((4, K), 0.9)
    depth.prepare_drafts(tokens, confidences, num_reqs=2, depth=1)
    assert tokens[:2, 1:].eq(-1).all() and confidences[:2, 1:].eq(0).all()
    assert tokens[:2, 0].tolist() == [0, 3] and confidences[:2, 0].eq(0.9).all()
    assert tokens[2:].ge(0).all() and confidences[2:].eq(0.9).all(), "rows past the batch untouched"


# ---------------------------------------------------------------------------------------------
# What the budget admits (upstream's manager, upstream's budget kernel)


def make_manager(verify: list[tuple[int, float]]) -> AdaptiveVerificationManager:
    """Upstream's manager for MAX_REQS slots of K drafts, drafting free, verification priced by ``verify``."""
    req_states = SimpleNamespace(
        num_speculative_steps=K, device=torch.device("cpu"), max_num_reqs=MAX_REQS,
        max_num_batched_tokens=MAX_TOKENS, req_id_to_index={f"r{i}": i for i in range(MAX_REQS)},
        num_computed_tokens_np=np.full(MAX_REQS, 10, dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.full(MAX_REQS, 5, dtype=np.int32)))
    manager = AdaptiveVerificationManager(req_states, torch.zeros(MAX_REQS + 1, dtype=torch.int32),
                                          num_bonus_tokens=1, max_total_logits=1 << 20)
    manager.cost_tables = build_cost_tables_from_curves([(1, 0.0), (MAX_REQS, 0.0)], dense_curve(verify), MAX_REQS,
                                                        MAX_TOKENS)
    return manager


FLAT = [(1, 10.0), (MAX_TOKENS, 10.0)]  # verification costs the same whatever it verifies: every draft pays


def run_steps(manager, steps: list[tuple[int, list[float]]], mask: bool, bound: bool) -> list[list[int]]:
    """Draft ``steps`` (each: the depth, and each request's confidence at the drafted positions, 0 for a
    request the back-off paused) for requests r0, r1, recording confidences as the runner does, then verify
    the last step's drafts; returns the draft token ids admitted per request (upstream's ``get_num_tokens``
    and ``reallocate_drafts``)."""
    req_ids = ["r0", "r1"]
    batch = SimpleNamespace(num_reqs=2, idx_mapping=torch.tensor([0, 1]), idx_mapping_np=np.array([0, 1]))
    for d, per_request in steps:
        tokens = torch.full((2, K), 7, dtype=torch.int64)
        confidences = torch.tensor([[c] * K for c in per_request], dtype=torch.float32)
        depth.prepare_drafts(tokens, confidences, 2, d)
        manager.record_confidences(confidences, batch)
        if mask:
            depth.mask_host_copy(manager._stale_confidences[manager._stale_idx].np, batch.idx_mapping_np, d)
    num_tokens_per_req = {r: 1 + K for r in req_ids}
    num_tokens = manager.get_num_tokens(num_tokens_per_req, {r: [7] * K for r in req_ids})
    if bound:
        num_tokens = depth.bound_budget(manager, req_ids, num_tokens)
    cu_num_logits, _, budget, _ = manager.reallocate_drafts(req_ids, batch.idx_mapping)
    admitted = (torch.diff(cu_num_logits) - 1).tolist()
    assert num_tokens == len(req_ids) + budget and sum(admitted) == budget
    return [tokens[r, :n].tolist() for r, n in enumerate(admitted)]


def test_without_the_host_mask_the_budget_admits_a_minus_one_draft():
    """Step 1 drafts all K positions (confident), step 2 only one: the budget of the step that verifies step 2's
    drafts reads the host copy made at step 1, in which positions 1 and 2 are still confident. Verification
    priced flat, so the budget takes every draft it counts: all six, positions 1 and 2 included, whose ids
    are -1 - which the target would embed. With the copy masked it takes the two drafted ones."""
    steps = [(K, [0.9, 0.9]), (1, [0.9, 0.9])]
    admitted = run_steps(make_manager(FLAT), steps, mask=False, bound=False)
    assert -1 in sum(admitted, []), admitted
    assert run_steps(make_manager(FLAT), steps, mask=True, bound=False) == [[7], [7]]
    assert run_steps(make_manager(FLAT), steps, mask=True, bound=True) == [[7], [7]]


def test_a_probe_is_verified_whatever_the_budget_chose():
    """A pause's probe: the budget, reading confidences a step old (all 0 in a pause), admits nothing; the
    probe's drafts of positive survival on the device are all verified, undrafted positions never."""
    manager = make_manager([(1, 10.0), (MAX_TOKENS, 1e4)])  # verification priced so the budget admits nothing
    req_ids = ["r0", "r1"]
    batch = SimpleNamespace(num_reqs=2, idx_mapping=torch.tensor([0, 1]), idx_mapping_np=np.array([0, 1]))
    for d in (0, 1):  # a paused step, then the probe (depth 1)
        tokens, confidences = torch.full((2, K), 7, dtype=torch.int64), torch.full((2, K), 0.9)
        depth.prepare_drafts(tokens, confidences, 2, d)
        manager.record_confidences(confidences, batch)
        depth.mask_host_copy(manager._stale_confidences[manager._stale_idx].np, batch.idx_mapping_np, d)
    num_tokens_per_req = {r: 1 + K for r in req_ids}
    chosen = manager.get_num_tokens(num_tokens_per_req, {r: [7] * K for r in req_ids})
    assert chosen == 2 and depth.bound_budget(manager, req_ids, chosen) == 2, "the budget alone verifies none"
    assert depth.bound_budget(manager, req_ids, chosen, probe=True) == 4
    cu_num_logits, _, budget, _ = manager.reallocate_drafts(req_ids, batch.idx_mapping)
    assert budget == 2 and (torch.diff(cu_num_logits) - 1).tolist() == [1, 1]


def test_without_the_bound_a_paused_request_lets_a_zero_survival_tie_admit_a_minus_one_draft():
    """Depth 1, the host copy masked, verification priced flat. The back-off has just zeroed r1's confidences,
    which the one-step-old host copy does not show yet: the budget counts two drafts where the device ranks one
    above zero, and hands the second out as a zero-survival tie in request order - r0's undrafted position 1.
    Bounded by the drafts of positive survival, only r0's drafted position is admitted."""
    steps = [(1, [0.9, 0.9]), (1, [0.9, 0.0])]
    admitted = run_steps(make_manager(FLAT), steps, mask=True, bound=False)
    assert admitted[0] == [7, -1], admitted
    assert run_steps(make_manager(FLAT), steps, mask=True, bound=True) == [[7], []]


# ---------------------------------------------------------------------------------------------
# Where the rule runs


def fake_runner(**overrides):
    """The runner surface :mod:`kimi.spec.depth` uses: adaptive verification on, eager, on the CPU, synchronous
    scheduling, a drafter of K drafts for MAX_REQS rows."""
    speculator = SimpleNamespace(draft_tokens=torch.zeros(MAX_REQS, K, dtype=torch.int64),
                                 draft_token_confidence_probs=torch.full((MAX_REQS, K), 0.5))
    runner = SimpleNamespace(
        adaptive_verification=make_manager(FLAT), speculator=speculator, num_speculative_steps=K,
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.NONE), device=torch.device("cpu"),
        vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False)))
    for key, value in overrides.items():
        setattr(runner, key, value)
    return runner


#: What each case changes in :func:`fake_runner`.
CASES = {
    "eager-cpu": lambda: {},
    "async-scheduling": lambda: {
        "vllm_config": SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True))},
    "full-cuda-graphs": lambda: {
        "compilation_config": SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)},
    "no-adaptive-verification": lambda: {"adaptive_verification": None},
    "cuda-device": lambda: {"device": torch.device("cuda")},
    "no-confidences": lambda: {"speculator": SimpleNamespace()},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_rule_runs_only_on_an_eager_cpu_engine_with_synchronous_scheduling(case):
    on = case == "eager-cpu"
    overrides = CASES[case]()
    runner = fake_runner(**overrides)
    assert depth.applies(runner) is on
    batch = SimpleNamespace(num_reqs=2, idx_mapping_np=np.array([0, 1]), num_draft_tokens_per_req=np.array([K, K]),
                            has_prefill=False, req_ids=["a", "b"])
    no_drafts = torch.tensor([1, 1]), torch.tensor([0, 0])  # the budget admitted no draft: the bonus token only
    counts = (depth.COUNTS.steps, depth.COUNTS.passes)
    depths = [depth.before_propose(runner, batch, *no_drafts, K) for _ in range(9)]
    if on:
        assert depths == [K] * 7 + [0, 0], "eight steps without an admitted draft: a pause"
        assert getattr(runner, depth.RUNNER_ATTR).paused_for == 2
        assert runner.speculator.draft_tokens[:2].eq(-1).all()
        assert runner.speculator.draft_token_confidence_probs[:2].eq(0).all()
        assert (depth.COUNTS.steps - counts[0], depth.COUNTS.passes - counts[1]) == (9, 7 * K + 2)
    else:
        assert depths == [K] * 9, "off: the drafter runs every pass the scheduler asked for"
        assert (depth.COUNTS.steps, depth.COUNTS.passes) == counts


def test_a_paused_drafter_attends_to_nothing_only_under_the_rule():
    """At depth 0 under the rule the drafter's pass only keeps its KV cache: its attention skips the output
    (:func:`kimi.cpu_platform.ops.attention_output_unused`); at any other depth, or where the rule does not run,
    the scope changes nothing."""
    from kimi.cpu_platform import ops

    runner = fake_runner()
    depth.before_propose(runner, SimpleNamespace(num_reqs=0, num_draft_tokens_per_req=None, req_ids=[]), torch.zeros(0),
                         torch.zeros(0), K)  # the rule's state is made on first use
    with depth.drafter_scope(runner, 0):
        assert ops._OUTPUT_UNUSED.get()
    assert not ops._OUTPUT_UNUSED.get()
    for runner_, d in ((runner, 1), (runner, K), (fake_runner(adaptive_verification=None), 0)):
        depth._state(runner_)
        with depth.drafter_scope(runner_, d):
            assert not ops._OUTPUT_UNUSED.get()


# ---------------------------------------------------------------------------------------------
# Engine


ENGINE = """
    import json, sys
    from engine_script import price_verification
    import kimi.spec.depth
    from kimi.e2e.engine import tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts

    if "--without" in sys.argv:  # the drafter's passes as before the rule: all k, every step
        kimi.spec.depth.WARMUP_STEPS = 1 << 30

    # drafts priced to zero acceptance: verifying any draft costs 10 s against 10 ms for the step without, so
    # the budget admits none (the profiled curves vary with the machine's load); --flat: verification priced
    # flat, so the budget admits every draft it believes in and only the back-off withholds them
    price_verification(10.0 if "--flat" in sys.argv else 1e4)

    ids = tokenize("{target}", code_prompts(1))
    engine = {{**CPU_EAGER, "max_num_seqs": 1}}
    plain = vllm_greedy("{target}", ids, {tokens}, None, **engine)
    spec = {{"method": "eagle3", "model": "{bad}", "num_speculative_tokens": 3, "enable_adaptive_verification": True,
             "adaptive_backoff_patience": 2, "adaptive_backoff_steps": 4, "adaptive_backoff_max_steps": 8}}
    run = vllm_greedy("{target}", ids, {tokens}, spec, **engine)
    counts = kimi.spec.depth.COUNTS
    print("RESULT", json.dumps({{"same": run.tokens == plain.tokens, "steps": counts.steps,
                                 "passes": counts.passes, "paused": counts.paused,
                                 "counters": run.counters}}))
"""


def engine_script(bad: Path, tokens: int) -> str:
    return textwrap.dedent(ENGINE.format(target=PAIR / "target", bad=bad, tokens=tokens))


def test_an_engine_whose_drafts_fail_runs_far_fewer_drafter_passes_and_keeps_greedy_output(tmp_path: Path):
    """The shipped pair with its drafter's lm_head rows rolled by half its vocabulary (every draft wrong), drafts
    priced to zero acceptance (verification so dear that the budget admits none), one request x 32 tokens: before
    the rule the drafter ran all 3 passes in every step (the script's ``--without``: 3 x steps, less a last step
    that asks for no draft); with it, 3 in each of the 7 warm-up steps and at most 1 in every step after - from the
    8th step without an admitted draft a pause, in which the one pass (deferred, written at the probes) only keeps
    the drafter's KV cache and the scheduler gets drafts only from a probe every 8th step - and greedy output
    equals no speculation's."""
    found = run_engine_script(engine_script(wrong_drafter(PAIR / "drafter", tmp_path / "drafter"), 32))
    assert found["same"], "the draft depth changed greedy output"
    steps, passes = found["steps"], found["passes"]
    assert steps >= 30, found
    assert passes <= depth.WARMUP_STEPS * K + (steps - depth.WARMUP_STEPS), found
    assert passes < 0.6 * K * steps, found
    assert found["counters"]["num_accepted_tokens"] == 0, found
    # a pause from the 8th step without an admitted draft: the scheduler gets drafts in warm-up and probes only
    assert found["paused"] >= steps - depth.WARMUP_STEPS - 1 - steps // depth.PROBE_EVERY, found
    assert found["counters"]["num_drafts"] <= depth.WARMUP_STEPS + steps // depth.PROBE_EVERY, found
