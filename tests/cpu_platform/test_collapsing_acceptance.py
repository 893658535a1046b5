"""Collapsing acceptance under adaptive verification on the torch-only CPU platform (mainline, patch 0026,
``kimi/spec/``): a request whose drafts keep failing stops drafting and is probed again after pauses that
double, and drafts again once a probe is accepted; per-request, per-position acceptance is kept; the config
refuses bad back-off values before any weights load; the metrics reach vLLM's Prometheus registry and cross
the engine-core-to-frontend msgpack; a collapse logs one warning; greedy output is the same with the back-off
on and off, and an engine whose drafts always fail pauses, probes and verifies fewer drafts.

Part of the mainline's suite (``python3 -m kimi test``); the ``line("mainline")`` marker skips it elsewhere.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import installed_line
from engine_script import run_engine_script, wrong_drafter

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = [pytest.mark.line("mainline"), pytest.mark.long_file]

if installed_line() == "mainline":
    import torch

    from kimi.spec import collapse
    from kimi.spec.backoff import BackoffOptions, DraftBackoff, backoff_options
    from kimi.spec.metrics import OUTPUT_ATTR, AdaptiveVerificationProm, StepSummary, carry
    from kimi.spec.watch import VerificationWatch

K = 3


# ---------------------------------------------------------------------------------------------
# The rule on a synthetic acceptance trace


class Engine:
    """A stand-in for the runner around :class:`VerificationWatch`: each step, request r's drafts are verified
    (all ``K``) when the confidences recorded at the step before are positive - the budget of a cheap
    verification - and ``accept(r, step)`` of them are accepted."""

    def __init__(self, options: BackoffOptions, num_reqs: int = 2):
        spec = SimpleNamespace(enable_adaptive_verification=True, model="drafter", method="eagle3",
                               **{f: getattr(options, a) for f, a in
                                  {"adaptive_backoff_patience": "patience", "adaptive_backoff_steps": "first_steps",
                                   "adaptive_backoff_max_steps": "max_steps"}.items()})
        self.num_reqs = num_reqs
        self.watch = VerificationWatch(8, K, torch.device("cpu"), spec, logging.getLogger("test"))
        self.recorded = torch.ones(8, K)  # adaptive verification's _confidence_probs, by slot
        self.slots = np.array([3, 5, 6, 7][:num_reqs])

    def step(self, step: int, accept) -> list[int]:
        """One step; returns the drafts verified per request."""
        admitted = [K if float(self.recorded[s].min()) > 0 else 0 for s in self.slots]
        accepted = [min(accept(r, step), a) for r, a in enumerate(admitted)]
        batch = SimpleNamespace(num_reqs=self.num_reqs, req_ids=[f"r{r}" for r in range(self.num_reqs)],
                                idx_mapping=torch.tensor(self.slots), idx_mapping_np=self.slots,
                                num_draft_tokens_per_req=np.full(self.num_reqs, K), num_draft_tokens=sum(admitted))
        new = torch.full((8, K), 0.9)
        self.watch.step_done(batch, torch.tensor(accepted) + 1, torch.tensor(admitted) - torch.tensor(accepted),
                             self.recorded, new, SimpleNamespace())
        self.recorded[torch.tensor(self.slots)] = new[:self.num_reqs]
        return admitted


def test_a_collapsing_request_stops_drafting_is_probed_with_doubling_pauses_and_resumes():
    """Request 0 drafts well for 20 steps, then nothing it drafts is accepted until step 150, then well again;
    request 1 drafts well throughout. Patience 4, first pause 8, longest 32."""
    engine = Engine(BackoffOptions(patience=4, first_steps=8, max_steps=32))

    def accept(r, step):
        return 0 if r == 0 and 20 <= step < 150 else 2

    verified = np.array([engine.step(step, accept) for step in range(220)])
    drafting = verified[:, 0] > 0
    assert drafting[:24].all()  # 4 failed steps (20-23) before the pause
    # step 23 starts a pause of 8: drafts proposed at 23..30 are withheld; the probe is verified at step 32
    # (the one-step lag of recorded confidences); it fails, the pause doubles: 16, then 32, 32, ...
    probes = [int(s) for s in np.flatnonzero(drafting[24:]) + 24]
    assert probes[:4] == [32, 49, 82, 115]
    assert not drafting[24:32].any() and not drafting[33:49].any() and not drafting[50:82].any()
    # the first probe after step 150 is accepted: the request drafts every step again
    resumed = min(p for p in probes if p >= 150)
    assert resumed <= 150 + 32 + 1
    assert drafting[resumed:].all()
    assert (verified[:, 1] == K).all(), "the healthy request never stopped drafting"
    assert engine.watch.backoff.pause[5] == 0 and engine.watch.backoff.pause[3] == 0


def test_the_engine_keeps_per_request_per_position_acceptance():
    engine = Engine(BackoffOptions(patience=0), num_reqs=2)  # back-off off: every draft verified
    for step in range(10):
        engine.step(step, lambda r, s: 1 if r == 0 else 3)
    tracker = engine.watch.tracker
    assert tracker.rate(3).tolist() == [1.0, 0.0, 0.0]
    assert tracker.rate(5).tolist() == [1.0, 1.0, 1.0]
    assert tracker.verified[3].tolist() == [10.0, 10.0, 10.0]
    # a new request in slot 3 starts from nothing
    engine.watch._take_slots(["new", "r1"], engine.slots)
    assert tracker.verified[3].tolist() == [0.0, 0.0, 0.0] and tracker.verified[5].tolist() == [10.0] * 3


def test_a_request_is_not_paused_for_failures_spread_out():
    backoff = DraftBackoff(BackoffOptions(patience=3, first_steps=4, max_steps=8), 2, torch.device("cpu"))
    slots = torch.tensor([0])
    for step, accepted in enumerate([0, 0, 1, 0, 0, 1, 0, 0]):
        started, _ = backoff.update(step, slots, torch.tensor([K]), torch.tensor([accepted]))
        assert not started.any()
        assert not backoff.paused_next(step, slots).any()


def test_off_means_nothing_is_withheld():
    engine = Engine(BackoffOptions(patience=0))
    verified = [engine.step(step, lambda r, s: 0) for step in range(40)]
    assert all(v == [K, K] for v in verified)
    assert engine.watch.backoff is None


# ---------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(("fields", "message"), [
    ({"adaptive_backoff_patience": -1}, "adaptive_backoff_patience must be >= 0"),
    ({"adaptive_backoff_steps": 0}, "adaptive_backoff_steps (the first pause, in steps) must be >= 1"),
    ({"adaptive_backoff_steps": 64, "adaptive_backoff_max_steps": 32}, "adaptive_backoff_max_steps (32) must be >="),
    ({"adaptive_backoff_patience": 2.5}, "adaptive_backoff_patience must be an integer"),
    ({"adaptive_backoff_patience": True}, "adaptive_backoff_patience must be an integer"),
])
def test_bad_backoff_values_are_refused(fields, message):
    spec = SimpleNamespace(enable_adaptive_verification=True, **fields)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        backoff_options(spec)


def test_backoff_values_without_adaptive_verification_are_refused():
    spec = SimpleNamespace(enable_adaptive_verification=False, adaptive_backoff_patience=4)
    with pytest.raises(ValueError, match='add "enable_adaptive_verification": true'):
        backoff_options(spec)


def test_backoff_defaults():
    assert backoff_options(SimpleNamespace(enable_adaptive_verification=False)) == BackoffOptions(8, 16, 256)
    spec = SimpleNamespace(enable_adaptive_verification=True, adaptive_backoff_patience=3,
                           adaptive_backoff_steps=None, adaptive_backoff_max_steps=None)
    assert backoff_options(spec) == BackoffOptions(3, 16, 256)


CONFIG = """
    import json
    from vllm.engine.arg_utils import EngineArgs
    for spec in {specs}:
        try:
            config = EngineArgs(model="{target}", dtype="float32", speculative_config=spec).create_engine_config()
        except ValueError as exc:
            print("CASE", json.dumps({{"refused": str(exc)}}))
        else:
            s = config.speculative_config
            print("CASE", json.dumps({{"patience": s.adaptive_backoff_patience, "steps": s.adaptive_backoff_steps}}))
    print("RESULT", json.dumps("done"))
