"""Start ``vllm serve``, talk to its OpenAI-compatible API and read its spec-decode counters.

Standard library only, so the ``kimi`` command can drive a server that runs in the fork's venv.
:func:`serve_args` writes an engine preset (``kimi.e2e.presets``) as ``vllm serve`` flags.
Endpoints used (vLLM's OpenAI server): ``GET /health``, ``POST /v1/completions``, ``GET /metrics``
(Prometheus text; the spec-decode counters are ``vllm:spec_decode_num_drafts_total``,
``vllm:spec_decode_num_draft_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_total``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError

#: Counter name in /metrics -> key in the returned dict.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}


#: The fork's chat template for models without one (the shipped pair and the reference models): ``vllm serve
#: --chat-template`` takes the path. Plain text, role-prefixed turns, tool calls and tool results rendered.
CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")


#: ``LLM(...)`` keyword -> ``vllm serve`` flag, in the order :func:`serve_args` writes them.
SERVE_FLAGS = {
    "dtype": "--dtype", "max_model_len": "--max-model-len", "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "seed": "--seed", "max_num_seqs": "--max-num-seqs", "speculative_config": "--speculative-config",
    "gpu_memory_utilization": "--gpu-memory-utilization", "enforce_eager": "--enforce-eager",
    "attention_config": "--attention-config",
}


def serve_args(engine: dict) -> list[str]:
    """``vllm serve`` flags for the ``LLM(...)`` settings ``engine`` (keys of :data:`SERVE_FLAGS` only, in its
    order): a dict value as JSON, True as the bare flag (False and None leave the flag out), others as text.

    Raises:
        ValueError: ``engine`` has a key that has no flag here.
    """
    unknown = set(engine) - set(SERVE_FLAGS)
    if unknown:
        raise ValueError(f"no vllm serve flag for {sorted(unknown)}")
    args: list[str] = []
    for key, flag in SERVE_FLAGS.items():
        value = engine.get(key)
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        else:
            args += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return args


def vllm_command() -> list[str]:
    """How to run the vLLM CLI this Python imports: ``python -m vllm.entrypoints.cli.main`` (what the ``vllm``
    script runs), so that a vLLM on ``PYTHONPATH`` (an install-into'd site) wins over a venv's own."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Reply:
    """One HTTP answer: ``status`` (int) and ``body`` (decoded text)."""

    status: int
    body: str

    def json(self) -> dict:
        return json.loads(self.body)


def request(url: str, body: bytes | None = None, timeout: float = 300.0) -> Reply:
    """GET ``url`` (or POST ``body`` as JSON); HTTP error statuses are returned, not raised.

    Raises:
        OSError: when the server cannot be reached.
    """
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return Reply(answer.status, answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.read().decode("utf-8", "replace"))


def metric_sums(metrics: str, names) -> dict[str, float]:
    """``{name: value}`` for each of ``names`` in a Prometheus ``/metrics`` text, summed over label sets (0 when
    absent)."""
    found = dict.fromkeys(names, 0.0)
    for line in metrics.splitlines():
        match = re.match(r"^([a-z_:]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if match and match.group(1) in found:
            found[match.group(1)] += float(match.group(2))
    return found


def spec_counters(metrics: str) -> dict[str, float]:
    """The spec-decode counters in a Prometheus ``/metrics`` text (keys of :data:`SPEC_COUNTERS`' values), summed
    over label sets (0 when absent)."""
    return {SPEC_COUNTERS[name]: value for name, value in metric_sums(metrics, SPEC_COUNTERS).items()}


def accepted_per_position(metrics: str) -> list[float]:
    """Accepted draft tokens at each draft position (``vllm:spec_decode_num_accepted_tokens_per_pos_total``,
    label ``position``) in a Prometheus ``/metrics`` text, summed over other labels; [] when absent."""
    found: dict[int, float] = {}
    for line in metrics.splitlines():
        match = re.match(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\}\s+'
                         r"([0-9.eE+-]+)$", line)
        if match:
            found[int(match.group(1))] = found.get(int(match.group(1)), 0.0) + float(match.group(2))
    return [found.get(i, 0.0) for i in range(max(found) + 1)] if found else []


class VllmServer:
    """``vllm serve MODEL ARGS...`` as a child process, stopped on exit from the ``with`` block.

    ``vllm`` is the CLI: a path to the ``vllm`` script or a command (:func:`vllm_command`). Output goes to
    ``log``; ``env`` is added to this process's environment; ``cwd`` is the child's folder (default: this
    process's). :meth:`start` waits until ``/health`` answers 200.

    Raises:
        KimiError: from :meth:`start` if the server exits or is not healthy within ``timeout`` seconds;
            the message carries the last lines of its log (a start-up error names its fix there).
    """

    def __init__(self, vllm: Path | list[str], model: str, args: list[str], log: Path, port: int | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = model
        head = [str(part) for part in vllm] if isinstance(vllm, list) else [str(vllm)]
        self.cmd = [*head, "serve", model, "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 600.0) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KimiError(f"vllm serve exited with status {self.proc.returncode} before it was ready:\n"
                                f"{self.log_tail()}\n(full log: {self.log})")
            try:
                if request(f"{self.base}/health", timeout=5).status == 200:
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise KimiError(f"vllm serve was not ready after {timeout:.0f} s:\n{self.log_tail()}\n(full log: {self.log})")

    def exit_status(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the process to end by itself; its status, or None if still running."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 25) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def complete(self, prompt: str | list[int], max_tokens: int, timeout: float = 300.0, **fields) -> Reply:
        """POST a greedy ``/v1/completions`` request for ``prompt`` (text or token ids); ``fields`` are added
        to the body (e.g. ``ignore_eos=True``, ``return_token_ids=True``).

        Raises:
            OSError: the server cannot be reached or does not answer within ``timeout``.
        """
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **fields}
        return request(f"{self.base}/v1/completions", json.dumps(body).encode(), timeout)

    def metrics(self) -> str:
        """The server's Prometheus ``/metrics`` text."""
        return request(f"{self.base}/metrics", timeout=30).body

    def counters(self) -> dict[str, float]:
        """:func:`spec_counters` of :meth:`metrics`."""
        return spec_counters(self.metrics())

    def stop(self) -> None:
        """SIGINT the server's process group, then SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
