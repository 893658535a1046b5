"""Deferred drafter passes in a pause of the draft depth (mainline, patch 0027, ``kimi/spec/deferred_kv.py``): the
drafter's keys and values of the paused steps are written in one batch at its next pass, and they equal what the
pass of every paused step wrote.

Part of the mainline's suite (``python3 -m kimi test``); the ``line("mainline")`` marker skips it elsewhere.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from engine_script import make_reference_models, run_engine_script

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = [pytest.mark.line("mainline"), pytest.mark.long_file]

#: One engine per variant, in one process: the draft depth forced to 0 for steps 10 to 39 (a pause) and to k
#: elsewhere, verification priced flat (the budget admits every draft of positive survival, whatever the
#: machine's load), the drafter's KV cache zeroed before the prompts run and copied after.
ENGINE = """
    import json, sys
    import torch
    from engine_script import price_verification, wrong_drafter
    import kimi.spec.deferred_kv
    import kimi.spec.depth
    from kimi.e2e.engine import SPEC_METRICS, spec_metrics, tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    from vllm import LLM, SamplingParams

    probes = {probes}  # steps of the pause that draft (their drafts are scheduled at the next step)

    def forced(k, asked, step, admitted_recently, paused_for=0, sampling=False, probe_every=8):
        return 0 if asked <= 0 or (10 <= step < 40 and step not in probes) else asked
    kimi.spec.depth.depth_rule = forced
    # no pause of the rule's own: its timed verdict (drafting slower than plain steps) varies with the machine's
    # load and would make the probe's budget, so the drafts verified and the rejected drafts' keys and values
    # left in the cache, differ between the variants
    kimi.spec.depth.DraftDepth._pays = lambda self: True

    price_verification(10.0)

    def drafter_kv(worker, zero=False):
        runner = worker.model_runner
        (name,) = runner.speculator.draft_attn_layer_names
        kv = runner.compilation_config.static_forward_context[name].kv_cache
        kv = kv[0] if isinstance(kv, list) else kv
        if zero:
            kv.zero_()
        return kv.clone()

    def vllm_counters(llm):
        found = spec_metrics(llm.get_metrics())
        return {{key: found[key] for key in SPEC_METRICS.values()}}

    target, drafter = "{target}", "{drafter}"
    if {rejected}:  # every draft rejected: the draft back-off withholds the failing requests' drafts
        import tempfile
        from pathlib import Path
        drafter = str(wrong_drafter(Path(drafter), Path(tempfile.mkdtemp()) / "drafter"))
    ids = tokenize(target, code_prompts(2))
    engine = {{**CPU_EAGER, "max_num_seqs": 2}}
    plain = vllm_greedy(target, ids, {tokens}, None, **engine).tokens
    spec = {{"method": "eagle3", "model": drafter, "num_speculative_tokens": 3,
             "enable_adaptive_verification": True}}
    keeps, writes = kimi.spec.deferred_kv.defers, kimi.spec.deferred_kv.DeferredKV.write
    found, kv = {{}}, {{}}
    for variant in ("deferred", "every step", "never written"):
        kimi.spec.deferred_kv.defers = (lambda *a: False) if variant == "every step" else keeps
        kimi.spec.deferred_kv.DeferredKV.write = (lambda self, *a: self.clear()) if variant == "never written" \\
            else writes
        llm = LLM(model=target, speculative_config=spec, disable_log_stats=False, **engine)
        llm.collective_rpc(lambda worker: drafter_kv(worker, zero=True))
        kimi.spec.depth.COUNTS.reset()
        outputs = llm.generate([{{"prompt_token_ids": p}} for p in ids],
                               SamplingParams(temperature=0, max_tokens={tokens}, ignore_eos=True), use_tqdm=False)
        kv[variant] = llm.collective_rpc(drafter_kv)[0]
        counts = kimi.spec.depth.COUNTS
        found[variant] = {{"same": [list(o.outputs[0].token_ids) for o in outputs] == plain,
                           "deferred": counts.deferred, "paused": counts.paused, "catch_ups": counts.catch_ups,
                           "passes": counts.passes, "steps": counts.steps, "counters": vllm_counters(llm)}}
        llm.llm_engine.engine_core.shutdown()
        del llm
    for variant in ("deferred", "never written"):
        found[variant]["max_diff"] = float((kv[variant] - kv["every step"]).abs().max())
    found["scale"] = float(kv["every step"].abs().max())
    print("RESULT", json.dumps(found))
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_reference_models(tmp_path_factory.mktemp("deferred") / "reference")


