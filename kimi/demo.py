"""``kimi demo``: the README's main command, the fork's main job end to end on the project's own models.

1. ``kimi setup`` (skipped when the venv already holds this tree);
2. the models: by default the shipped reference pair (``models/pair``: a Python-trained
   DeepSeek-V3-architecture target and its EAGLE-3 drafter, tracked in the repository, checked against its
   MANIFEST's sha256s; nothing is trained); with ``--models reference`` the random-weight reference models
   (``kimi models make`` into ``.kimi/models/reference`` when missing);
3. ``vllm serve <target> --speculative-config '{"method": "eagle3", ...}'`` (log under ``.kimi/logs/``);
4. greedy completion requests (OpenAI API) with real code prompts: held-out standard-library code the
   tokenizer and the models never saw; each prompt is printed with its completion, then the spec-decode
   counters from ``/metrics``: mean acceptance length τ = 1 + accepted / drafts and the acceptance rate at
   each draft position;
5. the server is stopped (also on Ctrl-C or an error).

Works without a GPU: MLA runs on vLLM's CPU backend through patch 0006 (``kimi.cpu_mla``).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kimi.devenv import ensure_env, line_kernels
from kimi.e2e.server import VllmServer, accepted_per_position, spec_counters
from kimi.errors import KimiError
from kimi.fork.layout import Layout
from kimi.log import sayer
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompts
from kimi.models.shipped import check_pair

#: CPU-friendly serving settings: a 1 GiB KV cache (the CPU backend would otherwise reserve most of the
#: host's memory), a short context.
SERVE_ARGS = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(1 << 30)]

#: On CPU the models are served in float32, as ``benchmarks/acceptance.py`` measures them.
CPU_SERVE_ARGS = ["--dtype", "float32"]

MODELS = ("trained", "reference")


say = sayer("demo")


@dataclass(frozen=True)
class DemoModels:
    """What the demo serves: folders, how to make them when missing, and a line about what to expect."""

    folder: Path
    target: Path
    drafter: Path
    make: list[str] | None  # `python -m kimi ...` arguments that make ``folder``; None: shipped, checked instead
    about: str


def demo_models(layout: Layout, models: str, drafter: str | None) -> DemoModels:
    """The folders of ``models`` (``trained`` or ``reference``) and the drafter to serve.

    Raises:
        KimiError: an unknown ``models``, or a drafter style the trained pair does not have.
    """
    if models == "trained":
        if drafter not in (None, "llama"):
            raise KimiError(f"the trained pair has a Llama-style drafter only; --drafter {drafter} is for "
                            "--models reference")
        return DemoModels(SHIPPED_PAIR, SHIPPED_PAIR / "target", SHIPPED_PAIR / "drafter", None,
                          "the shipped reference pair (Python-trained target and its EAGLE-3 drafter)")
    if models == "reference":
        folder = layout.private / "models" / "reference"
        return DemoModels(folder, folder / "target", folder / f"drafter-{drafter or 'mla'}",
                          ["models", "make", str(folder)],
                          "the random-weight reference models (the completion is not meaningful, tau stays near 1)")
    raise KimiError(f"--models must be one of {', '.join(MODELS)}, not {models!r}")


def acceptance(metrics: str, k: int) -> dict:
    """τ and per-position acceptance from a ``/metrics`` text.

    Returns:
        {"drafts", "draft_tokens", "accepted": floats, "tau": float (nan without drafts), "per_position": [k]
        floats (accepted at position i / drafts; [] where the server does not report positions)}.
    """
    counters = spec_counters(metrics)
    drafts = counters["num_drafts"]
    per_pos = accepted_per_position(metrics)
    return {"drafts": drafts, "draft_tokens": counters["num_draft_tokens"],
            "accepted": counters["num_accepted_tokens"],
            "tau": 1 + counters["num_accepted_tokens"] / drafts if drafts else float("nan"),
            "per_position": [(per_pos + [0.0] * k)[i] / drafts for i in range(k)] if drafts and per_pos else []}


def demo(layout: Layout, line: str, venv: Path | None = None, kernels: str = "auto", from_dir: Path | None = None,
         drafter: str | None = None, k: int = 3, max_tokens: int = 64, models: str = "trained",
         prompts: int = 3) -> dict:
    """Set up, make or train the models, serve the target with an EAGLE-3 drafter, ask, print, stop.

    Args:
        drafter: ``mla`` or ``llama`` for the reference models (default ``mla``); the trained pair has ``llama``.
        k: draft tokens per step; max_tokens: completion length per prompt; prompts: how many code prompts.

    Returns:
        :func:`acceptance` of the run.

    Raises:
        KimiError: a step fails (set-up, training or model generation, a server that does not start, a failed
            request); the message names the step and the log to read.
    """
    chosen = demo_models(layout, models, drafter)
    if chosen.make is None:  # checked before the set-up's minutes
        manifest = check_pair(chosen.folder)
        say(f"serving {chosen.about} from {chosen.folder} (files match its MANIFEST.json; target held-out loss "
            f"{manifest.get('target_heldout_loss', '?')} nats/token)")
    python = ensure_env(layout, line, venv, kernels, from_dir)
    if chosen.make is not None and not (chosen.folder / "MANIFEST.json").is_file():
        say(f"making the reference models in {chosen.folder}")
        made = subprocess.run([str(python), "-m", "kimi", *chosen.make], cwd=layout.root)
        if made.returncode != 0:
            raise KimiError(f"`kimi {' '.join(chosen.make)}` failed (exit {made.returncode}); its output is above")
    spec = {"method": "eagle3", "model": str(chosen.drafter), "num_speculative_tokens": k}
    log = layout.private / "logs" / "demo-serve.log"
    args = [*SERVE_ARGS, *(CPU_SERVE_ARGS if line_kernels(layout, line, kernels) != "cuda" else []),
            "--speculative-config", json.dumps(spec)]
    server = VllmServer(python.with_name("vllm"), str(chosen.target), args, log)
    say(f"serving {chosen.about}: `vllm serve {chosen.target}` with the EAGLE-3 drafter {chosen.drafter}, k = {k} "
        f"(log: {log}; start-up loads and warms up the model, a minute or two on a small CPU)")
    texts = code_prompts(prompts)
    with server:
        started = time.monotonic()
        server.start()
        say(f"server ready in {time.monotonic() - started:.0f} s at {server.base}")
        for i, prompt in enumerate(texts, 1):
            started = time.monotonic()
            reply = server.complete(prompt, max_tokens)
            if reply.status != 200:
                raise KimiError(f"the completion request failed with HTTP {reply.status}: {reply.body[:500]}")
            answer = reply.json()
            text, generated = answer["choices"][0]["text"], answer.get("usage", {}).get("completion_tokens", "?")
            print(f"--- prompt {i} of {len(texts)} (held-out standard library code) ---\n{prompt}"
                  f"--- completion ({generated} tokens, {time.monotonic() - started:.1f} s) ---\n{text}\n---",
                  flush=True)
        result = acceptance(server.metrics(), k)
    per_pos = ", ".join(f"{p:.2f}" for p in result["per_position"]) or "not reported"
    print(f"spec decode: {result['drafts']:.0f} drafts, {result['draft_tokens']:.0f} draft tokens, "
          f"{result['accepted']:.0f} accepted; mean acceptance length tau = {result['tau']:.2f} (k = {k}; at most "
          f"{k + 1}); acceptance per draft position: {per_pos}")
    say("server stopped")
    return result
