"""The requests of the torture run: each scenario as calls of the official ``openai`` client against a
``vllm serve``, and what came back, so that the same calls on a server without speculation can be compared.

A :class:`Call` is one ``client.completions.create(...)`` or ``client.chat.completions.create(...)``; :func:`send`
runs it with a time bound and records the outcome without raising (an HTTP error is a status, a timeout is a hang,
a refused connection a crash). :func:`scenarios` builds the calls from a :class:`PromptPool`; :func:`stop_calls`
places stop strings and ``max_tokens`` inside the multi-token chunks seen in streamed probes (accepted drafts: a
chunk carries one engine step's tokens, or several steps the server coalesced when the client read late);
:func:`conversations` builds the chat scenarios, whose later turns carry the server's own earlier replies
(:func:`send_all` sends them turn by turn). Needs ``openai`` (a vLLM dependency) when a call is sent.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

#: Seconds a single request may take before it counts as a hang.
REQUEST_BOUND_S = 180.0

#: JSON schema of the structured-output scenario: small, so a tiny model fills it within the token budget, and
#: without free strings (with a string field the random MLA-style target wrote a raw U+0008 into it, which the
#: grammar let through and strict JSON refuses, with and without speculation alike).
JSON_SCHEMA = {"type": "object", "properties": {"lang": {"enum": ["python", "c", "go"]},
                                                 "size": {"type": "integer", "minimum": 0, "maximum": 999},
                                                 "ok": {"type": "boolean"}},
               "required": ["lang", "size", "ok"], "additionalProperties": False}
#: Tokens shared by the ``prefix_cache`` prompts: three of the CPU backend's 128-token blocks, as a hit with EAGLE
#: drops the last matched block (two blocks of 128 would leave one).
PREFIX_TOKENS = 384
#: Regex of the structured-output scenario (a Python ``def`` header).
DEF_REGEX = r"def [a-z_]{1,12}\((self|x|a, b)?\):"
#: The function of the ``tool_call`` scenario, as a client sends it in ``tools``: short and without free strings (see
#: :data:`JSON_SCHEMA`), so that a forced call ends well within :data:`TOOL_CALL_TOKENS` even when a model spells it
#: in one- and two-character tokens, as both targets do under the grammar (``tool_choice="required"`` wraps it in
#: ``[{"name": ..., "parameters": ...}]``: 34-43 tokens for the llama pair; with a third parameter and a longer name
#: the random MLA-style target took 57).
TOOL = {"type": "function", "function": {
    "name": "read", "description": "Read one line of a module of the Python standard library.",
    "parameters": {"type": "object", "properties": {"module": {"enum": ["json", "email", "http"]},
                                                    "line": {"type": "integer", "minimum": 1, "maximum": 999}},
                   "required": ["module", "line"], "additionalProperties": False}}}
#: Tokens per chat turn (greedy, EOS ignored except where a grammar ends the answer).
CHAT_TOKENS = 32
#: Most tokens of a forced tool call; the grammar ends it before (16-43 tokens), so the bound costs nothing and a call
#: cut by it (invalid JSON) would be a failure of the run, not a finding.
TOOL_CALL_TOKENS = 64
#: Tokens of held-out code in a conversation's first turn: more than two of the CPU backend's 128-token blocks, so
#: that a later turn hits the prefix cache with EAGLE (which drops the last matched block); three turns of
#: :data:`CHAT_TOKENS` stay within the servers' 512-token context.
CHAT_CODE_TOKENS = 272


#: The tool's answer a client sends back in the ``tool_call`` scenario's follow-up turns (a ``tool`` message).
TOOL_RESULT = json.dumps({"text": "    return _default_decoder.decode(s)"})


def matches_schema(value, schema: dict) -> bool:
    """Whether ``value`` (parsed JSON) satisfies ``schema``, for the JSON Schema this module's schemas use:
    ``type`` object (``properties``, ``required``, ``additionalProperties: false``), integer (``minimum``,
    ``maximum``), boolean, string, and ``enum``."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", [])) <= set(value)
                and (schema.get("additionalProperties", True) is not False or set(value) <= set(properties))
                and all(matches_schema(item, properties[key]) for key, item in value.items() if key in properties))
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return True


