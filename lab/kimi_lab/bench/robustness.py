"""The torture run of ``benchmarks/robustness.py``: ``vllm serve`` with EAGLE-3 through the engine's hard
paths, compared request by request with the same server without speculation, and vLLM's own load tool.

Per drafter style three servers run one after the other with the settings of :func:`server_args`: ``spec``
(EAGLE-3, k = :data:`K`), ``nospec`` (the same without ``--speculative-config``) and ``spec_rechunked`` (EAGLE-3
with another ``--max-num-batched-tokens``, for seeded sampling across chunkings). The calls are
:mod:`kimi_lab.bench.torture`'s, on ``/v1/completions`` and, for the chat scenarios, ``/v1/chat/completions`` (with the
fork's chat template and a tool parser: :func:`server_args`). Needs the fork's venv (``openai``, ``tokenizers``,
vLLM's CLI).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from kimi.e2e.server import (
    CHAT_TEMPLATE,
    VllmServer,
    metric_sums,
    request,
    serve_args,
    spec_counters,
    vllm_command,
)
from kimi_lab.bench.parallel import tau
from kimi_lab.bench.torture import (
    DEF_REGEX,
    JSON_SCHEMA,
    Call,
    Outcome,
    PromptPool,
    client,
    conversations,
    probe_calls,
    scenarios,
    send_all,
    stop_calls,
    valid_tool_call,
)

#: Draft tokens per step.
K = 3
#: Context of the servers; the ``near_max_len`` scenario ends requests exactly here.
MAX_MODEL_LEN = 512
#: Token budget per step of ``spec``/``nospec`` (below the longer prompts: chunked prefill) and of
#: ``spec_rechunked``.
BATCHED_TOKENS = 64
RECHUNKED_TOKENS = 512
#: KV cache of the servers on CPU (float32; half of it on a GPU, in bfloat16) per style: 768 tokens each as vLLM
#: the v0.32 line's vLLM sizes it (its start-up log), about three of the ``preemption`` scenario's twelve requests at
#: once and more than one request of ``MAX_MODEL_LEN`` (vLLM refuses less).
KV_CACHE_BYTES = {"llama": 12 << 20, "mla": 24 << 20}
#: Concurrencies of ``vllm bench serve`` and its requests (input / output tokens).
BENCH_CONCURRENCY = (1, 4, 16, 64)
BENCH_TOKENS = (64, 32)
#: Seconds the servers keep an idle HTTP connection open: longer than the clients' pools keep one (``vllm bench
#: serve``'s aiohttp connector 60 s, the openai client's httpx 5 s), so that no request is sent on a connection the
#: server is closing (uvicorn's default, vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, is 5 s; the race fails a request with
#: ServerDisconnectedError: vllm-project/vllm-omni#1374). A failed request is then the server's.
KEEP_ALIVE_S = 75
#: What the servers' environment adds to this process's.
SERVER_ENV = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S)}
#: Tool parser of the servers. The v0.32 line's vLLM answers ``tool_choice="required"`` or a named function with 400
#: ('tool_choice="required" requires --tool-call-parser to be set') unless the server has a tool parser, and it loads
#: the parser named by ``--tool-call-parser`` only with ``--enable-auto-tool-choice`` (without it the same 400,
#: naming the flag that is set). The DeepSeek-V3 and Kimi-K2 parsers need their models' tool-call special tokens,
#: which the reference tokenizer lacks (and their structural tags write the call in that format); ``pythonic`` has
#: no structural tag, so a forced call goes through vLLM's generic path: the tool's JSON schema as structured output.
TOOL_CALL_PARSER = "pythonic"

#: The calls the control sends alone to the server without speculation, and the prefix of their counts in a row
#: (``Call.compare`` -> ``control_`` / ``seeded_control_``): see :func:`compare`.
CONTROLLED = {"greedy": "control_", "seeded": "seeded_control_"}

#: Prometheus gauges and counters read around scenarios (summed over label sets).
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
          "vllm:prefix_cache_hits_total")


def server_args(speculative: dict | None, kv_bytes: int, batched_tokens: int = BATCHED_TOKENS,
                gpu: bool = False) -> list[str]:
    """``vllm serve`` flags of one torture server: a KV cache of ``kv_bytes``, seed 0, and on CPU eager; on a GPU
    (``gpu``) vLLM's defaults (torch.compile, CUDA graphs) and a low ``gpu_memory_utilization`` (the fixed KV cache
    skips memory profiling; see :mod:`kimi.e2e.presets`); :func:`server_dtype`. For ``/v1/chat/completions``: the
    fork's chat template (the models have none), :data:`TOOL_CALL_PARSER` for forced tool calls, and the prompt
    tokens served from the prefix cache in each answer's usage."""
    engine = {"max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": kv_bytes, "seed": 0, "max_num_seqs": 16,
              "speculative_config": speculative, "dtype": server_dtype(gpu),
              **({"gpu_memory_utilization": 0.12} if gpu else {"enforce_eager": True})}
    # JSON without free whitespace (the code model fills it with spaces until max_tokens): the v0.32 line's xgrammar
    # backend takes disable_any_whitespace from the server's config only (a request's is ignored), and the config
    # accepts it only with the backend named
    return [*serve_args(engine), "--max-num-batched-tokens", str(batched_tokens),
            "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
            "--chat-template", str(CHAT_TEMPLATE), "--enable-auto-tool-choice", "--tool-call-parser",
            TOOL_CALL_PARSER, "--enable-prompt-tokens-details"]


