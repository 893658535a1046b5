"""Adaptive verification for EAGLE-3 on the torch-only CPU platform (mainline, patch 0025,
``kimi/spec/adaptive.py``): the config accepts it for eagle3 and refuses methods without draft confidences
before any weights load; the cost curves profiled in eager steps drive upstream's budget to no drafts where
verification costs more than the drafts bring, and to every draft where it is cheap; the budget goes to the
most confident requests; upstream's online estimator calibrates over-confident drafts against observed
acceptance on CPU; greedy output is the same with adaptive verification on and off.

Part of the mainline's suite (``python3 -m kimi test``); the ``line("mainline")`` marker skips it elsewhere.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import installed_line
from engine_script import run_engine_script

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = pytest.mark.line("mainline")

if installed_line() == "mainline":
    import numpy as np
    import torch

    # what the CPU worker installs first: placeholder CUDA events and streams, which the manager creates
    import vllm.v1.worker.cpu.shm  # noqa: F401
    from vllm.v1.worker.gpu.async_utils import StepTimingCollector
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
        build_cost_tables_from_curves,
    )

    from kimi.spec.adaptive import (
        dense_curve,
        median_curve,
        per_request_curves,
        profile_eager_costs,
        profile_token_counts,
    )

NUM_STEPS = 3
MAX_REQS = 4
MAX_TOKENS = 64


# ---------------------------------------------------------------------------------------------
# Cost curves and budget


class SleepingRunner:
    """The runner surface :func:`profile_eager_costs` uses; a dummy step sleeps ``base_ms`` + ``ms_per_token``
    x tokens in the target forward and ``draft_ms`` in the drafter, timed by upstream's collector."""

    def __init__(self, base_ms: float, ms_per_token: float, draft_ms: float, ms_per_request: float = 0.0):
        self.base_ms, self.ms_per_token, self.draft_ms = base_ms, ms_per_token, draft_ms
        self.ms_per_request = ms_per_request
        self.max_num_reqs, self.decode_query_len, self.max_num_tokens = MAX_REQS, NUM_STEPS + 1, MAX_TOKENS
        self.step_timing = StepTimingCollector()
        self.speculator = SimpleNamespace(acceptance_estimator=None)
        self.adaptive_verification = SimpleNamespace(set_cost_curves=self._keep)
        self.curves = None

    def _keep(self, draft, verify):
        self.curves = draft, verify

    def _dummy_run(self, num_tokens: int, context_len: int = 0, skip_eplb: bool = False, uniform_decode: bool = False):
        timing = self.step_timing
        num_reqs = num_tokens // self.decode_query_len if uniform_decode else min(num_tokens, MAX_REQS)
        timing.record_batch(SimpleNamespace(num_tokens=num_tokens, num_reqs=num_reqs), False)
        timing.forward_start()
        time.sleep((self.base_ms + self.ms_per_token * num_tokens + self.ms_per_request * num_reqs) / 1e3)
        timing.forward_end()
        timing.drafter_start()
        time.sleep(self.draft_ms / 1e3)
        timing.drafter_end()


def make_manager(cost_tables) -> AdaptiveVerificationManager:
    """Upstream's manager for MAX_REQS request slots of NUM_STEPS drafts, every slot past its prompt."""
    req_states = SimpleNamespace(
        num_speculative_steps=NUM_STEPS, device=torch.device("cpu"), max_num_reqs=MAX_REQS,
        max_num_batched_tokens=MAX_TOKENS, req_id_to_index={f"r{i}": i for i in range(MAX_REQS)},
        num_computed_tokens_np=np.full(MAX_REQS, 10, dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.full(MAX_REQS, 5, dtype=np.int32)))
    manager = AdaptiveVerificationManager(req_states, torch.zeros(MAX_REQS + 1, dtype=torch.int32),
                                          num_bonus_tokens=1, max_total_logits=1 << 20)
    manager.cost_tables = cost_tables
    return manager