def valid_tool_call(choice: dict, tool: dict = TOOL) -> bool:
    """A reply is one call of ``tool`` whose ``arguments`` parse as JSON and match the tool's parameter schema."""
    calls = choice.get("tool_calls") or []
    if len(calls) != 1 or calls[0]["name"] != tool["function"]["name"]:
        return False
    try:
        arguments = json.loads(calls[0]["arguments"])
    except (TypeError, ValueError):
        return False
    return matches_schema(arguments, tool["function"]["parameters"])


@dataclass
class Call:
    """One completion request.

    Attributes:
        name: unique within the run (``scenario/i``).
        scenario: the scenario it belongs to.
        params: keyword arguments of ``client.completions.create`` (``extra_body`` for vLLM's own fields).
        compare: ``"greedy"`` (tokens must equal the server without speculation), ``"seeded"`` (must equal the
            same call on a server with another chunking) or ``"none"`` (must only finish).
        abort_after: close the stream after this many chunks (a client that disconnects); ``params`` must stream.
        endpoint: ``"completions"`` or ``"chat"`` (``client.chat.completions.create``).
        follows: for a chat call, the name of the call whose conversation it continues: its ``messages`` are then
            that call's messages, the server's reply to it as an ``assistant`` turn, and this call's own ``messages``
            (a ``tool`` message without ``tool_call_id`` gets the id of the reply's first tool call).
    """

    name: str
    scenario: str
    params: dict
    compare: str = "greedy"
    abort_after: int | None = None
    endpoint: str = "completions"
    follows: str | None = None


@dataclass
class Outcome:
    """What one :class:`Call` got.

    Attributes:
        status: ``"ok"``, ``"aborted"`` (closed by us as planned), ``"http <code>"`` (an error answer),
            ``"hang"`` (no answer within the bound), ``"crash"`` (connection refused or reset: the server died) or
            ``"skipped"`` (a chat turn whose earlier turn failed).
        choices: per choice ``{"text", "token_ids", "finish_reason", "stop_reason"}`` (plus ``"logprobs"``: the
            chosen tokens' logprobs, when asked; plus ``"steps"``: tokens per streamed chunk, when streamed; plus,
            for a chat call, ``"tool_calls"``: ``[{"id", "name", "arguments"}]``, and ``"text"`` is the content).
        seconds: wall time of the call.
        error: the error's text, for an error status.
        usage: for a chat call, ``{"prompt_tokens", "cached_tokens"}`` (``cached_tokens``: prompt tokens served
            from the prefix cache; None unless the server runs with ``--enable-prompt-tokens-details``).
    """

    status: str
    choices: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    usage: dict | None = None

    def as_dict(self) -> dict:
        return {"status": self.status, "choices": self.choices, "seconds": self.seconds, "error": self.error,
                **({"usage": self.usage} if self.usage is not None else {})}


def client(base_url: str, bound: float = REQUEST_BOUND_S):
    """An ``openai.OpenAI`` client for ``vllm serve`` at ``base_url`` (``http://host:port``): no retries, so a
    failure is seen as it happened, and ``bound`` seconds per request."""
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=bound, max_retries=0)


def send(openai_client, model: str, call: Call) -> Outcome:
    """Run ``call`` against ``model``; never raises for what the server does (see :class:`Outcome`)."""
    import openai

    chat = call.endpoint == "chat"
    create = openai_client.chat.completions.create if chat else openai_client.completions.create
    began = time.monotonic()
    try:
        if call.params.get("stream"):
            choices, status, usage = _streamed(create(model=model, **call.params), call.abort_after, chat)
        else:
            answer = create(model=model, **call.params)
            read = _chat_choice if chat else _choice
            choices, status = [read(c) for c in sorted(answer.choices, key=lambda c: c.index)], "ok"
            usage = answer.usage
        return Outcome(status, choices, round(time.monotonic() - began, 2),
                       usage=_usage(usage) if chat else None)
    except openai.APITimeoutError as exc:
        return Outcome("hang", seconds=round(time.monotonic() - began, 2), error=str(exc))
    except openai.APIStatusError as exc:
        return Outcome(f"http {exc.status_code}", seconds=round(time.monotonic() - began, 2), error=_message(exc))
    except openai.APIConnectionError as exc:
        return Outcome("crash", seconds=round(time.monotonic() - began, 2), error=repr(exc.__cause__ or exc))


