"""Soak of ``vllm serve`` under kept and aborted streams (issue 44): does resident memory plateau, and whose is it.

Run in the fork's venv on CPU::

    .venv/bin/python benchmarks/soak.py [--rounds 40] [--pair models/pair] [--out benchmarks/results]

Two servers, one after the other (never at once): the shipped pair with its EAGLE-3 drafter at k = 3
(``eagle3``), then the same target without speculation (``nospec``); each with
:data:`kimi.e2e.presets.CPU_SERVE`, seed 0, eager, 16 sequences at most. Per round, 8 streaming completions read
to the end (48 tokens, greedy) and 8 closed after 3 chunks (of up to 256), all at once, through ``AsyncOpenAI``;
after it, once the server is idle, the RSS (``VmRSS``) and PSS (``smaps_rollup``) of the server's process tree,
in MB (10^6 bytes). Verdict: a curve plateaus when its second half grew less than 10 % of its first half (or
less than 8 MB); EAGLE-3's own growth is eagle3's minus nospec's. The kept streams' texts are compared between
the two engines round by round (greedy, temperature 0).

Writes ``soak.json`` and ``soak.md`` to ``--out`` (``--render soak.json``: the markdown again from a result).
The logic is ``kimi_lab.bench.soak``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.e2e.presets import CPU_SERVE
from kimi.e2e.server import VllmServer, serve_args, vllm_command
from kimi_lab.bench import soak
from kimi_lab.bench.hardware import cpu_name
from kimi_lab.bench.results import header, stamp, write_json, write_lines

ROOT = Path(__file__).resolve().parents[1]
#: Seconds the server keeps idle HTTP connections (longer than httpx's pool; see kimi_lab.bench.robustness).
SERVER_ENV = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "75"}


def engine_args(pair: Path, spec: bool) -> list[str]:
    """``vllm serve`` flags of one soak server: CPU_SERVE, seed 0, eager, 16 sequences; EAGLE-3 k = 3 if ``spec``."""
    engine = {**CPU_SERVE, "seed": 0, "max_num_seqs": 16, "enforce_eager": True,
              "speculative_config": ({"method": "eagle3", "model": str(pair / "drafter"), "num_speculative_tokens": 3}
                                     if spec else None)}
    return serve_args(engine)


def run_engine(name: str, pair: Path, args, logs: Path) -> dict:
    server = VllmServer(vllm_command(), str(pair / "target"), engine_args(pair, name == "eagle3"),
                        logs / f"soak-{name}.log", env=SERVER_ENV)
    with server:
        start = time.monotonic()
        server.start(timeout=900)
        print(f"{name}: server up in {time.monotonic() - start:.0f} s (pid {server.proc.pid})", flush=True)
        got = soak.soak(server, args.rounds, args.kept, args.aborted, args.kept_tokens, args.aborted_tokens,
                        args.abort_after, log=lambda m: print(f"{name}: {m}", flush=True))
        got["root_pid"] = server.proc.pid
        got["startup_s"] = round(time.monotonic() - start - sum(r["seconds"] + r["idle_s"] for r in got["rounds"]), 1)
    return got


def analyse(result: dict) -> None:
    """Add to ``result`` the curves (MB per round: tree RSS, tree PSS, each process's RSS), their growth and
    verdict (``kimi_lab.bench.soak.verdict``) per engine, and the verdict on the tree RSS of both engines."""
    result["curves"], result["growth"] = {}, {}
    for name, got in result["engines"].items():
        rows = got["rounds"]
        curves = {"rss": [r["rss_mb"] for r in rows]}
        if all(r["pss_mb"] is not None for r in rows):
            curves["pss"] = [r["pss_mb"] for r in rows]
        curves.update(soak.role_curves(rows, got["root_pid"]))
        result["curves"][name] = curves
        result["growth"][name] = {k: soak.verdict({k: c})["engines"][k] for k, c in curves.items()}
    result["verdict"] = soak.verdict({n: c["rss"] for n, c in result["curves"].items()})


def write_results(out: Path, result: dict) -> None:
    """``soak.json`` and ``soak.md`` in ``out`` (atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "soak.json", result)
    v = result["versions"]
    engines = result["engines"]
    lines = [*header("Soak: resident memory under kept and aborted streams (issue 44)", result["command"],
                     result["date"]),
             f"- CPU: {result['cpu']} ({result['cpus']} CPUs)",
             f"- versions: vLLM {v['vllm']}, torch {v['torch']}, openai {v['openai']}, Python {v['python']}",
             (f"- per round: {result['kept']} streams read to the end ({result['kept_tokens']} tokens, greedy) + "
              f"{result['aborted']} closed after {result['abort_after']} chunks, at once; memory read once idle"),
             ("- RSS and PSS in MB (10^6 bytes), the whole process tree of `vllm serve` (API server + engine core); "
              "round 0 = after start-up"), ""]
    names = list(engines)
    lines += ["| round | " + " | ".join(f"{n} RSS | {n} PSS | {n} s" for n in names) + " |",
              "|---" * (1 + 3 * len(names)) + "|"]
    rounds = result["rounds"]
    every = max(5, rounds // 12 // 5 * 5)
    shown = sorted({0, 1, rounds, *range(every, rounds + 1, every)})
    for r in shown:
        cells = []
        for n in names:
            row = engines[n]["rounds"][r]
            pss = "" if row["pss_mb"] is None else f"{row['pss_mb']:.1f}"
            cells += [f"{row['rss_mb']:.1f}", pss, f"{row['seconds']:.1f}"]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    verdict = result["verdict"]
    lines += ["", (f"Growth (MB): start-up to round 1, then the two halves of rounds 1-{rounds}; plateau = second "
                   f"half < {verdict['share']:.0%} of the first or < {verdict['floor_mb']:.0f} MB."), "",
              "| engine | process | start-up | after round 1 | end | warm-up | first half | second half | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        labels = {"rss": "tree RSS", "pss": "tree PSS", "api_server": "API server RSS"}
        for key, curve in result["curves"][n].items():
            g = result["growth"][n][key]
            label = labels.get(key, f"`{key}` RSS")
            state = "plateaus" if g["plateaus"] else "still growing"
            lines.append(f"| {n} | {label} | {curve[0]:.1f} | {curve[1]:.1f} | {curve[-1]:.1f} | {g['warmup']:+.1f} | "
                         f"{g['first']:+.1f} | {g['second']:+.1f} | {state} |")
    lines += ["", "Verdict (tree RSS):", "", *[f"- {t}" for t in verdict["text"]]]
    for n in names:
        procs = {k: g for k, g in result["growth"][n].items() if k not in ("rss", "pss")}
        top = max(procs, key=lambda k: procs[k]["total"])
        curve = result["curves"][n]["rss"]
        step = max(1, rounds // 6)
        steps = ", ".join(f"{curve[i] - curve[i - step]:+.0f}" for i in range(step, rounds + 1, step))
        lines.append(f"- {n}: the process that grew is `{top}` ({procs[top]['total']:+.1f} MB over rounds 1-{rounds} "
                     f"of the tree's {result['growth'][n]['rss']['total']:+.1f}); tree RSS per {step} rounds from "
                     f"start-up: {steps} MB")
    same = result["kept_identical"]
    lines += [(f"- kept streams identical between engines: {same['identical']}/{same['total']} "
               f"(first round: {same['first_round']})"), ""]
    write_lines(out / "soak.md", lines)
    print("\n".join(lines))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--pair", type=Path, default=ROOT / "models" / "pair")
    parser.add_argument("--engines", nargs="+", default=["eagle3", "nospec"], choices=["eagle3", "nospec"])
    parser.add_argument("--kept", type=int, default=8)
    parser.add_argument("--aborted", type=int, default=8)
    parser.add_argument("--kept-tokens", type=int, default=48)
    parser.add_argument("--aborted-tokens", type=int, default=256)
    parser.add_argument("--abort-after", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/kimi-soak"))
    parser.add_argument("--render", type=Path, help="write soak.md again from this soak.json (no servers)")
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        analyse(result)
        write_results(args.out, result)
        return 0
    import openai
    import torch
    import vllm

    result = {**stamp("benchmarks/soak.py", argv, ".venv/bin/python"), "cpu": cpu_name(),
              "cpus": len(__import__("os").sched_getaffinity(0)),
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "openai": openai.__version__,
                           "python": platform.python_version()},
              "rounds": args.rounds, "kept": args.kept, "aborted": args.aborted, "kept_tokens": args.kept_tokens,
              "aborted_tokens": args.aborted_tokens, "abort_after": args.abort_after, "engines": {}}
    texts = {}
    for name in args.engines:
        got = run_engine(name, args.pair, args, args.logs)
        texts[name] = got.pop("kept_texts")
        result["engines"][name] = got
    analyse(result)
    if len(texts) == 2:
        a, b = texts.values()
        pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
        first = sum(x == y for x, y in zip(a[0], b[0], strict=True))
        result["kept_identical"] = {"identical": sum(x == y for x, y in pairs), "total": len(pairs),
                                    "first_round": f"{first}/{len(a[0])}"}
    else:
        result["kept_identical"] = {"identical": None, "total": 0, "first_round": "one engine only"}
    result["kept_texts_round1"] = {n: t[0] for n, t in texts.items()}
    write_results(args.out, result)
    print(json.dumps(result["verdict"]["text"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