@pytest.mark.parametrize("style", ["llama", "mla"])
def test_deferred_passes_write_the_keys_and_values_every_paused_pass_wrote(style: str, request):
    """2 code prompts x 64 tokens, the drafter paused for steps 10 to 39 - the shipped pair (``llama``: a Llama-style
    EAGLE-3 drafter) and the reference MLA target with the ``kimi_k2`` MLA drafter (``mla``; random weights): with
    the passes of the paused steps deferred, the drafter's whole KV cache after the run equals (to float32 rounding
    of a batched matmul) the one its pass in every paused step wrote, and the drafts after the pause are the same;
    where the deferred rows are never written it does not (the check can fail); fewer drafter passes run; greedy
    output equals no speculation's in every variant."""
    if style == "llama":
        target, drafter = PAIR / "target", PAIR / "drafter"
    else:
        models = request.getfixturevalue("reference")
        target, drafter = models / "target", models / "drafter-mla"
    script = ENGINE.format(target=target, drafter=drafter, tokens=64, probes="()", rejected=False)
    found = run_engine_script(textwrap.dedent(script))
    deferred, every, holes = found["deferred"], found["every step"], found["never written"]
    assert deferred["same"] and every["same"] and holes["same"], found
    assert every["deferred"] == 0 and every["catch_ups"] == 0, found
    # 30 paused steps; the first follows a verifying step and runs its pass, the others wait for the probe's
    assert deferred["deferred"] >= 25 and deferred["catch_ups"] >= 1, found
    assert deferred["passes"] <= every["passes"] - deferred["deferred"] + deferred["catch_ups"], found
    assert deferred["max_diff"] <= 1e-4 * found["scale"], found
    assert deferred["counters"] == every["counters"], "the same drafts after the pause"
    assert holes["max_diff"] > 1e-2 * found["scale"], found


TENSOR_PARALLEL = """
    import json, tempfile
    from pathlib import Path
    from engine_script import wrong_drafter
    from kimi.e2e.engine import SPEC_METRICS, spec_metrics, tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    from kimi_lab.bench.parallel import bound_threads
    from vllm import LLM, SamplingParams

    def counts(worker):
        import dataclasses
        import kimi.spec.depth
        return dataclasses.asdict(kimi.spec.depth.COUNTS)

    target = "{target}"
    bad = wrong_drafter(Path("{drafter}"), Path(tempfile.mkdtemp()) / "drafter")
    ids = tokenize(target, code_prompts(2))
    plain = vllm_greedy(target, ids, 48, None, **CPU_EAGER).tokens
    spec = {{"method": "eagle3", "model": str(bad), "num_speculative_tokens": 3,
             "enable_adaptive_verification": True}}
    with bound_threads(2):
        llm = LLM(model=target, speculative_config=spec, tensor_parallel_size=2, disable_log_stats=False,
                  **CPU_EAGER)
        outputs = llm.generate([{{"prompt_token_ids": p}} for p in ids],
                               SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        metrics = spec_metrics(llm.get_metrics())
        ranks = llm.collective_rpc(counts)
    print("RESULT", json.dumps({{"same": [list(o.outputs[0].token_ids) for o in outputs] == plain, "ranks": ranks,
                                 "counters": {{key: metrics[key] for key in SPEC_METRICS.values()}}}}))
"""


def test_tensor_parallel_ranks_pause_and_write_deferred_passes_in_step():
    """TP 2 (vLLM's multiprocessing executor, two CPU workers), the shipped pair with its drafter's lm_head rolled
    by half its vocabulary, 2 requests x 48 tokens, adaptive verification with its profiled costs: the draft depth
    pauses (fewer than a third of the steps draft), both ranks defer the same paused passes and write them at the
    same steps (the write's forward runs the drafter's collectives), and the output is the target's greedy tokens
    on one rank."""
    found = run_engine_script(textwrap.dedent(TENSOR_PARALLEL.format(target=PAIR / "target",
                                                                     drafter=PAIR / "drafter")))
    assert found["same"], found
    first, second = found["ranks"]
    assert first == second and first["deferred"] > 0 and first["catch_ups"] > 0, found
    counters = found["counters"]
    assert counters["num_accepted_tokens"] == 0 and counters["num_drafts"] < 2 * 47 / 3, counters


def test_the_steps_after_dropped_probes_defer_their_passes_too():
    """The shipped pair with its drafter's ``lm_head`` rolled (every draft rejected, so the draft back-off soon
    withholds every request's drafts), 2 code prompts x 64 tokens, a pause from step 10 to 39 in which steps 12, 20,
    28 and 36 draft (probes): the probes' drafts are scheduled and dropped unverified, and the steps that scheduled
    them defer their passes like every other paused step (before, a step that scheduled drafts ran its pass); the
    drafter's KV cache after the run equals the one its pass in every paused step wrote."""
    script = ENGINE.format(target=PAIR / "target", drafter=PAIR / "drafter", tokens=64, probes="(12, 20, 28, 36)",
                           rejected=True)
    found = run_engine_script(textwrap.dedent(script))
    deferred, every = found["deferred"], found["every step"]
    assert deferred["same"] and every["same"], found
    assert deferred["counters"]["num_accepted_tokens"] == 0, found
    assert deferred["deferred"] == deferred["paused"] == 26, found
    assert deferred["max_diff"] <= 1e-4 * found["scale"], found
    assert deferred["counters"] == every["counters"], "the same drafts after the pause"