def budget_for(manager, confidences: list[float]) -> tuple[int, list[int]]:
    """One decode step of ``len(confidences)`` requests with NUM_STEPS drafts each, request i drafting with
    confidence ``confidences[i]`` at every position: (the budget chosen, the drafts admitted per request)."""
    req_ids = [f"r{i}" for i in range(len(confidences))]
    for i, confidence in enumerate(confidences):
        manager._stale_confidences[manager._stale_idx].np[i] = confidence
        manager._confidence_probs[i] = confidence
    num_tokens = manager.get_num_tokens({r: 1 + NUM_STEPS for r in req_ids}, {r: [7] * NUM_STEPS for r in req_ids})
    cu_num_logits, _, budget, _ = manager.reallocate_drafts(req_ids, torch.arange(len(req_ids)))
    admitted = (torch.diff(cu_num_logits) - 1).tolist()
    assert num_tokens == len(req_ids) + budget and sum(admitted) == budget
    return budget, admitted


def profiled_tables(**costs):
    runner = SleepingRunner(**costs)
    profile_eager_costs(runner)
    draft, verify = runner.curves
    assert [n for n, _ in verify] == list(range(1, max(profile_token_counts(MAX_REQS, NUM_STEPS + 1, MAX_TOKENS)) + 1))
    return build_cost_tables_from_curves(draft, verify, MAX_REQS, MAX_TOKENS)


def test_profiled_costs_give_no_drafts_where_verification_costs_more_than_they_bring():
    """2 ms per verified token against drafts accepted with probability 0.6 (0.6, 0.36, 0.22 expected
    tokens per slot): every draft slot lowers tokens per millisecond, so the budget is 0."""
    manager = make_manager(profiled_tables(base_ms=1.0, ms_per_token=2.0, draft_ms=0.5))
    assert budget_for(manager, [0.6] * MAX_REQS) == (0, [0] * MAX_REQS)


def test_profiled_costs_give_every_draft_where_verification_is_cheap():
    manager = make_manager(profiled_tables(base_ms=5.0, ms_per_token=0.01, draft_ms=0.5))
    assert budget_for(manager, [0.6] * MAX_REQS) == (MAX_REQS * NUM_STEPS, [NUM_STEPS] * MAX_REQS)


def test_profiled_costs_price_a_draft_at_a_token_not_at_a_request():
    """An eager CPU step costs 1 ms, 3 ms per request (its context) and 0.1 ms per token, the drafter 1 ms. One
    request drafting at 0.6: 1 token in 1 + 1 + 3.1 ms without drafts, 2.18 in 1 + 1 + 3.4 ms with its 3, so all
    3 are verified. Priced per token by steps of one token per request, 3 drafts cost 3 more requests (+9.3 ms:
    2.18 tokens in 14.4 ms against 1 in 5.1), and the budget left drafts unverified (1 of 3 measured)."""
    tables = profiled_tables(base_ms=1.0, ms_per_token=0.1, draft_ms=1.0, ms_per_request=3.0)
    assert budget_for(make_manager(tables), [0.6]) == (NUM_STEPS, [NUM_STEPS])
    draft_ms, verify_ms = tables
    assert draft_ms[1] + verify_ms[1 + NUM_STEPS] == pytest.approx(1.0 + 1.0 + 3.0 + 0.1 * (1 + NUM_STEPS), abs=1.0)


def test_per_request_curves():
    draft, verify, per_token = per_request_curves(one_token=[(1, 4.0), (2, 7.0)], decode=[(1, 4.3), (2, 7.6)],
                                                  draft=[(1, 1.0), (2, 1.5)], drafts_per_request=3, max_tokens=8)
    assert per_token == pytest.approx(0.1)
    assert draft == [(1, pytest.approx(1.0 + 4.0 - 0.1)), (2, pytest.approx(1.5 + 7.0 - 0.2))]
    assert verify == [(n, pytest.approx(0.1 * n)) for n in range(1, 9)]
    # decode steps cheaper than one-token ones (noise): no negative cost per token
    assert per_request_curves([(1, 4.0)], [(1, 3.0)], [(1, 1.0)], 3, 2)[2] == 0.0