def _message(exc) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    return str(body.get("message") or (body.get("error") or {}).get("message") or exc)[:300]


def _choice(choice) -> dict:
    extra = choice.model_extra or {}
    found = {"text": choice.text, "token_ids": list(extra.get("token_ids") or []),
             "finish_reason": choice.finish_reason, "stop_reason": extra.get("stop_reason")}
    if choice.logprobs is not None:
        found["logprobs"] = [round(float(lp), 6) for lp in choice.logprobs.token_logprobs or []]
    return found


def _chat_choice(choice) -> dict:
    """A chat completion's choice as :func:`_choice` reads a completion's: the content as ``text``, and its tool
    calls."""
    extra = choice.model_extra or {}
    message = choice.message
    return {"text": message.content or "", "token_ids": list(extra.get("token_ids") or []),
            "finish_reason": choice.finish_reason, "stop_reason": extra.get("stop_reason"),
            "tool_calls": [{"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
                           for call in message.tool_calls or []]}


def _chat_delta(choice) -> dict:
    """One streamed chat chunk's choice: content, token ids, finish and stop reason, tool-call pieces by index."""
    extra = choice.model_extra or {}
    delta = choice.delta
    return {"text": (delta.content or "") if delta else "", "token_ids": list(extra.get("token_ids") or []),
            "finish_reason": choice.finish_reason, "stop_reason": extra.get("stop_reason"),
            "tool_calls": [{"index": call.index, "id": call.id,
                            "name": call.function.name if call.function else None,
                            "arguments": (call.function.arguments if call.function else None) or ""}
                           for call in (delta.tool_calls if delta else None) or []]}


def _usage(usage) -> dict | None:
    """``{"prompt_tokens", "cached_tokens"}`` of a chat answer's usage (None without usage)."""
    if usage is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    return {"prompt_tokens": usage.prompt_tokens, "cached_tokens": getattr(details, "cached_tokens", None)}


def _streamed(stream, abort_after: int | None, chat: bool = False) -> tuple[list[dict], str, object]:
    """Join a completion (or ``chat``) stream per choice index; ``steps`` holds the tokens of each chunk (one engine
    step), a chat stream's tool-call pieces are joined per call index. Returns ``(choices, status, usage)``, the
    usage of the chunk that carries it (a chat stream asked for it with ``stream_options``)."""
    joined: dict[int, dict] = {}
    usage = None
    for chunks, chunk in enumerate(stream, 1):
        usage = getattr(chunk, "usage", None) or usage
        for choice in chunk.choices:
            part = _chat_delta(choice) if chat else _choice(choice)
            into = joined.setdefault(choice.index, {"text": "", "token_ids": [], "finish_reason": None,
                                                    "stop_reason": None, "steps": [],
                                                    **({"tool_calls": []} if chat else {})})
            into["text"] += part["text"]
            into["token_ids"] += part["token_ids"]
            if part["token_ids"]:
                into["steps"].append(len(part["token_ids"]))
            into["finish_reason"] = part["finish_reason"] or into["finish_reason"]
            into["stop_reason"] = part["stop_reason"] if part["stop_reason"] is not None else into["stop_reason"]
            for piece in part.get("tool_calls", []):
                calls = into["tool_calls"]
                while len(calls) <= piece["index"]:
                    calls.append({"id": None, "name": None, "arguments": ""})
                call = calls[piece["index"]]
                call["id"] = call["id"] or piece["id"]
                call["name"] = call["name"] or piece["name"]
                call["arguments"] += piece["arguments"]
        if abort_after is not None and chunks >= abort_after:
            stream.close()
            return [joined[i] for i in sorted(joined)], "aborted", usage
    return [joined[i] for i in sorted(joined)], "ok", usage


def send_all(openai_client, model: str, calls: list[Call], concurrent: bool = True) -> dict[str, Outcome]:
    """``{call.name: Outcome}``; all calls at once (one thread each) when ``concurrent``, else one by one. Calls that
    continue a conversation (``Call.follows``) go after the turn they follow, with its reply in their messages: each
    conversation turn by turn, the conversations at once when ``concurrent``."""
    if any(call.follows for call in calls):
        return _converse(openai_client, model, calls, concurrent)
    if not concurrent:
        return {call.name: send(openai_client, model, call) for call in calls}
    with ThreadPoolExecutor(max(1, len(calls))) as pool:
        return dict(zip([c.name for c in calls], pool.map(lambda c: send(openai_client, model, c), calls),
                        strict=True))


def assistant_turn(choice: dict) -> dict:
    """The ``assistant`` message a client sends back for a reply (a choice as :class:`Outcome` holds it)."""
    if choice.get("tool_calls"):
        return {"role": "assistant", "content": choice["text"] or None,
                "tool_calls": [{"id": call["id"], "type": "function",
                                "function": {"name": call["name"], "arguments": call["arguments"]}}
                               for call in choice["tool_calls"]]}
    return {"role": "assistant", "content": choice["text"]}


def _converse(openai_client, model: str, calls: list[Call], concurrent: bool) -> dict[str, Outcome]:
    """:func:`send_all` for calls with conversations: chains of turns (a call and those that follow it), each chain
    in order, the chains at once when ``concurrent``. A turn whose earlier turn got no answer is ``"skipped"``."""
    chains: dict[str, list[Call]] = {}
    root: dict[str, str] = {}
    for call in calls:
        root[call.name] = root.get(call.follows, call.name) if call.follows else call.name
        chains.setdefault(root[call.name], []).append(call)
    outcomes: dict[str, Outcome] = {}
    sent: dict[str, list[dict]] = {}

    def run(chain: list[Call]) -> None:
        for call in chain:
            if call.follows is None:
                sent[call.name] = list(call.params.get("messages", []))
                outcomes[call.name] = send(openai_client, model, call)
                continue
            before = outcomes.get(call.follows)
            if before is None or before.status != "ok" or not before.choices:
                outcomes[call.name] = Outcome("skipped", error=f"follows {call.follows}, which got "
                                                               f"{before.status if before else 'no call'}")
                continue
            reply = assistant_turn(before.choices[0])
            ids = [tool_call["id"] for tool_call in reply.get("tool_calls", [])]
            own = [{**m, "tool_call_id": ids[0] if ids else "none"} if m.get("role") == "tool"
                   and "tool_call_id" not in m else m for m in call.params["messages"]]
            sent[call.name] = [*sent[call.follows], reply, *own]
            outcomes[call.name] = send(openai_client, model,
                                       replace(call, params={**call.params, "messages": sent[call.name]}))

    if concurrent:
        with ThreadPoolExecutor(max(1, len(chains))) as pool:
            list(pool.map(run, chains.values()))
    else:
        for chain in chains.values():
            run(chain)
    return {call.name: outcomes[call.name] for call in calls}


class PromptPool:
    """Token-id prompts of any length, cut from one stream of held-out code tokens (distinct for distinct ``i``).

    Args:
        stream: token ids (the held-out code of :func:`kimi.models.prompts.code_prompt_ids`, joined).
    """

    def __init__(self, stream: list[int]) -> None:
        self.stream = stream

    def ids(self, length: int, i: int) -> list[int]:
        """``length`` tokens starting ``97 i`` tokens into the stream (wrapping around).

        Raises:
            ValueError: the stream is shorter than ``length``.
        """
        if length > len(self.stream):
            raise ValueError(f"a prompt of {length} tokens from a stream of {len(self.stream)}")
        start = (97 * i) % (len(self.stream) - length + 1)
        return self.stream[start:start + length]


def greedy_params(max_tokens: int, **extra) -> dict:
    """Parameters of a greedy request of exactly ``max_tokens`` tokens (EOS ignored), token ids returned; ``extra``
    joins vLLM's own fields (``extra_body``). A caller that samples overrides ``temperature`` after it."""
    return {"max_tokens": max_tokens, "temperature": 0.0,
            "extra_body": {"ignore_eos": True, "return_token_ids": True, **extra}}


def scenarios(pool: PromptPool, max_model_len: int) -> dict[str, list[Call]]:
    """The scenarios whose calls do not depend on the server's answers, ``{scenario: calls}``.

    ``preemption`` overfills a small KV cache (the server's ``--kv-cache-memory-bytes`` must make it small);
    ``chunked_prefill`` uses prompts of 300-440 tokens (longer than a small ``--max-num-batched-tokens``);
    ``near_max_len`` ends requests exactly at ``max_model_len``.
    """
    out: dict[str, list[Call]] = {}

    def add(scenario: str, params: dict, compare: str = "greedy", abort_after: int | None = None) -> None:
        calls = out.setdefault(scenario, [])
        calls.append(Call(f"{scenario}/{len(calls)}", scenario, params, compare, abort_after))

    for i in range(12):
        add("preemption", {"prompt": pool.ids(120 + 8 * i, i), **greedy_params(96)})
    for i in range(6):
        add("abort", {"prompt": pool.ids(64, 40 + i), "stream": True, **greedy_params(200)}, "none", abort_after=2 + i)
    for i in range(3):
        add("abort", {"prompt": pool.ids(48, 50 + i), **greedy_params(48)})
    prefix = pool.ids(PREFIX_TOKENS, 60)
    for i in range(6):
        add("prefix_cache", {"prompt": prefix + pool.ids(8 + 4 * i, 61 + i), **greedy_params(32)})
    for i in range(4):
        add("chunked_prefill", {"prompt": pool.ids(300 + 40 * i, 70 + i), **greedy_params(32)})
    for i, tokens in enumerate((32, 8, 1)):
        add("near_max_len", {"prompt": pool.ids(max_model_len - tokens, 80 + i), **greedy_params(tokens)})
    for i in range(3):
        add("structured_json", {"prompt": pool.ids(40, 90 + i), "max_tokens": 64, "temperature": 0.0,
                                "extra_body": {"return_token_ids": True, "structured_outputs": {"json": JSON_SCHEMA}}})
        add("structured_regex", {"prompt": pool.ids(40, 95 + i), "max_tokens": 24, "temperature": 0.0,
                                 "extra_body": {"return_token_ids": True, "structured_outputs": {"regex": DEF_REGEX}}})
    mixed = [({}, {}, "greedy"), ({}, {}, "greedy"), ({"temperature": 0.8, "seed": 11}, {}, "seeded"),
             ({"temperature": 1.0, "top_p": 0.9, "seed": 12}, {}, "seeded"),
             ({"temperature": 1.0, "seed": 13}, {"top_k": 20}, "seeded"),
             ({"temperature": 0.7, "top_p": 0.95, "seed": 14}, {"top_k": 50}, "seeded"),
             ({"temperature": 1.0}, {}, "none")]
    for i, (sampling, extra, compare) in enumerate(mixed):
        add("mixed_sampling", {"prompt": pool.ids(56 + 8 * i, 100 + i), **greedy_params(48, **extra), **sampling},
            compare)
    for i, top_k in enumerate((20, 5)):  # alone (sent one by one): steps without any draft token
        add("lone_top_k", {"prompt": pool.ids(96, 105 + i), **greedy_params(48, top_k=top_k), "temperature": 1.0,
                           "seed": 21 + i}, "seeded")
    # vLLM refuses n > 1 with greedy sampling (bad_requests in kimi_lab.bench.robustness has it): sampled here
    add("n_greater_than_1", {"prompt": pool.ids(64, 110), "n": 2, "seed": 5, **greedy_params(32), "temperature": 0.8},
        "seeded")
    add("n_greater_than_1", {"prompt": pool.ids(64, 111), "n": 3, "seed": 6, "top_p": 0.9, **greedy_params(32),
                             "temperature": 1.0}, "seeded")
    for i in range(4):
        add("logprobs", {"prompt": pool.ids(72, 120 + i), "logprobs": 3, **greedy_params(32)})
    for i in range(4):
        add("streaming", {"prompt": pool.ids(80, 130 + i), "stream": True, **greedy_params(48)})
    return out


def conversations(pool: PromptPool, decode) -> dict[str, list[Call]]:
    """The chat scenarios, ``{scenario: calls}``, as a client of ``/v1/chat/completions`` sends them; ``decode`` maps
    token ids to text (the target's tokenizer).

    ``chat``: two conversations of three user turns (one answered whole, one streamed), each opening with
    :data:`CHAT_CODE_TOKENS` tokens of held-out code, later turns carrying the server's own earlier replies
    (``Call.follows``), greedy, :data:`CHAT_TOKENS` each. ``tool_call``: :data:`TOOL` forced by name, and by
    ``tool_choice="required"`` (one call: ``parallel_tool_calls=False``) answered whole and streamed, up to
    :data:`TOOL_CALL_TOKENS` (the grammar ends the call); then two follow-ups (one streamed) that send the call and the
    tool's result (:data:`TOOL_RESULT`) back with the same ``tools`` (``tool_choice`` left to its default, ``auto``)
    and get a greedy answer.
    """
    out: dict[str, list[Call]] = {"chat": [], "tool_call": []}

    def add(scenario: str, params: dict, follows: str | None = None) -> str:
        calls = out[scenario]
        if params.get("stream"):
            params = {**params, "stream_options": {"include_usage": True}}
        calls.append(Call(f"{scenario}/{len(calls)}", scenario, params, endpoint="chat", follows=follows))
        return calls[-1].name

    questions = ("Show the first function again, shorter.", "Now write a test for it.")
    for i, stream in enumerate((False, True)):
        code = decode(pool.ids(CHAT_CODE_TOKENS, 150 + i))
        turn = add("chat", {"messages": [{"role": "user", "content": f"What does this code do?\n\n{code}"}],
                            "stream": stream, **greedy_params(CHAT_TOKENS)})
        for question in questions:
            turn = add("chat", {"messages": [{"role": "user", "content": question}], "stream": stream,
                                **greedy_params(CHAT_TOKENS)}, follows=turn)
    forced = {"max_tokens": TOOL_CALL_TOKENS, "temperature": 0.0, "tools": [TOOL],
              "extra_body": {"return_token_ids": True}}
    named = add("tool_call", {"messages": [{"role": "user", "content": "Read line 12 of the json module."}],
                              "tool_choice": {"type": "function", "function": {"name": TOOL["function"]["name"]}},
                              **forced})
    add("tool_call", {"messages": [{"role": "user", "content": "Which line of email parses the headers?"}],
                      "tool_choice": "required", "parallel_tool_calls": False, **forced})
    streamed = add("tool_call", {"messages": [{"role": "user", "content": "Show me line 3 of http."}],
                                 "tool_choice": "required", "parallel_tool_calls": False, "stream": True, **forced})
    for follows, stream in ((named, False), (streamed, True)):
        add("tool_call", {"messages": [{"role": "tool", "content": TOOL_RESULT}], "tools": [TOOL], "stream": stream,
                          **greedy_params(CHAT_TOKENS)}, follows=follows)
    return out


def probe_calls(pool: PromptPool, count: int = 4, tokens: int = 64) -> list[Call]:
    """Streamed greedy calls whose chunks show where a speculating server accepted drafts (input of
    :func:`stop_calls`)."""
    return [Call(f"probe/{i}", "probe", {"prompt": pool.ids(64, 140 + i), "stream": True, **greedy_params(tokens)})
            for i in range(count)]


def stop_calls(probes: list[Call], outcomes: dict[str, Outcome], decode) -> tuple[list[Call], int]:
    """Calls that end inside the first multi-token chunk of each probe after its first chunk (an accepted draft,
    or steps the server coalesced; see the module docstring):
    ``max_tokens`` one past the step's first token, and a stop string made of the step's later tokens.

    ``decode`` maps token ids to text (the target's tokenizer). Returns ``(calls, inside)``: ``inside`` counts the
    calls whose end the probe places inside a step (a stop string that already occurs earlier in the text ends
    the completion there instead; that call is still compared with the server without speculation).
    """
    calls: list[Call] = []
    inside = 0
    for probe in probes:
        done = outcomes[probe.name]
        if done.status != "ok" or not done.choices:
            continue
        choice, prompt = done.choices[0], probe.params["prompt"]
        steps, ids = choice["steps"], choice["token_ids"]
        starts = [sum(steps[:j]) for j in range(len(steps))]
        multi = [(first, size) for first, size in zip(starts, steps, strict=True) if size >= 2 and first > 0]
        if not multi:
            continue
        first, size = multi[0]
        calls.append(Call(f"stop/{len(calls)}", "stop", {"prompt": prompt, **greedy_params(first + 1)}))
        inside += 1
        before, through = decode(ids[:first + 1]), decode(ids[:first + size])
        stop = through[len(before):]
        if stop.strip() and through.startswith(before):
            calls.append(Call(f"stop/{len(calls)}", "stop",
                              {"prompt": prompt, "stop": [stop], **greedy_params(len(ids))}))
            inside += decode(ids).find(stop) == len(before)
    return calls, inside
