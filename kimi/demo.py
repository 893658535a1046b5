"""``kimi demo``: the README's main command, the fork's main job on the embedded reference models.

1. ``kimi setup`` (skipped when the venv already holds this tree);
2. ``kimi models make`` into ``.kimi/models/reference`` when it is not there;
3. ``vllm serve <target> --speculative-config '{"method": "eagle3", ...}'`` (log under ``.kimi/logs/``);
4. one OpenAI-compatible completion request with a real code prompt (held-out standard library code),
   printed with its completion, then the spec-decode counters from ``/metrics`` and the mean
   acceptance length τ = 1 + accepted / drafts;
5. the server is stopped (also on Ctrl-C or an error).

Works without a GPU: MLA runs on vLLM's CPU backend through patch 0006 (``kimi.cpu_mla``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from kimi.devenv import ensure_env
from kimi.e2e.prompts import code_prompts
from kimi.e2e.server import VllmServer
from kimi.errors import KimiError
from kimi.fork.layout import Layout

#: CPU-friendly serving settings: a 1 GiB KV cache (the CPU backend would otherwise reserve most of the
#: host's memory), a short context.
SERVE_ARGS = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(1 << 30)]


def say(msg: str) -> None:
    print(f"kimi demo: {msg}", file=sys.stderr, flush=True)


def demo(layout: Layout, line: str, venv: Path | None = None, kernels: str = "auto", from_dir: Path | None = None,
         drafter: str = "mla", k: int = 3, max_tokens: int = 64) -> None:
    """Set up, make the reference models, serve the target with an EAGLE-3 drafter, ask, print, stop.

    Raises:
        KimiError: a step fails (set-up, model generation, a server that does not start, a failed request);
            the message names the step and the log to read.
    """
    python = ensure_env(layout, line, venv, kernels, from_dir)
    models = layout.private / "models" / "reference"
    if not (models / "MANIFEST.json").is_file():
        say(f"making the reference models in {models}")
        made = subprocess.run([str(python), "-m", "kimi", "models", "make", str(models)], cwd=layout.root)
        if made.returncode != 0:
            raise KimiError(f"`kimi models make` failed (exit {made.returncode})")
    spec = {"method": "eagle3", "model": str(models / f"drafter-{drafter}"), "num_speculative_tokens": k}
    log = layout.private / "logs" / "demo-serve.log"
    server = VllmServer(python.with_name("vllm"), str(models / "target"),
                        [*SERVE_ARGS, "--speculative-config", json.dumps(spec)], log)
    say(f"starting `vllm serve {models / 'target'}` with the {drafter}-style EAGLE-3 drafter, k = {k} "
        f"(log: {log}; the first start compiles the model, a minute or two on a small CPU)")
    with server:
        started = time.monotonic()
        server.start()
        say(f"server ready in {time.monotonic() - started:.0f} s at {server.base}")
        prompt = code_prompts(1)[0]
        started = time.monotonic()
        reply = server.complete(prompt, max_tokens)
        if reply.status != 200:
            raise KimiError(f"the completion request failed with HTTP {reply.status}: {reply.body[:500]}")
        answer = reply.json()
        text, generated = answer["choices"][0]["text"], answer.get("usage", {}).get("completion_tokens", "?")
        seconds = time.monotonic() - started
        counters = server.counters()
    print(f"--- prompt (held-out standard library code) ---\n{prompt}--- completion ({generated} tokens, "
          f"{seconds:.1f} s) ---\n{text}\n---")
    drafts = counters["num_drafts"]
    tau = 1 + counters["num_accepted_tokens"] / drafts if drafts else float("nan")
    print(f"spec decode: {drafts:.0f} drafts, {counters['num_draft_tokens']:.0f} draft tokens, "
          f"{counters['num_accepted_tokens']:.0f} accepted; mean acceptance length tau = {tau:.2f}")
    say("server stopped")
