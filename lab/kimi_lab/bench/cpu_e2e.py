"""The checks of ``benchmarks/cpu_e2e.py``, the fork's main job on a machine without a GPU: parity with
transformers, lossless EAGLE-3 (on the reference target and on the Kimi-K2.5 wrapper with images), ``vllm serve``
with bad input, and a drafter that must not start. Needs the
fork's venv (vLLM, torch, transformers: imported by :mod:`kimi.e2e.engine` when a check runs)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kimi.e2e.engine import hf_greedy, identical, parity, self_draft_model, vllm_greedy
from kimi.e2e.presets import CPU_EAGER, CPU_SERVE
from kimi.e2e.server import VllmServer, request, serve_args, vllm_command
from kimi_lab.bench.results import header, write_json, write_lines

#: ``vllm serve`` flags of the serve checks (:data:`kimi.e2e.presets.CPU_SERVE`).
SERVE_ARGS = serve_args(CPU_SERVE)


def step(msg: str) -> float:
    """Print a ``cpu_e2e: msg`` line; the time, to measure the step from."""
    print(f"cpu_e2e: {msg}", flush=True)
    return time.monotonic()


def run_parity(target: str, prompt_ids: list[list[int]], tokens: int) -> dict:
    """Greedy tokens of vLLM on CPU against transformers' on the same checkpoint (:func:`kimi.e2e.engine.parity`)."""
    start = step(f"parity: transformers vs vLLM, {len(prompt_ids)} prompts x {tokens} tokens")
    hf_tokens, hf_logits = hf_greedy(target, prompt_ids, tokens)
    ours = vllm_greedy(target, prompt_ids, tokens, top_logits=5, **CPU_EAGER)
    result = parity(ours, hf_tokens, hf_logits)
    step(f"parity: {result} ({time.monotonic() - start:.0f} s)")
    return result


def run_lossless(models: Path, prompt_ids: list[list[int]], tokens: int) -> tuple[dict, dict]:
    """EAGLE-3 runs (both drafter styles, k = 1 and 3, and the target as its own draft model) against the run
    without speculation: ``({run: identical sequences}, {run: spec-decode counters})``."""
    target = str(models / "target")
    start = step(f"lossless: baseline without speculation, {len(prompt_ids)} prompts x {tokens} tokens")
    base = vllm_greedy(target, prompt_ids, tokens, **CPU_EAGER)
    lossless, counters = {}, {}
    runs = [(f"{style}_k{k}", {"method": "eagle3", "model": str(models / f"drafter-{style}"),
                               "num_speculative_tokens": k}) for style in ("llama", "mla") for k in (1, 3)]
    # The target as its own draft model: drafts are (nearly) always accepted, so verification with
    # accepted tokens and the KV cache after them are exercised on both sides of the CPU_MLA backend.
    self_draft = self_draft_model(target, tempfile.mkdtemp(prefix="kimi-self-draft-"))
    runs.append(("self_draft_k3", {"method": "draft_model", "model": self_draft, "num_speculative_tokens": 3}))
    for name, spec in runs:
        run = vllm_greedy(target, prompt_ids, tokens, speculative=spec, **CPU_EAGER)
        lossless[name], counters[name] = identical(run, base), run.counters
        step(f"lossless {name}: {lossless[name]}, counters {counters[name]}")
    step(f"lossless: done ({time.monotonic() - start:.0f} s)")
    return lossless, counters


def run_k25_lossless(models: Path) -> dict:
    """The Kimi-K2.5 wrapper (``models/kimi-k25``) with text and image requests, each drafter style against the
    wrapper alone: :func:`kimi_lab.bench.multimodal.lossless` on the CPU engines (``{scenario: {style: ...}}``)."""
    from kimi_lab.bench.multimodal import lossless

    start = step("lossless: the Kimi-K2.5 wrapper, text and image requests, both drafter styles")
    out = lossless(str(models / "kimi-k25"), {style: str(models / f"drafter-{style}") for style in ("llama", "mla")})
    step(f"lossless Kimi-K2.5: done ({time.monotonic() - start:.0f} s)")
    return out


def tau(counters: dict) -> float | None:
    """Mean acceptance length τ = 1 + accepted / drafts from spec-decode counters; None without drafts."""
    drafts = counters.get("num_drafts") or 0
    return round(1 + counters["num_accepted_tokens"] / drafts, 3) if drafts else None


