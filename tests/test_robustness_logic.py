"""The logic of the torture run (kimi.bench.torture, kimi.bench.robustness) without a server: the calls it plans,
where it places stops, how it compares outcomes and reads /metrics."""

from __future__ import annotations

import json

import pytest

from kimi.bench.robustness import MAX_MODEL_LEN, compare, compared, gauges, metrics_check, request_errors, server_args
from kimi.bench.torture import PREFIX_TOKENS, Call, Outcome, PromptPool, scenarios, stop_calls


def _pool() -> PromptPool:
    return PromptPool(list(range(1000, 3000)))


def test_scenarios_plan_unique_bounded_calls() -> None:
    plan = scenarios(_pool(), MAX_MODEL_LEN)
    names = [call.name for calls in plan.values() for call in calls]
    assert len(names) == len(set(names))
    assert {"preemption", "abort", "prefix_cache", "chunked_prefill", "near_max_len", "structured_json",
            "structured_regex", "mixed_sampling", "n_greater_than_1", "logprobs", "streaming"} <= set(plan)
    for call in plan["near_max_len"]:  # ends exactly at the context
        assert len(call.params["prompt"]) + call.params["max_tokens"] == MAX_MODEL_LEN
    for call in plan["abort"]:
        assert (call.abort_after is not None) == bool(call.params.get("stream"))
    assert all(len(c.params["prompt"]) > 64 for c in plan["chunked_prefill"])  # longer than the step budget
    prefixes = {tuple(c.params["prompt"][:PREFIX_TOKENS]) for c in plan["prefix_cache"]}
    assert len(prefixes) == 1
    assert all(len(c.params["prompt"]) + c.params["max_tokens"] <= MAX_MODEL_LEN for calls in plan.values()
               for c in calls)
    seeded = [c for c in plan["mixed_sampling"] if c.compare == "seeded"]
    assert seeded and all("seed" in c.params and c.params["temperature"] > 0 for c in seeded)


def test_prompt_pool_cuts_distinct_prompts_and_refuses_too_long() -> None:
    pool = _pool()
    assert len(pool.ids(100, 3)) == 100 and pool.ids(100, 3) != pool.ids(100, 4)
    with pytest.raises(ValueError, match="a prompt of 5000 tokens"):
        pool.ids(5000, 0)


def _decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


def test_stops_land_inside_the_first_multi_token_step() -> None:
    ids = [0, 1, 2, 3, 4, 5, 6]  # steps of 1, 3, 1, 2 tokens: the first multi-token step holds ids 1-3
    probe = Call("probe/0", "probe", {"prompt": [9, 9], "stream": True})
    done = Outcome("ok", [{"text": _decode(ids), "token_ids": ids, "steps": [1, 3, 1, 2]}])
    calls, inside = stop_calls([probe], {"probe/0": done}, _decode)
    assert [c.params["max_tokens"] for c in calls] == [2, 7]  # one token into the step; the whole length
    assert calls[1].params["stop"] == ["cd"]  # the step's later tokens
    assert inside == 2


def test_a_stop_that_occurs_earlier_is_not_counted_inside() -> None:
    ids = [2, 3, 0, 2, 3]  # "cdacd": the step (ids 0, 2, 3) ends in "cd", which already opens the text
    probe = Call("probe/0", "probe", {"prompt": [9], "stream": True})
    done = Outcome("ok", [{"text": _decode(ids), "token_ids": ids, "steps": [2, 3]}])
    calls, inside = stop_calls([probe], {"probe/0": done}, _decode)
    assert calls[1].params["stop"] == ["cd"] and inside == 1
    assert stop_calls([probe], {"probe/0": Outcome("crash")}, _decode) == ([], 0)


def _choice(tokens: list[int], finish: str = "length") -> dict:
    return {"text": "", "token_ids": tokens, "finish_reason": finish, "stop_reason": None}


