"""The requests of the torture run (issue 17): each scenario as calls of the official ``openai`` client against a
``vllm serve``, and what came back, so that the same calls on a server without speculation can be compared.

A :class:`Call` is one ``client.completions.create(...)``; :func:`send` runs it with a time bound and records the
outcome without raising (an HTTP error is a status, a timeout is a hang, a refused connection a crash).
:func:`scenarios` builds the calls from a :class:`PromptPool`; :func:`stop_calls` places stop strings and
``max_tokens`` inside the multi-token chunks seen in streamed probes (accepted drafts: a chunk carries one engine
step's tokens, or several steps the server coalesced when the client read late). Needs ``openai`` (a vLLM
dependency) when a call is sent.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

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
    """

    name: str
    scenario: str
    params: dict
    compare: str = "greedy"
    abort_after: int | None = None


@dataclass
class Outcome:
    """What one :class:`Call` got.

    Attributes:
        status: ``"ok"``, ``"aborted"`` (closed by us as planned), ``"http <code>"`` (an error answer),
            ``"hang"`` (no answer within the bound) or ``"crash"`` (connection refused or reset: the server died).
        choices: per choice ``{"text", "token_ids", "finish_reason", "stop_reason"}`` (plus ``"logprobs"``: the
            chosen tokens' logprobs, when asked; plus ``"steps"``: tokens per streamed chunk, when streamed).
        seconds: wall time of the call.
        error: the error's text, for an error status.
    """

    status: str
    choices: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    def as_dict(self) -> dict:
        return {"status": self.status, "choices": self.choices, "seconds": self.seconds, "error": self.error}


def client(base_url: str, bound: float = REQUEST_BOUND_S):
    """An ``openai.OpenAI`` client for ``vllm serve`` at ``base_url`` (``http://host:port``): no retries, so a
    failure is seen as it happened, and ``bound`` seconds per request."""
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=bound, max_retries=0)


def send(openai_client, model: str, call: Call) -> Outcome:
    """Run ``call`` against ``model``; never raises for what the server does (see :class:`Outcome`)."""
    import openai

    began = time.monotonic()
    try:
        if call.params.get("stream"):
            choices, status = _streamed(openai_client.completions.create(model=model, **call.params), call.abort_after)
        else:
            answer = openai_client.completions.create(model=model, **call.params)
            choices, status = [_choice(c) for c in sorted(answer.choices, key=lambda c: c.index)], "ok"
        return Outcome(status, choices, round(time.monotonic() - began, 2))
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


def _streamed(stream, abort_after: int | None) -> tuple[list[dict], str]:
    """Join a completion stream per choice index; ``steps`` holds the tokens of each chunk (one engine step)."""
    joined: dict[int, dict] = {}
    for chunks, chunk in enumerate(stream, 1):
        for choice in chunk.choices:
            part = _choice(choice)
            into = joined.setdefault(choice.index, {"text": "", "token_ids": [], "finish_reason": None,
                                                    "stop_reason": None, "steps": []})
            into["text"] += part["text"]
            into["token_ids"] += part["token_ids"]
            if part["token_ids"]:
                into["steps"].append(len(part["token_ids"]))
            into["finish_reason"] = part["finish_reason"] or into["finish_reason"]
            into["stop_reason"] = part["stop_reason"] if part["stop_reason"] is not None else into["stop_reason"]
        if abort_after is not None and chunks >= abort_after:
            stream.close()
            return [joined[i] for i in sorted(joined)], "aborted"
    return [joined[i] for i in sorted(joined)], "ok"


def send_all(openai_client, model: str, calls: list[Call], concurrent: bool = True) -> dict[str, Outcome]:
    """``{call.name: Outcome}``; all calls at once (one thread each) when ``concurrent``, else one by one."""
    if not concurrent:
        return {call.name: send(openai_client, model, call) for call in calls}
    with ThreadPoolExecutor(max(1, len(calls))) as pool:
        return dict(zip([c.name for c in calls], pool.map(lambda c: send(openai_client, model, c), calls),
                        strict=True))


class PromptPool:
    """Token-id prompts of any length, cut from one stream of held-out code tokens (distinct for distinct ``i``).

    Args:
        stream: token ids (the held-out code of :func:`kimi.e2e.prompts.code_prompt_ids`, joined).
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


def _greedy(max_tokens: int, **extra) -> dict:
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
        add("preemption", {"prompt": pool.ids(120 + 8 * i, i), **_greedy(96)})
    for i in range(6):
        add("abort", {"prompt": pool.ids(64, 40 + i), "stream": True, **_greedy(200)}, "none", abort_after=2 + i)
    for i in range(3):
        add("abort", {"prompt": pool.ids(48, 50 + i), **_greedy(48)})
    prefix = pool.ids(PREFIX_TOKENS, 60)
    for i in range(6):
        add("prefix_cache", {"prompt": prefix + pool.ids(8 + 4 * i, 61 + i), **_greedy(32)})
    for i in range(4):
        add("chunked_prefill", {"prompt": pool.ids(300 + 40 * i, 70 + i), **_greedy(32)})
    for i, tokens in enumerate((32, 8, 1)):
        add("near_max_len", {"prompt": pool.ids(max_model_len - tokens, 80 + i), **_greedy(tokens)})
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
        add("mixed_sampling", {"prompt": pool.ids(56 + 8 * i, 100 + i), **_greedy(48, **extra), **sampling}, compare)
    for i, top_k in enumerate((20, 5)):  # alone (sent one by one): steps without any draft token
        add("lone_top_k", {"prompt": pool.ids(96, 105 + i), **_greedy(48, top_k=top_k), "temperature": 1.0,
                           "seed": 21 + i}, "seeded")
    # vLLM refuses n > 1 with greedy sampling (bad_requests in kimi.bench.robustness has it): sampled here
    add("n_greater_than_1", {"prompt": pool.ids(64, 110), "n": 2, "seed": 5, **_greedy(32), "temperature": 0.8},
        "seeded")
    add("n_greater_than_1", {"prompt": pool.ids(64, 111), "n": 3, "seed": 6, "top_p": 0.9, **_greedy(32),
                             "temperature": 1.0}, "seeded")
    for i in range(4):
        add("logprobs", {"prompt": pool.ids(72, 120 + i), "logprobs": 3, **_greedy(32)})
    for i in range(4):
        add("streaming", {"prompt": pool.ids(80, 130 + i), "stream": True, **_greedy(48)})
    return out


def probe_calls(pool: PromptPool, count: int = 4, tokens: int = 64) -> list[Call]:
    """Streamed greedy calls whose chunks show where a speculating server accepted drafts (input of
    :func:`stop_calls`)."""
    return [Call(f"probe/{i}", "probe", {"prompt": pool.ids(64, 140 + i), "stream": True, **_greedy(tokens)})
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
        calls.append(Call(f"stop/{len(calls)}", "stop", {"prompt": prompt, **_greedy(first + 1)}))
        inside += 1
        before, through = decode(ids[:first + 1]), decode(ids[:first + size])
        stop = through[len(before):]
        if stop.strip() and through.startswith(before):
            calls.append(Call(f"stop/{len(calls)}", "stop", {"prompt": prompt, "stop": [stop], **_greedy(len(ids))}))
            inside += decode(ids).find(stop) == len(before)
    return calls, inside
