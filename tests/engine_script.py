"""Test helper: reference models, and a script that runs vLLM engines in one subprocess and prints its result.

The engine tests of the patches run vLLM in a child process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine
in that process, so a traceback names the line) with this checkout and its lab (``lab/``, the package ``kimi_lab``)
and this folder on ``PYTHONPATH`` (a script may import this module's helpers); the script prints one line
``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ``PYTHONPATH`` of a child process that imports ``kimi``, ``kimi_lab`` and this module (pytest.ini's
#: ``pythonpath`` reaches only the pytest process itself).
CHILD_PATH = os.pathsep.join([str(ROOT), str(ROOT / "lab"), str(ROOT / "tests")])


def price_verification(most_ms: float) -> None:
    """In an engine script, before the engine starts: adaptive verification's cost curves are set, after its
    start-up profile, to drafting free and a target forward of 10 ms for one token rising to ``most_ms`` at the
    engine's token limit (10: verification priced flat, so the budget admits every draft it believes in; far
    above: no draft pays). The profiled curves vary with the machine's load; these do not."""
    import kimi.spec.adaptive

    profile = kimi.spec.adaptive.profile_eager_costs

    def priced(runner):
        profile(runner)
        if runner.adaptive_verification is not None:
            runner.adaptive_verification.set_cost_curves([(1, 0.0), (runner.max_num_reqs, 0.0)],
                                                         [(1, 10.0), (runner.max_num_tokens, most_ms)])

    kimi.spec.adaptive.profile_eager_costs = priced


def make_reference_models(dest: Path) -> Path:
    """``kimi models make DEST`` (seconds); returns ``dest``. Fails the test with kimi's message on error."""
    made = subprocess.run([sys.executable, "-m", "kimi", "models", "make", str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    return dest


def wrong_drafter(drafter: Path, dest: Path) -> Path:
    """A copy of the EAGLE-3 ``drafter`` folder at ``dest`` whose ``lm_head`` rows are rolled by half the draft
    vocabulary, so every draft is a token far from the drafter's guess, proposed as confidently as before (drafts
    that fail: with the shipped pair verifying every draft of two code prompts x 48 tokens, none of 282 is
    accepted; a roll by one, the guess's next id, let one of 279 through). Returns ``dest``."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, dest)
    weights = load_file(dest / "model.safetensors")
    rows = weights["lm_head.weight"]
    weights["lm_head.weight"] = torch.roll(rows, rows.shape[0] // 2, dims=0).contiguous()
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def run_engine_script(script: str, *args: str, env: dict[str, str | None] | None = None, timeout: int = 1200) -> dict:
    """Run ``python -c script args...`` and return the JSON of its last ``RESULT`` line.

    ``env`` entries override this process's environment (None: the variable is removed). Fails the test with the
    end of the child's output when it exits non-zero or prints no result.
    """
    full = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": CHILD_PATH, **(env or {})}
    full = {key: value for key, value in full.items() if value is not None}
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=full, capture_output=True,
                            text=True, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (result.stdout + result.stderr)[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


#: A stand-in for vLLM's offline API, enough for the benchmark scripts' worker side (``kimi_lab.bench``): greedy
#: "tokens" that depend on the prompt only (so speculation is lossless), spec-decode counters that grow with
#: each speculative batch (tau 2), logprobs, ``collective_rpc`` on a runner without the timed methods.
FAKE_VLLM = '''
import types

__version__ = "0.0.0+kimi.fake"


class SamplingParams:
    def __init__(self, max_tokens=16, logprobs=None, **kw):
        self.max_tokens, self.logprobs = max_tokens, logprobs


class _Metric:
    def __init__(self, name, value):
        self.name, self.value = name, value


class LLM:
    def __init__(self, model, speculative_config=None, disable_log_stats=True, **engine):
        self.spec, self.counts = speculative_config, [0.0, 0.0, 0.0]
        config = types.SimpleNamespace(use_v2_model_runner=False, speculative_config=None)
        self.llm_engine = types.SimpleNamespace(vllm_config=config,
                                                engine_core=types.SimpleNamespace(shutdown=lambda: None))

    def generate(self, requests, params, use_tqdm=True):
        outputs = []
        for request in requests:
            ids = request.get("prompt_token_ids") or [len(request.get("prompt", ""))]
            tokens = [(sum(ids) + 7 * i) % 97 for i in range(params.max_tokens)]
            logprobs = [{t: types.SimpleNamespace(logprob=-0.1), t + 1: types.SimpleNamespace(logprob=-2.0)}
                        for t in tokens] if params.logprobs else None
            outputs.append(types.SimpleNamespace(prompt_token_ids=ids, outputs=[
                types.SimpleNamespace(token_ids=tokens, logprobs=logprobs)]))
            if self.spec:
                k = self.spec["num_speculative_tokens"]
                drafts = params.max_tokens / 2
                self.counts = [self.counts[0] + drafts, self.counts[1] + k * drafts, self.counts[2] + drafts]
        return outputs

    def get_metrics(self):
        names = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
        return [_Metric(name, value) for name, value in zip(names, self.counts)]

    def collective_rpc(self, fn):
        worker = getattr(self, "_worker", None) or types.SimpleNamespace(model_runner=types.SimpleNamespace())
        self._worker = worker
        return [fn(worker)]
'''

#: ``python -m vllm.entrypoints.cli.main serve MODEL --host H --port P ...`` of the stand-in: an HTTP server with
#: ``/health``, ``/v1/completions`` (the tokens :data:`FAKE_VLLM` gives offline) and ``/metrics``.
FAKE_SERVE = '''
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = sys.argv[1:]
DRAFTS = [0]


class Handler(BaseHTTPRequestHandler):
    def reply(self, status, text):
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/metrics":
            self.reply(200, f"vllm:spec_decode_num_drafts_total{{engine=\\"0\\"}} {DRAFTS[0]}\\n")
        else:
            self.reply(200, "ok")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = body["prompt"]
        tokens = [(sum(ids) + 7 * i) % 97 for i in range(body["max_tokens"])]
        DRAFTS[0] += 1
        self.reply(200, json.dumps({"choices": [{"text": "x", "token_ids": tokens}],
                                    "usage": {"completion_tokens": len(tokens)}}))


if __name__ == "__main__":
    assert ARGS[0] == "serve", ARGS
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the caller ignores SIGINT
    port = int(ARGS[ARGS.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''

FAKE_TORCH = '''
__version__ = "0.0.0+fake"


class cuda:
    @staticmethod
    def is_available():
        return False
'''


def fake_vllm_site(dest: Path) -> Path:
    """A folder holding the stand-ins ``vllm`` (:data:`FAKE_VLLM`, :data:`FAKE_SERVE`) and ``torch``, to put first
    on a benchmark worker's ``PYTHONPATH``; returns ``dest``."""
    files = {"vllm/__init__.py": FAKE_VLLM, "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/cli/__init__.py": "",
             "vllm/entrypoints/cli/main.py": FAKE_SERVE, "torch/__init__.py": FAKE_TORCH}
    for name, text in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    return dest


def tiny_tokenizer(path: Path) -> Path:
    """A byte-level BPE ``tokenizer.json`` of 300 tokens at ``path`` (needs ``tokenizers``); returns ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path