def server_dtype(gpu: bool) -> str:
    """The servers' dtype: bfloat16 on a GPU (as users serve; the v0.32 line's vLLM has no float32 MLA backend on CUDA),
    float32 on CPU."""
    return "bfloat16" if gpu else "float32"


def gauges(metrics: str) -> dict[str, float]:
    """:data:`GAUGES` in a ``/metrics`` text, summed over label sets (0 when absent)."""
    return metric_sums(metrics, GAUGES)


def wait_idle(server: VllmServer, bound: float = 60.0) -> bool:
    """Wait until the server runs and queues no request; False if some are still there after ``bound`` s."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        now = gauges(server.metrics())
        if now["vllm:num_requests_running"] == 0 and now["vllm:num_requests_waiting"] == 0:
            return True
        time.sleep(0.5)
    return False


def run_calls(server: VllmServer, plan: dict[str, list[Call]], log, one_by_one: bool = False) -> dict:
    """Send each scenario of ``plan`` (all its calls at once; ``prefix_cache``'s first call alone first, to fill
    the cache; ``stop`` and ``lone_top_k`` one by one: ``stop`` so that its steps are the probe's; ``chat``'s
    conversations one after the other, so that one does not evict the other's blocks from the small prefix cache;
    every call one by one with ``one_by_one``; a conversation's turns always in order) and wait for the server to be
    idle after each.

    Returns ``{"outcomes": {name: Outcome}, "scenarios": {scenario: {"seconds", "preemptions", "prefix_cache_hits",
    "idle_after"}}}``.
    """
    openai_client = client(server.base)
    outcomes: dict[str, Outcome] = {}
    facts: dict[str, dict] = {}
    for scenario, calls in plan.items():
        before, began = gauges(server.metrics()), time.monotonic()
        if scenario == "prefix_cache":
            outcomes.update(send_all(openai_client, server.model, calls[:1]))
            outcomes.update(send_all(openai_client, server.model, calls[1:]))
        else:
            alone = one_by_one or scenario in ("stop", "lone_top_k", "chat")
            outcomes.update(send_all(openai_client, server.model, calls, concurrent=not alone))
        seconds = round(time.monotonic() - began, 1)
        idle = wait_idle(server) if server.proc and server.proc.poll() is None else False
        after = gauges(server.metrics()) if idle else before
        facts[scenario] = {"seconds": seconds, "idle_after": idle,
                           "preemptions": after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"],
                           "prefix_cache_hits": (after["vllm:prefix_cache_hits_total"]
                                                 - before["vllm:prefix_cache_hits_total"])}
        statuses = sorted({o.status for n, o in outcomes.items() if n.startswith(f"{scenario}/")})
        log(f"{scenario}: {len(calls)} calls, {seconds} s, statuses {statuses}")
    return {"outcomes": outcomes, "scenarios": facts}


def bad_request_bodies(model: str) -> dict[str, tuple[dict | bytes, int]]:
    """``{name: (body of a /v1/completions request, the HTTP status the v0.32 line's vLLM answers it with)}``:
    malformed, over-long and unsupported requests (4xx), one that vLLM serves by clipping ``max_tokens`` to the context
    (200), and a good request sent last."""
    small = {"model": model, "prompt": "x", "max_tokens": 4}
    return {
        "prompt_longer_than_max_model_len": ({**small, "prompt": [5] * (MAX_MODEL_LEN + 10)}, 400),
        "max_tokens_past_max_model_len": ({**small, "prompt": [5] * (MAX_MODEL_LEN - 4), "max_tokens": 64}, 200),
        "malformed_json": (b'{"model": "x", "prompt": ', 400),
        "unknown_model": ({**small, "model": "no-such-model"}, 404),
        "negative_max_tokens": ({**small, "max_tokens": -1}, 400),
        "n_zero": ({**small, "n": 0}, 400),
        "n_2_with_greedy_sampling": ({**small, "n": 2, "temperature": 0}, 400),
        "min_p_with_speculation": ({**small, "temperature": 1.0, "min_p": 0.05}, 400),
        "token_id_outside_vocabulary": ({**small, "prompt": [10 ** 7]}, 400),
        "invalid_json_schema": ({**small, "structured_outputs": {"json": "{not a schema"}}, 400),
        "invalid_regex": ({**small, "structured_outputs": {"regex": "(unclosed"}}, 400),
        "good_request_after": ({**small, "prompt": "def f():"}, 200),
    }


def bad_requests(server: VllmServer) -> dict[str, dict]:
    """Send :func:`bad_request_bodies` in order: per request ``{"status", "expected", "message"}`` (the error
    message the client gets, cut to 200 characters)."""
    found = {}
    for name, (body, expected) in bad_request_bodies(server.model).items():
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        reply = request(f"{server.base}/v1/completions", raw, timeout=60)
        message = ""
        if reply.status != 200:
            try:
                message = str(reply.json().get("error", {}).get("message", ""))[:200]
            except (ValueError, AttributeError):
                message = reply.body[:200]
        found[name] = {"status": reply.status, "expected": expected, "message": message}
    return found


def request_errors(errors: list[str]) -> dict[str, int]:
    """``{error: how many requests failed with it}`` from the per-request ``errors`` of ``vllm bench serve``'s
    result JSON ("" for a request that succeeded); each error cut to its last line (a traceback's exception)."""
    found: dict[str, int] = {}
    for error in errors:
        if error:
            last = (error.strip() or repr(error)).splitlines()[-1][:300]
            found[last] = found.get(last, 0) + 1
    return found


def bench_serve(server: VllmServer, out: Path, seconds_per_run: float = 300.0) -> list[dict]:
    """``vllm bench serve`` (random dataset, :data:`BENCH_TOKENS`) at each of :data:`BENCH_CONCURRENCY` against
    ``server``, ``2 c`` requests (at least 16); per run its JSON's request counts, throughput, spec-decode
    counters and the failed requests' errors (:func:`request_errors`), or ``{"error": ...}`` when the tool failed
    or ran past ``seconds_per_run``."""
    rows = []
    for concurrency in BENCH_CONCURRENCY:
        name = f"bench-c{concurrency}.json"
        cmd = [*vllm_command(), "bench", "serve", "--backend", "vllm", "--base-url", server.base, "--model",
               server.model, "--endpoint", "/v1/completions", "--dataset-name", "random",
               "--random-input-len", str(BENCH_TOKENS[0]), "--random-output-len", str(BENCH_TOKENS[1]),
               "--num-prompts", str(max(16, 2 * concurrency)), "--max-concurrency", str(concurrency),
               "--ignore-eos", "--seed", "0", "--save-result", "--save-detailed", "--result-dir", str(out),
               "--result-filename", name, "--disable-tqdm"]
        row: dict = {"concurrency": concurrency, "command": " ".join(["vllm", *cmd[len(vllm_command()):]])}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds_per_run)
            (out / f"bench-c{concurrency}.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                row["error"] = f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}"
            else:
                found = json.loads((out / name).read_text())
                row.update({key: found.get(key) for key in (
                    "num_prompts", "completed", "failed", "duration", "request_throughput", "output_throughput",
                    "spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
                    "spec_decode_acceptance_length")})
                row["errors"] = request_errors(found.get("errors") or [])
        except subprocess.TimeoutExpired:
            row["error"] = f"ran past {seconds_per_run:.0f} s"
        rows.append(row)
    return rows


def first_differences(ours: Outcome, other: Outcome) -> list[int | None]:
    """Per pair of choices: None where token ids and finish reason are equal, else the index of the first token
    that differs (the shorter length where one is a prefix of the other)."""
    found: list[int | None] = []
    for a, b in zip(ours.choices, other.choices, strict=False):
        if a["token_ids"] == b["token_ids"] and a["finish_reason"] == b["finish_reason"]:
            found.append(None)
            continue
        pairs = zip(a["token_ids"], b["token_ids"], strict=False)
        found.append(next((j for j, (x, y) in enumerate(pairs) if x != y),
                          min(len(a["token_ids"]), len(b["token_ids"]))))
    return found


def compare(plan: dict[str, list[Call]], spec: dict, nospec: dict, rechunked: dict, facts: dict,
            alone: dict | None = None) -> dict:
    """Per scenario: requests; ``identical`` / ``total``: greedy choices equal to ``nospec``'s (tokens and finish
    reason); ``seeded_identical`` / ``seeded_total``: seeded choices equal to ``rechunked``'s, and
    ``seeded_nospec_identical`` / ``seeded_nospec_total`` to ``nospec``'s (same seed, no speculation); the choices that
    differ (``{"call", "choice", "against", "first_difference"}``), crashes, hangs, unplanned errors, seconds, and
    what proves the path was taken (preemptions, prefix-cache hits, aborts, structured outputs that parse).

    With ``alone`` (the greedy and seeded calls sent one by one to the server without speculation), the control that
    tells numerics from bugs: ``control_identical`` / ``control_total`` (greedy) and ``seeded_control_identical`` /
    ``seeded_control_total`` (seeded), choices of ``nospec`` (sent as a batch) equal to the same server's answers
    alone, where speculation plays no part."""
    rows = {}
    for scenario, calls in plan.items():
        row = {"requests": len(calls), "identical": 0, "total": 0, "seeded_identical": 0, "seeded_total": 0,
               "seeded_nospec_identical": 0, "seeded_nospec_total": 0, "differs": [], "crashes": 0, "hangs": 0,
               "errors": [], "seconds": facts[scenario]["seconds"], "idle_after": facts[scenario]["idle_after"]}
        for call in calls:
            ours = spec[call.name]
            row["crashes"] += ours.status == "crash"
            row["hangs"] += ours.status == "hang"
            if ours.status not in ("ok", "aborted"):
                row["errors"].append(f"{call.name}: {ours.status} {ours.error}")
                continue
            if ours.status == "ok" and not all(choice["finish_reason"] for choice in ours.choices):
                row["errors"].append(f"{call.name}: a choice without finish reason")
            against = {"greedy": [("nospec", "")],
                       "seeded": [("spec_rechunked", "seeded_"), ("nospec", "seeded_nospec_")]}.get(call.compare, [])
            for server, prefix in against:
                other = {"nospec": nospec, "spec_rechunked": rechunked}[server].get(call.name)
                if other is None:
                    continue
                for i, where in enumerate(first_differences(ours, other)):
                    row[f"{prefix}total"] += 1
                    row[f"{prefix}identical"] += where is None
                    if where is not None:
                        row["differs"].append({"call": call.name, "choice": i, "against": server,
                                               "first_difference": where})
                if len(ours.choices) != len(other.choices):
                    row["errors"].append(f"{call.name}: {len(ours.choices)} choices against {len(other.choices)} "
                                         f"({server})")
            other = nospec.get(call.name) if call.compare in CONTROLLED else None
            if alone is not None and other is not None and call.name in alone:
                control = first_differences(other, alone[call.name])
                prefix = CONTROLLED[call.compare]
                row[f"{prefix}total"] = row.get(f"{prefix}total", 0) + len(control)
                row[f"{prefix}identical"] = row.get(f"{prefix}identical", 0) + control.count(None)
        row.update(_evidence(scenario, calls, spec, nospec, facts[scenario]))
        rows[scenario] = row
    return rows


def _evidence(scenario: str, calls: list[Call], spec: dict, nospec: dict, facts: dict) -> dict:
    """What shows that the scenario took the path it is named after."""
    if scenario == "preemption":
        return {"preemptions": facts["preemptions"]}
    if scenario == "prefix_cache":
        return {"prefix_cache_hits": facts["prefix_cache_hits"]}
    if scenario == "abort":
        return {"aborted": sum(spec[c.name].status == "aborted" for c in calls)}
    if scenario.startswith("structured_"):
        return {"valid": sum(_valid(scenario, ch) for c in calls for ch in spec[c.name].choices),
                "finished_by_grammar": sum(ch["finish_reason"] == "stop" for c in calls for ch in spec[c.name].choices)}
    if scenario == "logprobs":
        diffs = [abs(x - y) for c in calls if spec[c.name].choices and nospec.get(c.name) and nospec[c.name].choices
                 and spec[c.name].choices[0]["token_ids"] == nospec[c.name].choices[0]["token_ids"]
                 for x, y in zip(spec[c.name].choices[0].get("logprobs", []),
                                 nospec[c.name].choices[0].get("logprobs", []), strict=True)]
        return {"max_logprob_diff": max(diffs, default=None)}
    if scenario == "streaming":
        return {"multi_token_steps": _multi_token_steps(calls, spec)}
    if scenario == "chat":
        later = [c for c in calls if c.follows]
        return {"later_turns_from_prefix_cache": sum(((spec[c.name].usage or {}).get("cached_tokens") or 0) > 0
                                                     for c in later),
                "later_turns": len(later), "prefix_cache_hits": facts["prefix_cache_hits"],
                "multi_token_steps": _multi_token_steps(calls, spec)}
    if scenario == "tool_call":
        forced = [c for c in calls if c.params.get("tool_choice") not in (None, "auto", "none")]
        follow_ups = [c for c in calls if c.follows]
        return {"forced_calls": len(forced),
                "valid_tool_calls": sum(valid_tool_call(ch) for c in forced for ch in spec[c.name].choices[:1]),
                "follow_ups_answered": sum(spec[c.name].status == "ok" and any(
                    ch["text"] or ch.get("tool_calls") for ch in spec[c.name].choices) for c in follow_ups),
                "follow_ups": len(follow_ups)}
    return {}


def _multi_token_steps(calls: list[Call], spec: dict) -> int:
    """Streamed chunks of two tokens or more (accepted drafts) in the answers to ``calls``."""
    return sum(s >= 2 for c in calls for ch in spec[c.name].choices for s in ch.get("steps", []))


def _valid(scenario: str, choice: dict) -> bool:
    """A finished structured output is what it was constrained to (one cut by max_tokens counts as invalid)."""
    if choice["finish_reason"] != "stop":
        return False
    if scenario == "structured_regex":
        return re.fullmatch(DEF_REGEX, choice["text"]) is not None
    try:
        value = json.loads(choice["text"])
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == set(JSON_SCHEMA["required"])


def metrics_check(counters: dict[str, float]) -> dict:
    """The server's spec-decode counters, τ from them (1 + accepted / drafts) and whether they are consistent:
    accepted ≤ draft tokens ≤ k × drafts."""
    drafts, drafted, accepted = (counters[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
    return {**counters, "tau": tau(counters), "consistent": accepted <= drafted <= K * drafts and drafts > 0}


def compared(plan: dict[str, list[Call]], *kinds: str) -> dict[str, list[Call]]:
    """The calls of ``plan`` compared as one of ``kinds`` (``Call.compare``), by scenario; scenarios without one left
    out."""
    found = {scenario: [c for c in calls if c.compare in kinds] for scenario, calls in plan.items()}
    return {scenario: calls for scenario, calls in found.items() if calls}


def run_style(style: str, target: str, drafter: str, pool: PromptPool, decode, logs: Path, log,
              bench: bool, gpu: bool = False, control: bool = False) -> dict:
    """The torture run of one drafter style (see the module docstring): per-scenario rows, the bad-request
    statuses, the stop calls placed inside accepted drafts, the spec-decode counters, start-up seconds, and the
    ``vllm bench serve`` rows when ``bench``; servers as :func:`server_args` makes them for ``gpu``, with
    :data:`KV_CACHE_BYTES` halved for a 2-byte dtype (the same number of tokens). With ``control`` the greedy and
    seeded calls also go one by one to the server without speculation (:func:`compare`'s ``control_*`` and
    ``seeded_control_*``)."""
    speculative = {"method": "eagle3", "model": drafter, "num_speculative_tokens": K}
    plan = {**scenarios(pool, MAX_MODEL_LEN), **conversations(pool, decode)}
    dtype = server_dtype(gpu)
    kv_bytes = KV_CACHE_BYTES[style] // (1 if dtype == "float32" else 2)
    result: dict = {"target": target, "drafter": drafter, "dtype": dtype, "kv_cache_bytes": kv_bytes, "start_s": {}}

    def started(name: str, args: list[str]) -> VllmServer:
        server = VllmServer(vllm_command(), target, args, logs / f"{style}-{name}.log", env=SERVER_ENV)
        began = time.monotonic()
        server.start()
        result["start_s"][name] = round(time.monotonic() - began, 1)
        log(f"{style}: {name} server ready in {result['start_s'][name]} s")
        return server

    with started("spec", server_args(speculative, kv_bytes, gpu=gpu)) as server:
        probes = probe_calls(pool)
        probed = send_all(client(server.base), target, probes, concurrent=False)
        plan["stop"], result["stops_inside_multi_token_chunks"] = stop_calls(probes, probed, decode)
        spec = run_calls(server, plan, log)
        result["bad_requests"] = bad_requests(server)
        result["counters"] = metrics_check(spec_counters(server.metrics()))
        result["server_alive_after"] = server.proc is not None and server.proc.poll() is None
        if bench:
            result["bench_serve"] = bench_serve(server, logs / f"{style}-bench")
    with started("nospec", server_args(None, kv_bytes, gpu=gpu)) as server:
        nospec = run_calls(server, plan, log)
        alone = run_calls(server, compared(plan, *CONTROLLED), log, one_by_one=True) if control else None
    with started("spec_rechunked", server_args(speculative, kv_bytes, RECHUNKED_TOKENS, gpu)) as server:
        rechunked = run_calls(server, compared(plan, "seeded"), log)
    result["scenarios"] = compare(plan, spec["outcomes"], nospec["outcomes"], rechunked["outcomes"],
                                  spec["scenarios"], alone and alone["outcomes"])
    return result
