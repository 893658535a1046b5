"""Test helper: reference models, and a script that runs vLLM engines in one subprocess and prints its result.

The engine tests of the patches run vLLM in a child process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine
in that process, so a traceback names the line) with this checkout on ``PYTHONPATH``; the script prints one line
``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_reference_models(dest: Path) -> Path:
    """``kimi models make DEST`` (seconds); returns ``dest``. Fails the test with kimi's message on error."""
    made = subprocess.run([sys.executable, "-m", "kimi", "models", "make", str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    return dest


def run_engine_script(script: str, *args: str, env: dict[str, str] | None = None, timeout: int = 1200) -> dict:
    """Run ``python -c script args...`` and return the JSON of its last ``RESULT`` line.

    Fails the test with the end of the child's output when it exits non-zero or prints no result.
    """
    full = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=full, capture_output=True,
                            text=True, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (result.stdout + result.stderr)[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