def test_compare_counts_identical_differing_crashed_and_hung_calls() -> None:
    plan = {"s": [Call("s/0", "s", {}), Call("s/1", "s", {}), Call("s/2", "s", {}), Call("s/3", "s", {}),
                  Call("s/4", "s", {}, "seeded"), Call("s/5", "s", {}, "none")]}
    spec = {"s/0": Outcome("ok", [_choice([1, 2, 3])]), "s/1": Outcome("ok", [_choice([1, 2, 4])]),
            "s/2": Outcome("crash", error="refused"), "s/3": Outcome("hang"),
            "s/4": Outcome("ok", [_choice([7]), _choice([8])]), "s/5": Outcome("ok", [_choice([5])])}
    nospec = {"s/0": Outcome("ok", [_choice([1, 2, 3])]), "s/1": Outcome("ok", [_choice([1, 2, 3])]),
              "s/2": Outcome("ok", [_choice([1])]), "s/3": Outcome("ok", [_choice([1])])}
    rechunked = {"s/4": Outcome("ok", [_choice([7]), _choice([9])])}
    facts = {"s": {"seconds": 1.0, "idle_after": True, "preemptions": 0, "prefix_cache_hits": 0}}
    row = compare(plan, spec, nospec, rechunked, facts)["s"]
    assert (row["identical"], row["total"], row["crashes"], row["hangs"]) == (1, 2, 1, 1)
    assert (row["seeded_identical"], row["seeded_total"]) == (1, 2)
    assert row["differs"] == [{"call": "s/1", "choice": 0, "against": "nospec", "first_difference": 2},
                              {"call": "s/4", "choice": 1, "against": "spec_rechunked", "first_difference": 0}]
    assert len(row["errors"]) == 2
    assert "control_total" not in row
    # the control: the no-speculation server's batched answers against its answers to each call alone
    alone = {"s/0": Outcome("ok", [_choice([1, 2, 3])]), "s/1": Outcome("ok", [_choice([1, 2, 9])])}
    row = compare(plan, spec, nospec, rechunked, facts, alone)["s"]
    assert (row["control_identical"], row["control_total"]) == (1, 2)
    assert (row["identical"], row["total"]) == (1, 2)


def test_evidence_of_preemption_structured_output_and_aborts() -> None:
    plan = {"preemption": [Call("preemption/0", "preemption", {})],
            "structured_regex": [Call("structured_regex/0", "structured_regex", {}),
                                 Call("structured_regex/1", "structured_regex", {})],
            "abort": [Call("abort/0", "abort", {}, "none", 2)]}
    spec = {"preemption/0": Outcome("ok", [_choice([1])]),
            "structured_regex/0": Outcome("ok", [{**_choice([1], "stop"), "text": "def f(x):"}]),
            "structured_regex/1": Outcome("ok", [{**_choice([1], "length"), "text": "def f("}]),
            "abort/0": Outcome("aborted", [_choice([1])])}
    facts = dict.fromkeys(plan, {"seconds": 1.0, "idle_after": True, "preemptions": 3, "prefix_cache_hits": 0})
    rows = compare(plan, spec, spec, {}, facts)
    assert rows["preemption"]["preemptions"] == 3
    assert rows["structured_regex"]["valid"] == 1 and rows["structured_regex"]["finished_by_grammar"] == 1
    assert rows["abort"]["aborted"] == 1 and rows["abort"]["errors"] == []


def test_metrics() -> None:
    text = ('vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_running{engine="1"} 1.0\n'
            "vllm:num_preemptions_total 4\n# HELP x\n")
    found = gauges(text)
    assert found["vllm:num_requests_running"] == 3.0 and found["vllm:num_preemptions_total"] == 4.0
    good = metrics_check({"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 12.0})
    assert good["tau"] == 2.2 and good["consistent"]
    assert not metrics_check({"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 31.0})["consistent"]
    assert metrics_check({"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0})["tau"] is None


def test_server_args() -> None:
    args = server_args({"method": "eagle3", "model": "d", "num_speculative_tokens": 3}, 1 << 20, 96)
    assert args[args.index("--max-num-batched-tokens") + 1] == "96"
    assert "--speculative-config" in args and "--enforce-eager" in args
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(1 << 20)
    assert json.loads(args[args.index("--structured-outputs-config") + 1])["disable_any_whitespace"] is True
    assert "--speculative-config" not in server_args(None, 1 << 20)
    on_gpu = server_args(None, 1 << 20, gpu=True)
    assert "--enforce-eager" not in on_gpu and on_gpu[on_gpu.index("--dtype") + 1] == "bfloat16"



def test_bench_serve_errors_are_counted_by_their_last_line() -> None:
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\naiohttp.ServerDisconnectedError: gone\n"
    found = request_errors(["", traceback, "", traceback, "Bad Request", " "])
    assert found == {"aiohttp.ServerDisconnectedError: gone": 2, "Bad Request": 1, "' '": 1}
    assert request_errors(["", ""]) == {}


def test_compared_keeps_the_calls_of_one_kind_by_scenario() -> None:
    plan = scenarios(_pool(), MAX_MODEL_LEN)
    seeded = compared(plan, "seeded")
    assert set(seeded) == {"mixed_sampling", "lone_top_k", "n_greater_than_1"}
    assert all(c.compare == "seeded" for calls in seeded.values() for c in calls)
    greedy = compared(plan, "greedy")
    assert all(c.abort_after is None for calls in greedy.values() for c in calls)  # aborted calls compare nothing
    assert sum(map(len, greedy.values())) == sum(c.compare == "greedy" for calls in plan.values() for c in calls)