def test_the_budget_goes_to_the_most_confident_request():
    """Cost 2 + n ms for n verified tokens, 1 ms of drafting, two requests: request 0 drafts at 0.95, request 1
    at 0.2. Tokens per ms: none 2/5; request 0's three slots (survival 0.95, 0.90, 0.86) raise it to 4.71/8;
    request 1's first (0.2) would lower it to 4.91/9. The budget kernel runs (the budget binds)."""
    draft = dense_curve([(1, 1.0), (MAX_REQS, 1.0)])
    verify = dense_curve([(1, 3.0), (MAX_TOKENS, 2.0 + MAX_TOKENS)])
    manager = make_manager(build_cost_tables_from_curves(draft, verify, MAX_REQS, MAX_TOKENS))
    assert budget_for(manager, [0.95, 0.2]) == (3, [3, 0])


def test_the_cost_curves_reach_vllms_log():
    """The curves are logged at INFO through vLLM's logger, whose handler writes the engine's log: a module
    logger outside ``vllm.`` is left at the root's WARNING and the line never reached a worker log."""
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    keep = Keep()
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.addHandler(keep)
    vllm_logger.setLevel(logging.INFO)  # what an engine's logging configuration sets (VLLM_LOGGING_LEVEL)
    try:
        profiled_tables(base_ms=0.1, ms_per_token=0.01, draft_ms=0.1)
    finally:
        vllm_logger.removeHandler(keep)
        vllm_logger.setLevel(level)
    assert any(line.startswith("adaptive verification, eager cost curves (ms)") for line in keep.lines), keep.lines


def test_profile_token_counts_and_median_curve():
    assert profile_token_counts(4, 4, 64) == [1, 2, 4, 8, 16]
    assert profile_token_counts(3, 4, 10) == [1, 2, 4, 8, 10]
    assert median_curve([(2, 3.0), (1, 5.0), (2, 1.0), (2, 2.0)]) == [(1, 5.0), (2, 2.0)]
    assert dense_curve([(1, 1.0), (3, 5.0), (4, 5.5)]) == [(1, 1.0), (2, 3.0), (3, 5.0), (4, 5.5)]
    with pytest.raises(ValueError, match="positive sizes"):
        profile_token_counts(0, 4, 64)


# ---------------------------------------------------------------------------------------------
# Calibration


def test_the_estimator_calibrates_over_confident_drafts_to_the_observed_acceptance():
    """A synthetic trace: the drafter is 95 % sure of every draft, the target accepts each position with
    probability 0.5 (independently, so position k survives with 0.5^(k+1)). Before any refit the estimator
    predicts far above 0.5; after its refits the first position's prediction is near the observed rate."""
    g = torch.Generator().manual_seed(0)
    num_reqs, steps = 16, 120
    estimator = OnlineAcceptanceEstimator(num_reqs, NUM_STEPS, torch.device("cpu"))
    estimator.REFIT_INTERVAL = 20  # upstream's 100 steps per refit, shortened: Triton's interpreter is slow
    idx_mapping = torch.arange(num_reqs)
    temperature = torch.zeros(num_reqs)
    logits = torch.full((num_reqs, 16), -10.0)
    logits[:, 0] = -10.0 + float(np.log(0.95 * 15 / 0.05))
    confidences = torch.zeros(num_reqs, NUM_STEPS)

    def predict():
        for step in range(NUM_STEPS):
            estimator.predict(logits, idx_mapping, torch.tensor(step), confidences, temperature)
        return confidences.clone()

    first = predict()
    for _ in range(steps):
        accepted = torch.zeros(num_reqs, dtype=torch.int32)
        alive = torch.ones(num_reqs, dtype=torch.bool)
        for _position in range(NUM_STEPS):
            alive &= torch.rand(num_reqs, generator=g) < 0.5
            accepted += alive.to(torch.int32)
        rejected = NUM_STEPS - accepted  # the first rejected draft and every one after it
        estimator.step(idx_mapping, accepted + 1, rejected)
        predict()
    last = predict()
    assert torch.allclose(torch.softmax(logits, -1)[:, 0], torch.tensor(0.95))
    assert float(first[:, 0].mean()) > 0.7
    assert abs(float(last[:, 0].mean()) - 0.5) < 0.08, last[:, 0]


