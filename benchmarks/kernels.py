"""EAGLE-3 draft head on the GPU: the fork's kernel against upstream's form and the torch path.

At Kimi dimensions (hidden 7168, draft vocabulary 32000, target vocabulary 163840, bf16) and
T = 1, 8, 64, 256, 512, 1024 token rows, on fresh random inputs:

* correctness against a float64 reference (CPU): argmax target ids must be identical (bf16,
  fp16, fp32, and bf16 inputs full of ties); top-k (k = 8, temperature 0.8) ids identical and
  the probabilities' largest relative error;
* speed, median microseconds per call: upstream's form (scatter into a 163840-wide -inf
  tensor, then argmax), torch's draft argmax + d2t, the kernel (automatic block size and a
  sweep), torch's top-k path and the kernel's, and the 7168 x 32000 lm_head GEMM for scale.
  "graph" times replay a CUDA graph of 20 calls (GPU time, no Python), "eager" times a loop
  of calls as Python issues them. The logits stay in L2 between calls, as they are when the
  lm_head has just written them.

Writes ``OUT/kernels.json`` and ``OUT/kernels.md``. Usage (on the GPU host, after
``python3 -m kimi kernels build``; see benchmarks/kernels_gpu.sh):

    python3 benchmarks/kernels.py --out benchmarks/results [--host-build FILE] [--local-build FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

import torch

from kimi.errors import KimiError
from kimi.fork.fsutil import write_atomic
from kimi.kernels import build
from kimi.kernels import draft_head as dh
from kimi_lab.bench.results import write_json

ROOT = Path(__file__).resolve().parents[1]

HIDDEN, DRAFT_VOCAB, TARGET_VOCAB = 7168, 32000, 163840
TOPK = 8
TEMPERATURE = 0.8


def time_graph(fn: Callable[[], object], inner: int = 20, reps: int = 25) -> float:
    """Median microseconds per call, replaying a CUDA graph of ``inner`` calls ``reps`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / inner)
    del graph
    return statistics.median(times)


def time_eager(fn: Callable[[], object], calls: int = 100, reps: int = 7) -> float:
    """Median microseconds per call of a loop of ``calls`` eager calls (Python overhead included)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def timed(fn: Callable[[], object]) -> dict[str, float | str]:
    """Graph and eager medians; a function that cannot be captured keeps only eager."""
    out: dict[str, float | str] = {"eager_us": round(time_eager(fn), 2)}
    try:
        out["graph_us"] = round(time_graph(fn), 2)
    except RuntimeError as exc:  # e.g. an op that synchronises
        out["graph_error"] = str(exc).splitlines()[0]
        torch.cuda.synchronize()
    return out


def us(entry: dict) -> float:
    """The time compared: graph (GPU) time where there is one."""
    return float(entry.get("graph_us", entry["eager_us"]))


def make_d2t(generator: torch.Generator) -> torch.Tensor:
    targets = torch.randperm(TARGET_VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
    return (targets - torch.arange(DRAFT_VOCAB)).cuda()


def rel_err(probs: torch.Tensor, ref: torch.Tensor) -> float:
    return ((probs.detach().cpu().double() - ref).abs() / ref).max().item()


def check_shape(rows: int, d2t: torch.Tensor, generator: torch.Generator) -> dict:
    """Correctness at one T: every dtype, plus bf16 with many ties."""
    result: dict = {"argmax_ids_identical": True, "topk_ids_identical": True, "topk_max_rel_err": 0.0,
                    "argmax_equals_upstream": True, "cases": {}}
    cpu = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator, device="cuda")))
    cases = {str(dt).removeprefix("torch."): (torch.randn(rows, DRAFT_VOCAB, generator=cpu) * 4).to(dt)
             for dt in (torch.bfloat16, torch.float16, torch.float32)}
    cases["bfloat16_ties"] = torch.randint(-4, 4, (rows, DRAFT_VOCAB), generator=cpu).to(torch.bfloat16)
    for name, logits_cpu in cases.items():
        logits = logits_cpu.cuda()
        ids = dh.draft_argmax(logits, d2t, backend="cuda")
        _, ref_ids = dh.reference_topk(logits_cpu, d2t.cpu(), 1)
        same = torch.equal(ids.cpu(), ref_ids[:, 0])
        upstream = torch.equal(ids, dh.scatter_argmax_upstream(logits, d2t, TARGET_VOCAB))
        probs, tk_ids = dh.draft_topk(logits, d2t, TOPK, temperature=TEMPERATURE, backend="cuda")
        ref_p, ref_tk = dh.reference_topk(logits_cpu, d2t.cpu(), TOPK, temperature=TEMPERATURE)
        tk_same = torch.equal(tk_ids.cpu(), ref_tk)
        err = rel_err(probs, ref_p)
        torch_probs, _ = dh.draft_topk_torch(logits, d2t, TOPK, temperature=TEMPERATURE)
        result["cases"][name] = {"argmax_ids_identical": same, "argmax_equals_upstream": upstream,
                                 "topk_ids_identical": tk_same, "topk_max_rel_err": err,
                                 "torch_topk_max_rel_err": rel_err(torch_probs, ref_p)}
        result["argmax_ids_identical"] &= same
        result["argmax_equals_upstream"] &= upstream
        result["topk_ids_identical"] &= tk_same
        result["topk_max_rel_err"] = max(result["topk_max_rel_err"], err)
    return result


def time_shape(rows: int, d2t: torch.Tensor, weight: torch.Tensor, generator: torch.Generator) -> dict:
    logits = (torch.randn(rows, DRAFT_VOCAB, generator=generator, device="cuda") * 4).bfloat16()
    hidden = torch.randn(rows, HIDDEN, generator=generator, device="cuda").bfloat16()
    t: dict[str, dict] = {
        "lm_head_gemm": timed(lambda: torch.nn.functional.linear(hidden, weight)),
        "upstream_scatter_argmax": timed(lambda: dh.scatter_argmax_upstream(logits, d2t, TARGET_VOCAB)),
        "torch_argmax_d2t": timed(lambda: dh.draft_argmax_torch(logits, d2t)),
        "kernel_argmax": timed(lambda: dh.draft_argmax(logits, d2t, backend="cuda")),
        "torch_topk": timed(lambda: _torch_topk(logits, d2t)),
        "kernel_topk": timed(lambda: dh.draft_topk(logits, d2t, TOPK, temperature=TEMPERATURE, backend="cuda")),
    }
    sweep = {}
    for threads in (128, 256, 512, 1024):
        sweep[threads] = round(time_graph(lambda n=threads: dh.draft_argmax(logits, d2t, backend="cuda", threads=n)), 2)
    t["kernel_argmax_threads_sweep_graph_us"] = sweep  # type: ignore[assignment]
    return t


def _torch_topk(logits: torch.Tensor, d2t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain torch way to the same numbers (torch.topk; tie order unspecified)."""
    probs = torch.softmax(logits.float() / TEMPERATURE, dim=-1)
    top = torch.topk(probs, TOPK, dim=-1)
    return top.values, top.indices + d2t[top.indices]


def _read_json(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{path}: {exc}"}


def render_md(report: dict) -> str:
    cubins = ", ".join(report["cubins"]) or "not listed"
    how = report.get("cubins_error") or "cuobjdump --list-elf"
    builds = ", ".join(f"{k} {v}" for k, v in report["build_seconds"].items())
    lines = [
        "# EAGLE-3 draft head kernel (Kimi shapes)", "",
        f"{report['device']}, torch {report['torch']}, {report['date']}. Command: `{report['command']}`", "",
        f"Library: `{report['library']}`; cubins: {cubins} ({how}).", "",
        f"Build seconds: {builds}", "",
        "Median µs per call, CUDA-graph replay (GPU time); bf16 logits [T, 32000], d2t into 163840.", "",
        ("| T | lm_head GEMM | upstream scatter+argmax | torch argmax+d2t | kernel argmax | speed-up vs torch "
         "| vs upstream | torch top-8 | kernel top-8 | ids identical | top-8 max rel err |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rows, shape in report["shapes"].items():
        t, c = shape["times"], shape["correctness"]
        lines.append(
            f"| {rows} | {us(t['lm_head_gemm']):.1f} | {us(t['upstream_scatter_argmax']):.1f} "
            f"| {us(t['torch_argmax_d2t']):.1f} | {us(t['kernel_argmax']):.1f} | {shape['speedup_vs_torch']:.2f}x "
            f"| {shape['speedup_vs_upstream']:.2f}x | {us(t['torch_topk']):.1f} | {us(t['kernel_topk']):.1f} "
            f"| {c['argmax_ids_identical'] and c['topk_ids_identical']} | {c['topk_max_rel_err']:.2e} |")
    lines += ["", "Eager (Python-issued loop) µs per call:", "",
              "| T | upstream | torch argmax+d2t | kernel argmax | torch top-8 | kernel top-8 |",
              "|---|---|---|---|---|---|"]
    names = ("upstream_scatter_argmax", "torch_argmax_d2t", "kernel_argmax", "torch_topk", "kernel_topk")
    for rows, shape in report["shapes"].items():
        cells = " | ".join(f"{shape['times'][n]['eager_us']:.1f}" for n in names)
        lines.append(f"| {rows} | {cells} |")
    lines += ["", ("Correctness covers bf16, fp16, fp32 and bf16 inputs full of ties at every T against a float64 "
                   "CPU reference (ids by a stable descending sort; probabilities softmax(x / 0.8) in float64)."), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="output folder")
    parser.add_argument("--rows", default="1,8,64,256,512,1024", help="token rows T, comma-separated")
    parser.add_argument("--host-build", help="build.json of the build made on this host (kimi kernels build --json)")
    parser.add_argument("--local-build", help="build.json of a build made elsewhere (e.g. the 2-core dev machine)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        status = dh.kernel_status()
        if not status["available"]:
            raise KimiError(str(status["reason"]))
    except KimiError as exc:
        print(f"benchmarks/kernels.py: {exc}", file=sys.stderr)
        return 1
    library = Path(str(status["library"]))
    report: dict = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name(), "capability": "sm_{}{}".format(*torch.cuda.get_device_capability()),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "library": str(library),
        "cubins": [], "build_seconds": {}, "builds": {}, "shapes": {},
    }
    try:
        report["cubins"] = build.list_cubins(library)
        report["cuobjdump_list_elf"] = build.list_elf_text(library)
    except KimiError as exc:
        report["cubins_error"] = str(exc)
    for name, path in (("host", args.host_build), ("local", args.local_build),
                       ("loaded", str(library.parent / "build.json"))):
        info = _read_json(path)
        if info:
            report["builds"][name] = info
            if "seconds" in info:
                report["build_seconds"][f"{name} ({info.get('host', '?')}, nvcc {info.get('nvcc_release', '?')})"] = (
                    info["seconds"] if not info.get("cached") else f"{info['seconds']} (reused)")
    seed = int.from_bytes(os.urandom(4), "little")
    report["seed"] = seed
    generator = torch.Generator(device="cuda").manual_seed(seed)
    d2t = make_d2t(torch.Generator().manual_seed(seed))
    weight = torch.randn(DRAFT_VOCAB, HIDDEN, generator=generator, device="cuda").bfloat16() * 0.02
    for rows in (int(r) for r in args.rows.split(",")):
        correctness = check_shape(rows, d2t, generator)
        times = time_shape(rows, d2t, weight, generator)
        shape = {"correctness": correctness, "times": times,
                 "speedup_vs_torch": us(times["torch_argmax_d2t"]) / us(times["kernel_argmax"]),
                 "speedup_vs_upstream": us(times["upstream_scatter_argmax"]) / us(times["kernel_argmax"]),
                 "topk_speedup_vs_torch": us(times["torch_topk"]) / us(times["kernel_topk"])}
        report["shapes"][str(rows)] = shape
        print(f"T={rows}: ids identical {correctness['argmax_ids_identical']}/{correctness['topk_ids_identical']}, "
              f"top-k rel err {correctness['topk_max_rel_err']:.2e}, kernel {us(times['kernel_argmax']):.1f} us, "
              f"torch {us(times['torch_argmax_d2t']):.1f} us, upstream {us(times['upstream_scatter_argmax']):.1f} us, "
              f"GEMM {us(times['lm_head_gemm']):.1f} us", flush=True)
    shapes = report["shapes"]
    report["max_rel_err"] = {rows: s["correctness"]["topk_max_rel_err"] for rows, s in shapes.items()}
    report["ids_identical"] = {rows: s["correctness"]["argmax_ids_identical"] and s["correctness"]["topk_ids_identical"]
                               for rows, s in shapes.items()}
    report["speedup_vs_torch"] = {rows: round(s["speedup_vs_torch"], 3) for rows, s in shapes.items()}
    report["speedup_vs_upstream"] = {rows: round(s["speedup_vs_upstream"], 3) for rows, s in shapes.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "kernels.json", report)
    write_atomic(args.out / "kernels.md", render_md(report))
    ok = all(report["ids_identical"].values()) and max(report["max_rel_err"].values()) < 1e-5
    print(f"wrote {args.out / 'kernels.json'} and kernels.md; correct: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