"""


def test_the_speculative_config_takes_the_knobs_and_refuses_bad_values_before_loading_weights():
    base = {"method": "eagle3", "model": str(PAIR / "drafter"), "num_speculative_tokens": 3}
    specs = [{**base, "enable_adaptive_verification": True, "adaptive_backoff_patience": 2,
              "adaptive_backoff_steps": 4},
             {**base, "enable_adaptive_verification": True, "adaptive_backoff_steps": 0},
             {**base, "adaptive_backoff_patience": 2}]
    script = textwrap.dedent(CONFIG.format(target=PAIR / "target", specs=specs))
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    cases = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("CASE ")]
    assert len(cases) == 3, (done.stdout + done.stderr)[-3000:]
    assert cases[0] == {"patience": 2, "steps": 4}
    assert "adaptive_backoff_steps (the first pause, in steps) must be >= 1" in cases[1]["refused"]
    assert "enable_adaptive_verification" in cases[2]["refused"]


# ---------------------------------------------------------------------------------------------
# Metrics and the warning


def test_the_metrics_reach_prometheus_and_cross_to_the_frontend():
    import prometheus_client
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    unregister_vllm_metrics()
    summary = StepSummary(budget=[5.0], verified=[2.0, 2.0, 1.0], estimated=[1.6, 1.1, 0.4],
                          observed=[2.0, 1.0, 0.0], paused=1.0, pauses=1.0, probes=0.0)
    output = SimpleNamespace(**{OUTPUT_ATTR: summary.as_dict()})
    stats = carry(SimpleNamespace(log_stats=True, num_spec_tokens=K), None, output)
    # engine core -> frontend, as vLLM sends it
    wire = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=SchedulerStats(spec_decoding_stats=stats)))
    stats = MsgpackDecoder(EngineCoreOutputs).decode(wire).scheduler_stats.spec_decoding_stats
    assert stats.adaptive_verification == summary.as_dict()

    spec = SimpleNamespace(num_speculative_tokens=K, enable_adaptive_verification=True)
    prom = SpecDecodingProm(spec, ["model_name", "engine"], {0: ["m", "0"]})
    prom.observe(stats, 0)
    text = prometheus_client.generate_latest().decode()
    for line in ['vllm:spec_decode_adaptive_draft_budget_sum{engine="0",model_name="m"} 5.0',
                 'vllm:spec_decode_adaptive_verified_tokens_per_pos_total{engine="0",model_name="m",position="0"} 2.0',
                 ('vllm:spec_decode_adaptive_estimated_accepted_tokens_per_pos_total{engine="0",model_name="m",'
                  'position="1"} 1.1'),
                 ('vllm:spec_decode_adaptive_observed_accepted_tokens_per_pos_total{engine="0",model_name="m",'
                  'position="1"} 1.0'),
                 'vllm:spec_decode_adaptive_paused_requests{engine="0",model_name="m"} 1.0',
                 'vllm:spec_decode_adaptive_pauses_total{engine="0",model_name="m"} 1.0',
                 'vllm:spec_decode_adaptive_probes_total{engine="0",model_name="m"} 0.0']:
        assert line in text, line
    unregister_vllm_metrics()
    # without adaptive verification: none of them
    SpecDecodingProm(SimpleNamespace(num_speculative_tokens=K, enable_adaptive_verification=False),
                     ["model_name", "engine"], {0: ["m", "0"]})
    assert "spec_decode_adaptive" not in prometheus_client.generate_latest().decode()
    unregister_vllm_metrics()


def test_no_summary_leaves_the_stats_alone():
    assert carry(SimpleNamespace(log_stats=True, num_spec_tokens=K), None, SimpleNamespace()) is None
    assert carry(SimpleNamespace(log_stats=False, num_spec_tokens=K), None,
                 SimpleNamespace(**{OUTPUT_ATTR: StepSummary().as_dict()})) is None
    assert not AdaptiveVerificationProm(None, [], {}).enabled


def _warnings(trace) -> list[str]:
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("test.collapse")
    logger.addHandler(handler)
    try:
        monitor = collapse.CollapseMonitor("my-drafter", logger)
        for verified, accepted in trace:
            monitor.observe(verified, accepted)
    finally:
        logger.removeHandler(handler)
    return lines


def test_a_collapse_logs_one_warning_naming_the_drafter_and_both_levels():
    steady = [(8, 5.6)] * 100  # 0.7 of 800 drafts
    fallen = [(8, 0.4)] * 200  # 0.05
    lines = _warnings(steady + fallen)
    assert len(lines) == 1, lines
    assert "my-drafter" in lines[0] and "fell to 0." in lines[0] and "recent 0.6" in lines[0]
    assert _warnings(steady * 3) == []
    assert _warnings([(8, 0.4)] * 300) == [], "low from the start is not a fall"
    # recovered, then fallen again: a second episode
    assert len(_warnings(steady + fallen + steady * 4 + fallen)) == 2


# ---------------------------------------------------------------------------------------------
# Engine


ENGINE = """
    import json
    import vllm
    from engine_script import price_verification
    from kimi.e2e.engine import tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    from vllm.v1.metrics.reader import Histogram

    # verification priced flat (10 ms whatever it verifies, drafting free): the budget then admits every draft,
    # so whatever is not verified was withheld by the back-off (the profiled curves vary with the machine's load)
    price_verification(10.0)

    found = {{}}
    get_metrics = vllm.LLM.get_metrics
    def keep(self):
        metrics = get_metrics(self)
        found.clear()
        for m in metrics:
            if m.name.startswith("vllm:spec_decode"):
                value = m.count if isinstance(m, Histogram) else getattr(m, "value", None)
                found[m.name] = found.get(m.name, 0) + (sum(m.values) if value is None else value)
        return metrics
    vllm.LLM.get_metrics = keep

    ids = tokenize("{target}", code_prompts(2))
    engine = {{**CPU_EAGER, "max_num_seqs": 2}}
    plain = vllm_greedy("{target}", ids, {tokens}, None, **engine)
    spec = {{"method": "eagle3", "model": "{bad}", "num_speculative_tokens": 3, "enable_adaptive_verification": True,
             "adaptive_backoff_patience": 2, "adaptive_backoff_steps": 4, "adaptive_backoff_max_steps": 8}}
    run = vllm_greedy("{target}", ids, {tokens}, spec, **engine)
    print("RESULT", json.dumps({{"same": run.tokens == plain.tokens, "metrics": found}}))
