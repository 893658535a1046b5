"""The logic of the torture run (kimi_lab.bench.torture, kimi_lab.bench.robustness) without a server: the calls it
plans, where it places stops, how it compares outcomes and reads /metrics."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kimi.e2e.server import CHAT_TEMPLATE
from kimi_lab.bench import torture
from kimi_lab.bench.robustness import (
    MAX_MODEL_LEN,
    compare,
    compared,
    gauges,
    metrics_check,
    request_errors,
    server_args,
)
from kimi_lab.bench.torture import (
    CHAT_CODE_TOKENS,
    CHAT_TOKENS,
    PREFIX_TOKENS,
    TOOL,
    TOOL_RESULT,
    Call,
    Outcome,
    PromptPool,
    conversations,
    matches_schema,
    scenarios,
    send_all,
    stop_calls,
    valid_tool_call,
)


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
              "s/2": Outcome("ok", [_choice([1])]), "s/3": Outcome("ok", [_choice([1])]),
              "s/4": Outcome("ok", [_choice([6]), _choice([8])])}
    rechunked = {"s/4": Outcome("ok", [_choice([7]), _choice([9])])}
    facts = {"s": {"seconds": 1.0, "idle_after": True, "preemptions": 0, "prefix_cache_hits": 0}}
    row = compare(plan, spec, nospec, rechunked, facts)["s"]
    assert (row["identical"], row["total"], row["crashes"], row["hangs"]) == (1, 2, 1, 1)
    assert (row["seeded_identical"], row["seeded_total"]) == (1, 2)
    assert (row["seeded_nospec_identical"], row["seeded_nospec_total"]) == (1, 2)  # the same seed without speculation
    assert row["differs"] == [{"call": "s/1", "choice": 0, "against": "nospec", "first_difference": 2},
                              {"call": "s/4", "choice": 1, "against": "spec_rechunked", "first_difference": 0},
                              {"call": "s/4", "choice": 0, "against": "nospec", "first_difference": 0}]
    assert len(row["errors"]) == 2
    assert "control_total" not in row
    # the control: the no-speculation server's batched answers against its answers to each call alone
    alone = {"s/0": Outcome("ok", [_choice([1, 2, 3])]), "s/1": Outcome("ok", [_choice([1, 2, 9])]),
             "s/4": Outcome("ok", [_choice([6]), _choice([5])])}
    row = compare(plan, spec, nospec, rechunked, facts, alone)["s"]
    assert (row["control_identical"], row["control_total"]) == (1, 2)
    assert (row["seeded_control_identical"], row["seeded_control_total"]) == (1, 2)  # seeded: batched = alone
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
    # chat: our template (the models have none); forced tool calls need a parser, loaded only with auto tool choice
    assert args[args.index("--chat-template") + 1] == str(CHAT_TEMPLATE) and CHAT_TEMPLATE.is_file()
    assert "--enable-auto-tool-choice" in args and args[args.index("--tool-call-parser") + 1] == "pythonic"
    assert "--enable-prompt-tokens-details" in args


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
    both = compared(plan, "greedy", "seeded")  # what the control sends alone
    assert sum(map(len, both.values())) == sum(map(len, greedy.values())) + sum(map(len, seeded.values()))


def _chat_plan() -> dict[str, list[Call]]:
    return conversations(_pool(), lambda ids: " ".join(map(str, ids)))


def test_conversations_plan_chat_turns_and_tool_calls() -> None:
    plan = _chat_plan()
    calls = [c for scenario in plan.values() for c in scenario]
    names = {c.name for c in calls}
    assert len(names) == len(calls) and all(c.endpoint == "chat" and c.compare == "greedy" for c in calls)
    chat = plan["chat"]  # two conversations of three user turns, one streamed, each turn following the last
    assert [c.follows for c in chat] == [None, "chat/0", "chat/1", None, "chat/3", "chat/4"]
    assert [bool(c.params.get("stream")) for c in chat] == [False] * 3 + [True] * 3
    assert all(c.params["stream_options"] == {"include_usage": True} for c in chat if c.params.get("stream"))
    assert all(m["role"] == "user" for c in chat for m in c.params["messages"])
    assert all(c.params["max_tokens"] <= 48 and c.params["temperature"] == 0 for c in chat)
    # three turns of code, questions and answers fit the context (the template and questions in the margin)
    assert CHAT_CODE_TOKENS + 3 * CHAT_TOKENS + 64 <= MAX_MODEL_LEN and CHAT_CODE_TOKENS > 2 * 128
    tools = plan["tool_call"]
    forced = [c for c in tools if c.follows is None]
    assert [c.params["tool_choice"] for c in forced] == [
        {"type": "function", "function": {"name": "read"}}, "required", "required"]
    assert all(c.params["tools"] == [TOOL] for c in tools)
    assert all(c.params.get("parallel_tool_calls") is False for c in forced if c.params["tool_choice"] == "required")
    follow_ups = [c for c in tools if c.follows]
    assert [c.follows for c in follow_ups] == ["tool_call/0", "tool_call/2"]
    assert all(c.params["messages"] == [{"role": "tool", "content": TOOL_RESULT}] and "tool_choice" not in c.params
               for c in follow_ups)
    assert all(c.follows in names for c in calls if c.follows)


def test_a_conversation_carries_the_servers_own_replies(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _chat_plan()
    seen: dict[str, list[dict]] = {}

    def fake_send(openai_client, model, call):
        seen[call.name] = call.params["messages"]
        if call.name == "tool_call/2":
            return Outcome("http 400", error="no")
        if call.params.get("tool_choice"):
            return Outcome("ok", [{"text": "", "token_ids": [1], "finish_reason": "stop", "stop_reason": None,
                                   "tool_calls": [{"id": "id-" + call.name, "name": "read",
                                                   "arguments": '{"module":"json","line":1}'}]}])
        return Outcome("ok", [{"text": f"reply to {call.name}", "token_ids": [2], "finish_reason": "length",
                               "stop_reason": None, "tool_calls": []}])

    monkeypatch.setattr(torture, "send", fake_send)
    found = send_all(None, "m", plan["chat"] + plan["tool_call"])
    assert list(found) == [c.name for c in plan["chat"] + plan["tool_call"]]
    third = seen["chat/2"]  # user, assistant (the server's reply), user, assistant, user
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[1] == {"role": "assistant", "content": "reply to chat/0"}
    assert third[3] == {"role": "assistant", "content": "reply to chat/1"}
    assert third[:3] == seen["chat/1"]
    follow = seen["tool_call/3"]
    assert [m["role"] for m in follow] == ["user", "assistant", "tool"]
    assert follow[1]["tool_calls"] == [{"id": "id-tool_call/0", "type": "function",
                                        "function": {"name": "read", "arguments": '{"module":"json","line":1}'}}]
    assert follow[1]["content"] is None and follow[2]["tool_call_id"] == "id-tool_call/0"
    # a turn after a failed one is not sent
    assert "tool_call/4" not in seen and found["tool_call/4"].status == "skipped"
    assert "tool_call/2" in found["tool_call/4"].error
    one_by_one = send_all(None, "m", plan["chat"], concurrent=False)
    assert all(o.status == "ok" for o in one_by_one.values())


def _chunk(index: int = 0, content: str | None = None, token_ids: list[int] | None = None,
           finish: str | None = None, tool_calls: list | None = None, usage=None):
    delta = SimpleNamespace(content=content, tool_calls=tool_calls)
    choice = SimpleNamespace(index=index, delta=delta, finish_reason=finish,
                             model_extra={"token_ids": token_ids or []})
    return SimpleNamespace(choices=[choice] if usage is None else [], usage=usage)


def _piece(arguments: str, name: str | None = None, call_id: str | None = None):
    return SimpleNamespace(index=0, id=call_id, function=SimpleNamespace(name=name, arguments=arguments))


def test_a_streamed_chat_joins_content_tool_calls_steps_and_usage() -> None:
    usage = SimpleNamespace(prompt_tokens=140, prompt_tokens_details=SimpleNamespace(cached_tokens=128))
    stream = [_chunk(content=""), _chunk(token_ids=[5], tool_calls=[_piece("{", "read", "c1")]),
              _chunk(token_ids=[6, 7], tool_calls=[_piece('"line":')]), _chunk(token_ids=[8], content="x"),
              _chunk(token_ids=[9], tool_calls=[_piece("3}")], finish="tool_calls"), _chunk(usage=usage)]
    choices, status, got = torture._streamed(iter(stream), None, chat=True)
    assert status == "ok" and got is usage and torture._usage(got) == {"prompt_tokens": 140, "cached_tokens": 128}
    (choice,) = choices
    assert choice["token_ids"] == [5, 6, 7, 8, 9] and choice["steps"] == [1, 2, 1, 1] and choice["text"] == "x"
    assert choice["tool_calls"] == [{"id": "c1", "name": "read", "arguments": '{"line":3}'}]
    assert choice["finish_reason"] == "tool_calls"


def test_tool_call_arguments_must_parse_and_match_the_schema() -> None:
    def reply(arguments: str, name: str = "read") -> dict:
        return {"tool_calls": [{"id": "x", "name": name, "arguments": arguments}]}

    assert valid_tool_call(reply('{"module":"json","line":12}'))
    assert valid_tool_call(reply('{"module": "http", "line": 999}'))
    for bad in ('{"module":"json","line":0}', '{"module":"os","line":1}', '{"module":"json"}',
                '{"module":"json","line":1,"x":1}', '{"module":"json","line":true}', '{"module":"json","line":',
                '[{"module":"json","line":1}]'):
        assert not valid_tool_call(reply(bad)), bad
    assert not valid_tool_call(reply('{"module":"json","line":1}', "write"))
    assert not valid_tool_call({"tool_calls": []}) and not valid_tool_call({"text": "{}"})
    assert matches_schema({"a": True, "b": "s"}, {"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "string"}}})
    assert not matches_schema({"a": 1}, {"type": "object", "properties": {"a": {"type": "boolean"}}})


def test_evidence_of_chat_turns_and_tool_calls_and_unfinished_choices() -> None:
    plan = _chat_plan()
    call = {"text": "", "token_ids": [1], "finish_reason": "stop", "stop_reason": None,
            "tool_calls": [{"id": "i", "name": "read", "arguments": '{"module":"json","line":3}'}]}
    spec = {c.name: Outcome("ok", [{**_choice([1]), "steps": [1, 2]}],
                            usage={"prompt_tokens": 300, "cached_tokens": 128 if c.follows else 0})
            for c in plan["chat"]}
    spec.update({c.name: Outcome("ok", [call if c.follows is None else {**_choice([2]), "text": "ok"}])
                 for c in plan["tool_call"]})
    spec["tool_call/1"] = Outcome("ok", [{**call, "tool_calls": [{**call["tool_calls"][0], "arguments": "{"}]}])
    facts = dict.fromkeys(plan, {"seconds": 1.0, "idle_after": True, "preemptions": 0, "prefix_cache_hits": 512})
    rows = compare(plan, spec, spec, {}, facts)
    chat = rows["chat"]
    assert (chat["identical"], chat["total"], chat["errors"]) == (6, 6, [])
    assert (chat["later_turns_from_prefix_cache"], chat["later_turns"], chat["prefix_cache_hits"]) == (4, 4, 512)
    assert chat["multi_token_steps"] == 6
    tools = rows["tool_call"]
    assert (tools["forced_calls"], tools["valid_tool_calls"]) == (3, 2)
    assert (tools["follow_ups_answered"], tools["follow_ups"]) == (2, 2)
    spec["chat/0"] = Outcome("ok", [{**_choice([1]), "finish_reason": None}])
    assert compare(plan, spec, spec, {}, facts)["chat"]["errors"] == ["chat/0: a choice without finish reason"]


def test_the_chat_template_renders_turns_tool_calls_and_results() -> None:
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string(CHAT_TEMPLATE.read_text())
    messages = [{"role": "user", "content": "Read line 3."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "random", "type": "function", "function": {"name": "read",
                                                                      "arguments": {"module": "json", "line": 3}}}]},
                {"role": "tool", "content": TOOL_RESULT, "tool_call_id": "random"},
                {"role": "assistant", "content": "done"}, {"role": "user", "content": "Again."}]
    text = template.render(messages=messages, tools=[TOOL], add_generation_prompt=True)
    assert text.startswith("tools:\n" + json.dumps(TOOL["function"]) + "\n\nuser:\nRead line 3.\n\nassistant:\n")
    assert '{"name": "read", "arguments": {"module": "json", "line": 3}}\n\ntool:\n' + TOOL_RESULT in text
    assert text.endswith("assistant:\ndone\n\nuser:\nAgain.\n\nassistant:\n") and "random" not in text
    assert template.render(messages=messages[:1], add_generation_prompt=False) == "user:\nRead line 3.\n\n"
