"""The engines of a perf_vs_upstream call, in order, and the environment each one's worker runs in."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from kimi.e2e.presets import PERF_CPU_SMOKE, PERF_GPU, PERF_PAIR_KV_BYTES, PERF_SIDE_BY_SIDE, PERF_SLICE
from kimi.errors import KimiError
from kimi.models.kimi_slice import SPEC_LAYERS
from kimi_lab.bench.workers import kimi_path, worker_env

CONCURRENCY = (1, 4, 16, 64)
PAIR_KS = (1, 2, 3, 5)
SLICE_KS = (3,)
#: The runners a fork engine can be held on (variant ``fork_{runner}``) and their ``VLLM_USE_V2_MODEL_RUNNER``;
#: the other variants take their vLLM's default runner (the fork: V2 for these targets, patch 0013; upstream:
#: V1). The check engine is held on V1 (its count needs it).
HELD_RUNNERS = {"v1": "0", "v2": "1"}


def add_side_by_side_options(p: argparse.ArgumentParser, results: Path, pair_help: str) -> None:
    """The options of a fork-against-upstream benchmark (``perf_vs_upstream.py``, ``quantized.py``): ``--out``
    (default ``results``), ``--upstream-site``, ``--fork-site`` (checked by :func:`kimi_lab.bench.workers.site_errors`)
    and ``--pair`` (default the shipped pair)."""
    from kimi.models import SHIPPED_PAIR

    p.add_argument("--out", type=Path, default=results)
    p.add_argument("--upstream-site", type=Path, help="folder holding upstream vLLM's pristine `vllm` package")
    p.add_argument("--fork-site", type=Path, help="folder holding the fork's `vllm` (install-into'd site)")
    p.add_argument("--pair", type=Path, default=SHIPPED_PAIR, help=pair_help)


def add_turn_options(p: argparse.ArgumentParser, when: str) -> None:
    """The options of measuring engines started side by side in turns (:mod:`kimi_lab.bench.perf.orchestrate`);
    ``when`` says in the help when they act (e.g. ``with --parallel-start``). Checked by :func:`turn_errors`."""
    p.add_argument("--pin", nargs="?", const="shares", choices=["shares", "cores"],
                   help=f"{when}: each engine (its processes) held to CPUs, taskset-like: its own whole physical "
                        "cores (shares, the default), or one thread of every core, the same CPUs for all engines, "
                        "which measure one at a time (cores: no two busy threads share a core's SMT siblings)")
    p.add_argument("--turns", choices=["engine", "concurrency"], default="engine",
                   help=f"{when}: what one engine measures at its turn: every concurrency (engine) or one, the "
                        "engines taking turns at each concurrency before the next (concurrency: the rates compared "
                        "are seconds apart)")
    p.add_argument("--rewarm-tokens", type=int, metavar="N",
                   help=f"{when}: output tokens of the warm-up batch before every measurement of a concurrency but "
                        "its first (the first warms up with the full length: every batch shape); at least 2 (one "
                        "decode step), at most --tokens; default: the full length")


def turn_errors(args: argparse.Namespace, parallel: bool) -> list[str]:
    """What is wrong with :func:`add_turn_options`' options and ``args.concurrency`` (an empty list: nothing);
    ``parallel``: the engines are measured in turns (else the turn options have nothing to act on)."""
    errors = []
    if not parallel:
        given = {"--pin": args.pin, "--turns": args.turns != "engine", "--rewarm-tokens": args.rewarm_tokens}
        errors += [f"{flag} acts on the turns of --parallel-start; add --parallel-start or leave out {flag}"
                   for flag, value in given.items() if value]
    if args.rewarm_tokens is not None and not 2 <= args.rewarm_tokens <= args.tokens:
        errors.append(f"--rewarm-tokens must be between 2 (one decode step) and --tokens ({args.tokens}), "
                      f"got {args.rewarm_tokens}")
    twice = sorted({c for c in args.concurrency if args.concurrency.count(c) > 1})
    if twice:
        errors.append(f"--concurrency lists {twice} more than once; give each concurrency once")
    return errors


def engine_settings(cpu_smoke: bool, concurrency: list[int]) -> dict:
    """The ``LLM(...)`` settings every engine of a call shares (``kimi.e2e.presets``): on a GPU room for the
    largest concurrency."""
    return dict(PERF_CPU_SMOKE) if cpu_smoke else {**PERF_GPU, "max_num_seqs": max(concurrency)}


def inputs(args: argparse.Namespace) -> tuple[list[list[int]] | None, dict[str, str] | None]:
    """(the pair's prompts, the Kimi slice's folders), for the models of ``args.models`` (None for the others).

    Raises:
        KimiError: no trained pair in ``args.pair``, or too few held-out prompts.
    """
    pair_prompts = slice_dirs = None
    if "pair" in args.models:
        from kimi.models.prompts import code_prompt_ids

        if not (args.pair / "MANIFEST.json").is_file():
            raise KimiError(f"no trained pair in {args.pair} (python3 -m kimi models train-pair)")
        # the held-out files give about 50 prompts: larger batches repeat them (prefix caching is off)
        pair_prompts = code_prompt_ids(args.pair / "target" / "tokenizer.json", min(max(args.concurrency), 48), 256)
    if "kimi_slice" in args.models:
        from kimi.models.kimi_slice import KIMI, TINY, write_slice

        slice_dirs = write_slice(args.scratch / "kimi-slice", layers=(SPEC_LAYERS - 1, SPEC_LAYERS),
                                 dims=TINY if args.cpu_smoke else KIMI)
    return pair_prompts, slice_dirs


def plan(args: argparse.Namespace, pair_prompts: list[list[int]] | None,
         slice_dirs: dict[str, str] | None) -> list[dict]:
    """The engines to run, in order (those named by ``--engines`` only, when given). Per model: the baseline,
    then by k (3 first) upstream and fork (and the fork held on a runner where k is in ``--v1-ks`` / ``--v2-ks``),
    the check engine after k = 3; for the slice the shallower baseline of the projection comes right after the
    first fork engine. Adds the CUDA-graph sizes measured to ``args.engine`` (on a GPU).

    Raises:
        SystemExit: ``--engines`` names an engine that is not in the plan.
    """
    base = {"concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps,
            "rewarm_tokens": args.rewarm_tokens}
    if not args.cpu_smoke:
        # CUDA graphs for exactly the batch sizes measured (decode c, verification c (k + 1)), the same for every
        # variant: vLLM's default list (up to 512 sizes' worth of captures per engine) costs minutes per start
        sizes = sorted({c * (k + 1) for c in args.concurrency for k in {0, *args.ks, *args.slice_ks}})
        args.engine = {**args.engine, "compilation_config": {"cudagraph_capture_sizes": sizes}}
    jobs: list[dict] = []
    if pair_prompts is not None:
        # a fixed KV cache skips vLLM's memory profiling; the low utilization is only the start-up check of free
        # memory, so that engines started side by side (--parallel-start) pass it
        small = {} if args.cpu_smoke else PERF_SIDE_BY_SIDE
        common = {**base, "model": "pair", "prompts": pair_prompts, "target": str(args.pair / "target"),
                  "engine": {**args.engine, "kv_cache_memory_bytes": PERF_PAIR_KV_BYTES, **small}}
        jobs += model_jobs(args, common, str(args.pair / "drafter"), args.ks)
    if slice_dirs is not None:
        vocab = json.loads(Path(slice_dirs["drafter"], "config.json").read_text())["draft_vocab_size"]
        # random weights: any ids do; 96..159 tokens each, inside the draft vocabulary (d2t is the identity)
        prompts = [[(7919 * i + 104729 * j) % (vocab - 2) + 2 for j in range(96 + (i * 13) % 64)]
                   for i in range(max(args.concurrency))]
        common = {**base, "model": "kimi_slice", "prompts": prompts, "tokens": args.slice_tokens,
                  "target": slice_dirs[f"target-L{SPEC_LAYERS}"],
                  "engine": {**args.engine, **PERF_SLICE, "kv_cache_memory_bytes": args.slice_kv_gib << 30}}
        slice_jobs = model_jobs(args, common, slice_dirs["drafter"], args.slice_ks)
        shallow = {**common, "name": "kimi_slice/nospec_shallow", "variant": "nospec", "k": 0, "spec": None,
                   "target": slice_dirs[f"target-L{SPEC_LAYERS - 1}"]}
        # the projection's second depth right after the first upstream/fork pair, before the optional engines
        at = next((i + 1 for i, j in enumerate(slice_jobs) if j["variant"] == "fork"), len(slice_jobs))
        jobs += [*slice_jobs[:at], shallow, *slice_jobs[at:]]
    if args.engines:
        unknown = set(args.engines) - {j["name"] for j in jobs}
        if unknown:
            raise SystemExit(f"perf: --engines {sorted(unknown)} not in the plan: {', '.join(j['name'] for j in jobs)}")
        jobs = [j for j in jobs if j["name"] in args.engines]
    return jobs


#: A file of vLLM's Model Runner V1, deleted upstream with the runner (where it is gone, V1 engines refuse to start).
V1_RUNNER_FILE = Path("vllm/v1/worker/gpu_model_runner.py")


def v1_runner_removed(site: Path | str | None) -> bool:
    """True where ``site`` holds a ``vllm`` package without Model Runner V1 (the mainline's release), so that the
    engines held on V1 (``--v1-ks``, the check engine) cannot run; False where it has V1 or holds no ``vllm`` folder
    (an editable install: nothing to tell from the site)."""
    if site is None or not (Path(site) / "vllm" / "v1").is_dir():
        return False
    return not (Path(site) / V1_RUNNER_FILE).is_file()


def model_jobs(args: argparse.Namespace, common: dict, drafter: str, ks: list[int]) -> list[dict]:
    """One model's engines: ``nospec``, then per k ``upstream_k{k}``, ``fork_k{k}`` (``fork_v1_k{k}``,
    ``fork_v2_k{k}``); after k = 3 ``hookoff_k3`` (with ``--hook-off``: the fork with ``KIMI_DRAFT_GREEDY=upstream``,
    patch 0009's hook off, on the fork's default runner: what the rest of the fork costs or gains) and ``check_k3``
    (the fork with ``KIMI_DRAFT_GREEDY=check`` at the largest concurrency: does patch 0009 give upstream's draft ids
    on this device?)."""
    model = common["model"]
    jobs = [{**common, "name": f"{model}/nospec", "variant": "nospec", "k": 0, "spec": None}]
    held_ks = {"v1": args.v1_ks, "v2": [] if args.cpu_smoke else args.v2_ks}  # V2 needs triton (CUDA)
    for k in sorted(ks, key=lambda k: (k != 3, k)):
        spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
        variants = ("upstream", "fork", *(f"fork_{r}" for r in HELD_RUNNERS if k in held_ks[r]))
        for variant in variants:
            jobs.append({**common, "name": f"{model}/{variant}_k{k}", "variant": variant, "k": k, "spec": spec})
        if k == 3 and args.hook_off:
            jobs.append({**common, "name": f"{model}/hookoff_k3", "variant": "fork", "greedy": "upstream", "k": 3,
                         "spec": spec})
        if k == 3 and args.check:
            jobs.append({**common, "name": f"{model}/check_k3", "variant": "fork", "greedy": "check", "k": 3,
                         "spec": spec, "concurrency": [max(common["concurrency"])]})
    return jobs


def variant_env(args: argparse.Namespace, job: dict, scratch: Path, cache: str | None = None) -> dict:
    """The worker's environment for ``job``: its vLLM first on ``PYTHONPATH`` (the caller's own after it), its runner
    and greedy-draft mode, and a compile cache (``cache``: a folder name under ``scratch``; default one per vLLM,
    upstream / fork). The engine always runs in the worker's process (the step timers patch it there). The job's
    own ``env`` (a dict, optional) comes last."""
    upstream = job["variant"].startswith("upstream")
    # upstream's pristine `vllm` shadows the fork's; its dependencies come from the installed site
    sites = (args.upstream_site, args.fork_site) if upstream else (args.fork_site,)
    # then the caller's own path: on the GPU host it names the folders the kit's `.pth` files add (the CuTe DSL's
    # `cutlass`, which the mainline's vLLM imports at every CUDA engine's start); a cold torch.compile of the pair costs
    # ~60 s of a ~90 s engine start on the H200
    env = worker_env([kimi_path(scratch), *sites, os.environ.get("PYTHONPATH")],
                     scratch / (cache or ("vllm-cache-upstream" if upstream else "vllm-cache-fork")))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["KIMI_DRAFT_GREEDY"] = "upstream" if upstream else (job.get("greedy") or args.fork_greedy)
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    # the check mode counts on the host (kimi/spec/draft_greedy.py): V1 for every engine that runs it
    check = env["KIMI_DRAFT_GREEDY"] == "check" and job["variant"] != "nospec"
    runner = "v1" if check else job["variant"].removeprefix("fork_")
    if runner in HELD_RUNNERS:
        env["VLLM_USE_V2_MODEL_RUNNER"] = HELD_RUNNERS[runner]
    env.update(job.get("env") or {})
    return env