def run_serve(models: Path, prompts: list[str], logs: Path, clients: int = 8) -> dict:
    """``vllm serve`` with the MLA drafter: ``clients`` concurrent completions, then bad input (a prompt longer
    than max_model_len, a malformed JSON body) and one more request; ``ok`` when all went as they should."""
    vllm = vllm_command()
    spec = json.dumps({"method": "eagle3", "model": str(models / "drafter-mla"), "num_speculative_tokens": 3})
    start = step(f"serve: vllm serve with the MLA drafter, {clients} concurrent clients")
    with VllmServer(vllm, str(models / "target"), [*SERVE_ARGS, "--speculative-config", spec],
                    logs / "serve.log") as server:
        server.start()
        with ThreadPoolExecutor(clients) as pool:
            replies = list(pool.map(lambda p: server.complete(p, 32), prompts[:clients]))
        ok = [r.status == 200 and r.json()["choices"][0]["text"] != "" for r in replies]
        too_long = server.complete("def f():\n" * 2000, 16)
        malformed = request(f"{server.base}/v1/completions", b'{"model": "x", "prompt": ')
        after = server.complete(prompts[0], 8)
        counters = server.counters()
    bad_input = {"prompt_too_long": too_long.status, "malformed_json": malformed.status,
                 "served_after_bad_input": after.status == 200}
    result = {"ok": sum(ok) == clients and bad_input["served_after_bad_input"]
              and 400 <= too_long.status < 500 and 400 <= malformed.status < 500,
              "requests": clients, "answered": sum(ok), "bad_input": bad_input, "counters": counters}
    step(f"serve: {result} ({time.monotonic() - start:.0f} s)")
    return result


def run_wrong_drafter(models: Path, logs: Path) -> dict:
    """A drafter made for a 512-wide target must stop `vllm serve` before weights load, naming the fix."""
    with tempfile.TemporaryDirectory() as tmp:
        drafter = Path(tmp) / "drafter-wrong-hidden"
        shutil.copytree(models / "drafter-llama", drafter)
        config = json.loads((drafter / "config.json").read_text())
        config["target_hidden_size"] = 2 * config["hidden_size"]
        (drafter / "config.json").write_text(json.dumps(config))
        spec = json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3})
        start = step("serve: a drafter for another hidden size must fail at start-up")
        server = VllmServer(vllm_command(), str(models / "target"),
                            [*SERVE_ARGS, "--speculative-config", spec], logs / "serve-wrong-drafter.log")
        try:
            server.start(timeout=300)
            status, message = None, "server started"
        except Exception as exc:  # the expected path: KimiError with the log tail
            status, message = server.proc.returncode if server.proc else None, str(exc)
        finally:
            server.stop()
    named = "expects target hidden states of width" in message and "kimi drafter inspect" in message
    result = {"exit_status": status, "error_names_fix": named}
    step(f"serve: wrong drafter -> {result} ({time.monotonic() - start:.0f} s)")
    return result


def write_results(out: Path, result: dict) -> None:
    """Write ``cpu_e2e.json`` and ``cpu_e2e.md`` to ``out`` (atomically) and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "cpu_e2e.json", result)
    v = result.get("versions")
    lines = [*header("CPU end to end", result["command"], result["date"]), f"- CPU: {result['cpu']}",
             *([f"- versions: vLLM {v['vllm']}, torch {v['torch']}, Python {v['python']}"] if v else []), "",
             "| check | result |", "|---|---|",
             (f"| HF parity ({result['dtype']}) | {result['hf_parity']['matching']}/{result['hf_parity']['total']} "
              f"prompts, max logit diff {result['hf_parity']['max_logit_diff']:.2e} |")]
    for name, value in result["lossless"].items():
        acc = result["spec_counters"][name]
        lines.append(f"| lossless {name} | {value['identical']}/{value['total']} identical; accepted "
                     f"{acc['num_accepted_tokens']:.0f} of {acc['num_draft_tokens']:.0f} draft tokens, "
                     f"τ {tau(acc)} |")
    for style in ("llama", "mla"):
        runs = [styles[style] for styles in result.get("k25_lossless", {}).values() if style in styles]
        if runs:
            lines.append(f"| lossless Kimi-K2.5 wrapper, {style} drafter | {sum(r['identical'] for r in runs)}/"
                         f"{sum(r['total'] for r in runs)} identical in {len(runs)} text and image scenarios, "
                         f"{sum(r['crashes'] for r in runs)} crashed |")
    serve = result["serve"]
    lines.append(f"| serve | ok={serve['ok']}, {serve['answered']}/{serve['requests']} concurrent answered, "
                 f"bad input {serve['bad_input']} |")
    lines.append(f"| wrong drafter | {result['wrong_drafter']} |")
    write_lines(out / "cpu_e2e.md", lines)
    print("\n".join(lines[lines.index("| check | result |"):]))