# ---------------------------------------------------------------------------------------------
# Config and engine


@pytest.mark.parametrize("modes, refused", [
    (None, True),  # no config (upstream's tests/v1/spec_decode/test_adaptive_verification.py): upstream's checks
    ("FULL_AND_PIECEWISE", True),  # full graphs replayed: the backend must replay varlen batches
    ("NONE", False),  # eager (the torch-only CPU platform): no graph to replay, no check
])
def test_the_manager_checks_varlen_graphs_only_where_full_graphs_replay(monkeypatch, modes, refused):
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as module

    builder = SimpleNamespace(get_cudagraph_support=lambda *_: AttentionCGSupport.NEVER)
    backend = type("NoGraphsBackend", (), {"supports_device_cpu_query_lens_mismatch": staticmethod(lambda: True)})
    group = SimpleNamespace(layer_names=["target"], backend=backend, kv_cache_spec=None,
                            get_metadata_builder=lambda _index: builder)
    monkeypatch.setattr(module, "AdaptiveVerificationManager", lambda *_a, **_k: "made")
    config = None if modes is None else SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[modes]))

    def make():
        return module.maybe_create_adaptive_verification_manager(
            enable_adaptive_verification=True, attn_groups=[[group]],
            req_states=SimpleNamespace(num_speculative_steps=3), query_start_loc=None, num_bonus_tokens=1,
            max_total_logits=1, vllm_config=config, target_layer_names={"target"})

    if refused:
        with pytest.raises(ValueError, match="NoGraphsBackend allows none"):
            make()
    else:
        assert make() == "made"


CONFIG = """
    import json
    from vllm.engine.arg_utils import EngineArgs
    try:
        config = EngineArgs(model="{target}", dtype="float32", speculative_config={spec}).create_engine_config()
    except ValueError as exc:
        print("RESULT", json.dumps({{"refused": str(exc)}}))
    else:
        spec = config.speculative_config
        print("RESULT", json.dumps({{"method": spec.method, "adaptive": spec.enable_adaptive_verification}}))
"""


def _config(spec: dict) -> dict:
    return run_engine_script(textwrap.dedent(CONFIG.format(target=PAIR / "target", spec=spec)), timeout=300)


def test_eagle3_with_adaptive_verification_is_accepted_on_the_cpu_platform():
    found = _config({"method": "eagle3", "model": str(PAIR / "drafter"), "num_speculative_tokens": 3,
                     "enable_adaptive_verification": True})
    assert found == {"method": "eagle3", "adaptive": True}


def test_a_method_without_draft_confidences_is_refused_with_the_fix():
    found = _config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                     "prompt_lookup_min": 2, "enable_adaptive_verification": True})
    assert "method 'ngram' gives no per-draft confidence" in found["refused"]
    assert "use method 'eagle3'" in found["refused"]


LOSSLESS = """
    import json
    from kimi.e2e.engine import tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    ids = tokenize("{target}", code_prompts(3))
    engine = {{**CPU_EAGER, "max_num_seqs": 4}}
    plain = vllm_greedy("{target}", ids, 24, None, **engine)
    spec = {{"method": "eagle3", "model": "{drafter}", "num_speculative_tokens": 3,
             "enable_adaptive_verification": True}}
    adaptive = vllm_greedy("{target}", ids, 24, spec, **engine)
    print("RESULT", json.dumps({{"same": plain.tokens == adaptive.tokens,
                                 "lengths": [len(t) for t in adaptive.tokens]}}))
"""


def test_greedy_output_is_the_same_with_adaptive_verification():
    found = run_engine_script(textwrap.dedent(LOSSLESS.format(target=PAIR / "target", drafter=PAIR / "drafter")))
    assert found["same"], "adaptive verification changed greedy output"
    assert found["lengths"] == [24, 24, 24]
