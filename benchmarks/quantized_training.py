"""A drafter trained against the quantized target that is served, on one GPU (issue 22, item 3).

    python3 benchmarks/quantized_training.py --out benchmarks/results        # on a GPU host with the fork

The shipped pair's target is rewritten as ``--scheme`` (``kimi models quantize``; INT4 routed experts by default,
Kimi-K2.5's layout), then ``kimi train`` runs as a user runs it, one command per step
(``kimi_lab.bench.quantized_training.plan``): answers and captured states of each target, the bf16 target captured on
the quantized target's samples (the states compared token by token), the shipped drafter fine-tuned on each, and
served τ of each drafter on the quantized target. vLLM's CPU backend runs neither quantized layout (the fork refuses
them at start, patch 0016), so this runs on a GPU only. The shipped pair's block-FP8 target runs on no GPU kernel of
vLLM 0.32.0 (its widths allow 16 x 16 blocks; ``kimi.models.quantize.fp8_gpu_refusal``): a block-FP8 run needs the
widened pair (``kimi models widen``), which this script does not take yet.

Writes ``quantized_training.json`` and ``.md`` under ``--out`` (rewritten after every step) and every step's output
under ``<scratch>/logs``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi_lab.bench.hardware import describe, device
from kimi_lab.bench.quantized_training import Settings, compare_captures, markdown, plan
from kimi_lab.bench.results import stamp, write_json, write_lines

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", type=Path, default=ROOT / "models" / "pair", help="the reference pair")
    p.add_argument("--scheme", choices=("int4-experts",), default=d.scheme)
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="answers regenerated per target")
    p.add_argument("--epochs", type=int, default=d.epochs, help="fine-tuning epochs")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts, help="held-out prompts of the served τ")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens)
    p.add_argument("--scratch", type=Path, default=Path("/tmp/quantized-training"))
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    made = stamp("benchmarks/quantized_training.py", argv if argv is not None else sys.argv[1:])
    settings = Settings(scheme=args.scheme, num_prompts=args.num_prompts, epochs=args.epochs,
                        eval_prompts=args.eval_prompts, eval_tokens=args.eval_tokens)
    from kimi.models.quantize import quantize_target

    logs = args.scratch / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    bf16, quantized = args.pair / "target", args.scratch / "targets" / args.scheme
    quantize_target(bf16, quantized, args.scheme, force=True)
    result = {**made, "device": None, "vllm_version": None, "settings": asdict(settings),
              "targets": {"bf16": str(bf16), args.scheme: str(quantized)}, "steps": {}, "served": [],
              "capture_comparison": None}

    def save() -> None:
        write_json(args.out / "quantized_training.json", result)
        write_lines(args.out / "quantized_training.md", markdown(result))

    for step in plan(settings, args.scratch, bf16, quantized, args.pair / "drafter"):
        if step.samples_from is not None:
            step.work.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(step.samples_from / "samples.jsonl", step.work / "samples.jsonl")
        log = logs / f"{step.name}.log"
        print(f"quantized_training: {step.name}: python3 -m kimi {' '.join(step.args)}", flush=True)
        t0 = time.monotonic()
        with open(log, "w") as fh:
            rc = subprocess.run([sys.executable, "-m", "kimi", *step.args], cwd=ROOT, stdout=fh,
                                stderr=subprocess.STDOUT).returncode
        result["steps"][step.name] = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "log": str(log)}
        if rc == 0 and step.served:
            served = json.loads((step.work / "report" / "served.json").read_text())
            result["served"].append({"drafter": step.served[0], "target": step.served[1],
                                     "tau": round(served["tau"], 3),
                                     "per_position": [round(x, 3) for x in served["per_position"]]})
        if rc == 0 and step.samples_from is not None:  # the bf16 target captured on the quantized one's samples
            result["capture_comparison"] = compare_captures(step.samples_from / "capture", step.work / "capture")
        print(f"quantized_training: {step.name}: exit {rc} after {result['steps'][step.name]['seconds']} s",
              flush=True)
        save()
    version = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, cwd=ROOT)
    result["vllm_version"] = version.stdout.strip() or None
    result["device"] = describe(device(), versions=True)
    save()
    return 0 if all(s["rc"] == 0 for s in result["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
