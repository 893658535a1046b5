"""The fork's main job on a machine without a GPU: parity, lossless EAGLE-3 and `vllm serve` (issue B).

Run in the fork's venv (``python3 -m kimi setup`` makes it)::

    .venv/bin/python benchmarks/cpu_e2e.py [--models DIR] [--prompts 16] [--tokens 32]

1. Parity: greedy tokens of vLLM on CPU (CPU_MLA backend) for the reference DeepSeek-V3 target against
   transformers' DeepSeek-V3 on the same checkpoint, float32, and the largest raw-logit difference.
2. Lossless: greedy output with EAGLE-3 (Llama-style and MLA-style drafters, k = 1 and 3) against the
   output without speculation. The reference drafters have random weights and are rarely accepted, so
   a run with the target as its own draft model (k = 3) is added to exercise accepted tokens.
3. Serve: ``vllm serve`` with the MLA drafter, 8 concurrent completion requests, then bad input (a prompt
   longer than max_model_len, a malformed JSON body) and one more request; a drafter whose hidden size
   does not match must stop the start-up with the fix named.

Writes ``cpu_e2e.json`` and ``cpu_e2e.md`` to ``--out`` (default ``benchmarks/results``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kimi.e2e.engine import (  # noqa: E402
    CPU_ENGINE,
    hf_greedy,
    identical,
    parity,
    self_draft_model,
    tokenize,
    vllm_greedy,
)
from kimi.e2e.prompts import code_prompts  # noqa: E402
from kimi.e2e.server import VllmServer, request  # noqa: E402
from kimi.fork.fsutil import write_atomic  # noqa: E402

SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory-bytes", str(512 << 20)]


def step(msg: str) -> float:
    print(f"cpu_e2e: {msg}", flush=True)
    return time.monotonic()


def run_parity(target: str, prompt_ids: list[list[int]], tokens: int) -> dict:
    start = step(f"parity: transformers vs vLLM, {len(prompt_ids)} prompts x {tokens} tokens")
    hf_tokens, hf_logits = hf_greedy(target, prompt_ids, tokens)
    ours = vllm_greedy(target, prompt_ids, tokens, top_logits=5, enforce_eager=True, **CPU_ENGINE)
    result = parity(ours, hf_tokens, hf_logits)
    step(f"parity: {result} ({time.monotonic() - start:.0f} s)")
    return result


def run_lossless(models: Path, prompt_ids: list[list[int]], tokens: int) -> tuple[dict, dict]:
    target = str(models / "target")
    start = step(f"lossless: baseline without speculation, {len(prompt_ids)} prompts x {tokens} tokens")
    base = vllm_greedy(target, prompt_ids, tokens, enforce_eager=True, **CPU_ENGINE)
    lossless, counters = {}, {}
    runs = [(f"{style}_k{k}", {"method": "eagle3", "model": str(models / f"drafter-{style}"),
                               "num_speculative_tokens": k}) for style in ("llama", "mla") for k in (1, 3)]
    # The target as its own draft model: drafts are (nearly) always accepted, so verification with
    # accepted tokens and the KV cache after them are exercised on both sides of the CPU_MLA backend.
    self_draft = self_draft_model(target, tempfile.mkdtemp(prefix="kimi-self-draft-"))
    runs.append(("self_draft_k3", {"method": "draft_model", "model": self_draft, "num_speculative_tokens": 3}))
    for name, spec in runs:
        run = vllm_greedy(target, prompt_ids, tokens, speculative=spec, enforce_eager=True, **CPU_ENGINE)
        lossless[name], counters[name] = identical(run, base), run.counters
        step(f"lossless {name}: {lossless[name]}, counters {counters[name]}")
    step(f"lossless: done ({time.monotonic() - start:.0f} s)")
    return lossless, counters


def run_serve(models: Path, prompts: list[str], logs: Path, clients: int = 8) -> dict:
    vllm = Path(sys.executable).with_name("vllm")
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
        server = VllmServer(Path(sys.executable).with_name("vllm"), str(models / "target"),
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
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "cpu_e2e.json", json.dumps(result, indent=2) + "\n")
    lines = ["# CPU end to end (issue B)", "", f"- command: `{result['command']}`", f"- date: {result['date']}",
             f"- CPU: {result['cpu']}", "",
             "| check | result |", "|---|---|",
             (f"| HF parity ({result['dtype']}) | {result['hf_parity']['matching']}/{result['hf_parity']['total']} "
              f"prompts, max logit diff {result['hf_parity']['max_logit_diff']:.2e} |")]
    for name, value in result["lossless"].items():
        acc = result["spec_counters"][name]
        lines.append(f"| lossless {name} | {value['identical']}/{value['total']} identical; accepted "
                     f"{acc['num_accepted_tokens']:.0f} of {acc['num_draft_tokens']:.0f} draft tokens |")
    serve = result["serve"]
    lines.append(f"| serve | ok={serve['ok']}, {serve['answered']}/{serve['requests']} concurrent answered, "
                 f"bad input {serve['bad_input']} |")
    lines.append(f"| wrong drafter | {result['wrong_drafter']} |")
    write_atomic(out / "cpu_e2e.md", "\n".join(lines) + "\n")
    print("\n".join(lines[6:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    if not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    begin = time.monotonic()
    prompts = code_prompts(args.prompts)
    target = str(args.models / "target")
    prompt_ids = tokenize(target, prompts)
    logs = args.out / "logs"
    result = {"command": " ".join(["python", *sys.argv]), "cpu": _cpu_name(), "dtype": CPU_ENGINE["dtype"],
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    result["hf_parity"] = run_parity(target, prompt_ids, args.tokens)
    result["lossless"], result["spec_counters"] = run_lossless(args.models, prompt_ids, args.tokens)
    result["serve"] = run_serve(args.models, prompts, logs)
    result["wrong_drafter"] = run_wrong_drafter(args.models, logs)
    result["seconds"] = round(time.monotonic() - begin)
    write_results(args.out, result)
    return 0


def _cpu_name() -> str:
    """``model name`` from /proc/cpuinfo and the cores this process may use."""
    cores = len(os.sched_getaffinity(0))
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.machine()}, {cores} cores"


if __name__ == "__main__":
    sys.exit(main())