"""


def test_an_engine_whose_drafts_fail_pauses_and_probes_and_keeps_greedy_output(tmp_path: Path):
    """The shipped pair with its drafter's lm_head rows rolled by half its vocabulary (drafts wrong, as confidently
    as before), verification priced flat so that the budget alone would verify every draft, 2 requests x 48 tokens: with
    the back-off (patience 2, pauses 4 to 8) the requests pause and are probed, most scheduled drafts are never
    verified (and the draft depth's pause, patch 0027, soon schedules none), and greedy output equals no
    speculation's."""
    bad = wrong_drafter(PAIR / "drafter", tmp_path / "drafter")
    found = run_engine_script(textwrap.dedent(ENGINE.format(target=PAIR / "target", bad=bad, tokens=48)))
    assert found["same"], "the back-off changed greedy output"
    m = found["metrics"]
    assert m["vllm:spec_decode_adaptive_pauses"] >= 2
    assert m["vllm:spec_decode_adaptive_probes"] >= 2
    assert m["vllm:spec_decode_adaptive_observed_accepted_tokens_per_pos"] == 0
    scheduled = m["vllm:spec_decode_num_draft_tokens"]
    verified = m["vllm:spec_decode_adaptive_verified_tokens_per_pos"]
    assert scheduled > 0 and verified < 0.5 * scheduled, (verified, scheduled)
    # steps recorded in the budget histogram: those with drafts scheduled, which the depth's pause makes few
    assert m["vllm:spec_decode_adaptive_draft_budget"] >= 8
