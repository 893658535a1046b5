"""Fork versus upstream vLLM side by side on one GPU, with EAGLE-3 and without speculation (issue G).

One GPU call (``benchmarks/gpu_call.sh`` installs upstream 0.26.0, keeps a pristine copy of its ``vllm`` package
and puts the fork on the installed one)::

    python3 benchmarks/perf_vs_upstream.py --upstream-site /tmp/upstream --fork-site /tmp/site \\
        --pair .kimi/models/trained --out $OUT

For each model, engines run one at a time, each in its own process with its own ``PYTHONPATH``:

* ``nospec``: the target alone (the fork's vLLM; no patch changes the target's GPU path without a drafter);
* ``upstream_k{k}``: upstream 0.26.0 with the EAGLE-3 drafter, k draft tokens, as it runs by default: the V1
  model runner (0.26.0 defaults to V2 for ``DeepseekV2ForCausalLM`` but not ``DeepseekV3ForCausalLM``,
  ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` in ``vllm/config/vllm.py``), whose drafter steps are PIECEWISE
  CUDA graphs (vLLM RFC 45258);
* ``fork_k{k}``: the fork with the same drafter and k, as it runs by default: greedy drafts from the draft
  vocabulary (patch 0009, ``KIMI_DRAFT_GREEDY=auto``, with the fork's draft-head kernel where
  ``KIMI_DRAFT_HEAD_LIB`` is set), vLLM's V2 model runner (patch 0013, for drafters whose attention is not MLA,
  as both models' are), whose drafting loop (forward, logits, sampling) is captured in FULL CUDA graphs. No
  step times there (the loop is one graph);
* ``fork_v1_k{k}`` (k in ``--v1-ks``): the fork held on the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``): the
  fork before patch 0013; ``fork_v2_k{k}`` (k in ``--v2-ks``): the fork with ``VLLM_USE_V2_MODEL_RUNNER=1``
  (results from before patch 0013, when the fork's default was V1);
* ``check_k3``: the fork on V1 with ``KIMI_DRAFT_GREEDY=check`` at the largest concurrency (draft ids of
  patch 0009 against upstream's, counted on the device; the count needs V1, see ``kimi/drafter/greedy.py``).

Models: ``pair``, the trained reference pair (``kimi models train-pair``; k = 1, 2, 3, 5), and ``kimi_slice``,
a Kimi-K2-dimension slice with random weights (``kimi.models.kimi_slice``; k = 3) plus a shallower slice
without speculation, for the per-layer projection below.

Each engine keeps vLLM's defaults (torch.compile, CUDA graphs, async scheduling), prefix caching off, and
serves every concurrency ``c`` in 1, 4, 16, 64: ``c`` requests submitted at once (greedy, ``--tokens``
output tokens each, EOS ignored), so the batch holds ``c`` sequences from start to end. Per ``c``:

* ``tok_s``: output tokens / wall time of the batch (best of ``--reps``), ``tpot_ms``: wall time per output
  token of a request (the batch's wall time / ``--tokens``, prefill included);
* ``tau``: mean acceptance length, 1 + accepted / drafts, from vLLM's spec-decode counters;
* step times from a separate timed pass (each call below between two device synchronizations, so they hold
  the GPU time plus launch overhead and exclude the scheduler): ``t_target_ms`` the target's forward + logits
  on the decode batch of the ``nospec`` engine; ``t_verify_ms`` the same on the verification batch
  (``c (k + 1)`` tokens) of the fork's engine (else ``fork_v1_k{k}``, else ``upstream_k{k}``); ``t_draft_ms``
  the drafter's forward passes plus its draft heads per draft token, same engine. ``ideal_speedup = tau *
  t_target / (t_verify + k * t_draft)`` with the fork's tau (EAGLE-3's bound with no overhead outside the
  forward passes).

Engine starts (torch.compile and CUDA-graph capture, a minute or more each, mostly CPU) can overlap:
``--parallel-start`` starts all of the pair's engines at once (each with a fixed 2 GiB KV cache and
``gpu_memory_utilization`` 0.05, so they fit side by side), waits until all are ready, then lets them measure
one at a time while the others wait idle, in ``--rounds`` interleaved rounds (each concurrency keeps its fastest
round and lists every round's rate in ``tok_s_rounds``). The Kimi slice's engines (about 107 GB each) always
start one at a time. On a host with two GPUs, run one model per GPU (``CUDA_VISIBLE_DEVICES``) in two processes
and join the results with ``--combine``.

Kimi slice projection to the 61-layer model at TP 8: the per-MoE-layer time ``t_moe`` is the difference of the
decode step times of the 4- and 3-layer slices (1 dense + 3 or 2 MoE layers); the 61-layer step is
``t(L4) + 57 t_moe`` on one GPU and ``t(L4) - 3 t_moe + 60 t_moe / 8`` at TP 8 (MoE layer work split 8 ways;
embedding, head and the dense layer unsplit; no all-reduce cost). Verification scales by the slice's measured
``t_verify / t_target``; the drafter is not split. ``break_even_tau`` is the acceptance length at which the
ideal speed-up is 1.

Writes ``perf_vs_upstream.json``, ``perf_vs_upstream.md`` and ``perf_vs_upstream.png`` (with matplotlib) under
``--out``; the JSON is rewritten after every engine, so a call stopped by its time limit keeps what finished.
``--chart-only FILE`` redraws the PNG and markdown from a JSON. ``--cpu-smoke`` runs the same logic on CPU
(tiny slice, float32, eager, both variants on the fork) and writes under ``--out`` only; ``--no-chart``
leaves out the PNG (a device call returns few files: draw it from the combined JSON).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: the variant's site decides which `vllm` is imported
from kimi.fork.fsutil import write_atomic  # noqa: E402
from kimi.models.kimi_slice import FULL_LAYERS, SPEC_LAYERS  # noqa: E402
from kimi.train.charts import pyplot, save_png  # noqa: E402

CONCURRENCY = (1, 4, 16, 64)
PAIR_KS = (1, 2, 3, 5)
SLICE_KS = (3,)
#: Goal of issue G: fork / upstream on the pair at k = 3 and c <= 16, and the floor everywhere.
GOAL_PAIR_K3 = 1.10
GOAL_FLOOR = 0.98


def log(msg: str) -> None:
    print(f"perf [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- worker: one engine, every concurrency ---------------------------------------------------------------------

class StepTimer:
    """Wraps the model runner's target forward and logits, the drafter's forward and its draft head, timing
    each call between two device synchronizations; records ``(tokens, seconds)`` per call and name."""

    def __init__(self, sync) -> None:
        self.sync = sync
        self.calls: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.undo: list = []

    def timed(self, name: str, fn, tokens):
        def call(*args, **kwargs):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.calls[name].append((tokens(args, kwargs), time.perf_counter() - t0))
            return out
        return call

    def install(self, worker) -> None:
        """Wrap what this runner has; vLLM's V2 model runner (its drafting loop runs as one CUDA graph) has none of
        these methods, so nothing is timed there."""
        runner = worker.model_runner
        if not hasattr(runner, "_model_forward"):
            return

        def forward_tokens(args, kwargs) -> int:
            for key in ("positions", "input_ids", "inputs_embeds"):
                if kwargs.get(key) is not None:
                    return int(kwargs[key].shape[-1] if key == "positions" else kwargs[key].shape[0])
            return -1

        def rows(args, kwargs) -> int:
            return int((args[0] if args else next(iter(kwargs.values()))).shape[0])

        self._swap(runner, "_model_forward", self.timed("target_forward", runner._model_forward, forward_tokens))
        self._swap(runner.model, "compute_logits", self.timed("target_logits", runner.model.compute_logits, rows))
        drafter = getattr(runner, "drafter", None)
        if drafter is not None and hasattr(drafter, "_greedy_sample"):
            inner = drafter.model
            self._swap(drafter, "model", _Proxy(inner, self.timed("draft_forward", inner, forward_tokens)))
            self._swap(drafter, "_greedy_sample", self.timed("draft_head", drafter._greedy_sample, rows))

    def _swap(self, obj, name: str, value) -> None:
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, value)
        self.undo.append((obj, name, had, old))

    def uninstall(self) -> None:
        for obj, name, had, old in reversed(self.undo):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        self.undo.clear()


class _Proxy:
    """Calls go to ``call``; attributes to the wrapped module (the drafter's ``compute_logits``, ``lm_head``...);
    ``isinstance`` sees the wrapped module's class (the proposer asserts the drafter's type)."""

    def __init__(self, inner, call) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_call", call)

    @property
    def __class__(self):  # noqa: D105 - isinstance() falls back to __class__
        return type(self._inner)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _timer_install(worker) -> None:
    """``collective_rpc`` target: a :class:`StepTimer` on the worker's model runner (kept on the worker, so the
    call works whether the executor runs it in this process or ships it pickled to another)."""
    import torch

    worker.kimi_step_timer = StepTimer(torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    worker.kimi_step_timer.install(worker)


def _timer_collect(worker) -> dict[str, list[tuple[int, float]]]:
    """``collective_rpc`` target: remove the worker's :class:`StepTimer` and return its records."""
    timer = worker.kimi_step_timer
    timer.uninstall()
    del worker.kimi_step_timer
    return dict(timer.calls)


def _greedy_counts(worker) -> dict[str, int] | None:
    """``collective_rpc`` target: the drafter's ``KIMI_DRAFT_GREEDY=check`` counts (kimi.drafter.greedy.GreedyCheck)."""
    check = getattr(getattr(worker.model_runner, "drafter", None), "draft_greedy", None)
    return check.counts() if hasattr(check, "counts") else None


def step_times(calls: dict[str, list[tuple[int, float]]]) -> dict:
    """Step times in ms from :class:`StepTimer` records.

    ``target_ms``: forward + logits at the most frequent forward size (the steady decode or verification batch;
    prefill calls have other sizes); ``draft_per_token_ms``: all drafter forward and draft-head time divided by
    the number of draft-head calls (one per draft token), None without a drafter.
    """
    forward = calls.get("target_forward", [])
    if not forward:
        return {}
    shape = Counter(t for t, _ in forward).most_common(1)[0][0]
    fwd = [s for t, s in forward if t == shape]
    logit_calls = calls.get("target_logits", [])
    # logits run once per forward; pair them by order with the forwards of the steady size
    paired = [lg for (t, _), (_, lg) in zip(forward, logit_calls, strict=False) if t == shape]
    out = {"target_tokens": shape, "target_ms": 1e3 * (statistics.mean(fwd) + (statistics.mean(paired)
                                                                               if paired else 0.0)),
           "target_calls": len(fwd)}
    heads = calls.get("draft_head", [])
    if heads:
        drafted = sum(s for _, s in calls.get("draft_forward", [])) + sum(s for _, s in heads)
        out["draft_per_token_ms"] = 1e3 * drafted / len(heads)
        out["draft_heads"] = len(heads)
    return out


def run_engine(job: dict, result: dict) -> dict:
    """Start one engine, measure every concurrency of ``job`` (in turns when ``job["turn"]`` is set: see
    :func:`await_turn`), shut it down. ``result`` is filled as the rounds go (the caller keeps it on an error)."""
    import vllm  # first: the variant's PYTHONPATH decides which vLLM this is
    from vllm import LLM

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_e2e import _device, _engine_info

    t0 = time.monotonic()
    llm = LLM(model=job["target"], speculative_config=job["spec"], disable_log_stats=False, **job["engine"])
    v2 = bool(getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False))
    result.update({"vllm_version": vllm.__version__, "vllm_file": vllm.__file__,
                   "start_s": round(time.monotonic() - t0, 1), "engine": _engine_info(llm), "device": _device(),
                   "greedy_env": os.environ.get("KIMI_DRAFT_GREEDY"), "runner": "v2" if v2 else "v1",
                   "by_concurrency": {}})
    turn = Path(job["turn"]) if job.get("turn") else None
    try:
        if turn is not None:
            write_atomic(turn.with_suffix(".ready"), json.dumps({"start_s": result["start_s"]}))
        for rnd in itertools.count():
            order = "last" if turn is None else await_turn(turn, rnd, job["turn_timeout_s"])
            if order == "stop":
                break
            for c in job["concurrency"]:
                entry = measure(llm, job, c, timed=rnd == 0)
                merge_round(result["by_concurrency"], str(c), entry)
                log(f"{job['name']} round {rnd} c={c}: {entry['tok_s']:.0f} tok/s, tau {entry['tau']}")
            if order == "last":
                break
            write_atomic(turn.with_suffix(f".done{rnd}"), "")
        if os.environ.get("KIMI_DRAFT_GREEDY") == "check":
            result["greedy_check"] = llm.collective_rpc(_greedy_counts)[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    return result


def measure(llm, job: dict, c: int, timed: bool) -> dict:
    """``c`` requests at once: a warm-up batch, ``job["reps"]`` timed batches (the best counts), the spec-decode
    counters over them, and with ``timed`` a shorter batch under the :class:`StepTimer`."""
    from kimi.e2e.engine import spec_metrics
    from vllm import SamplingParams

    prompts, tokens = job["prompts"], job["tokens"]
    batch = [{"prompt_token_ids": prompts[i % len(prompts)]} for i in range(c)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    llm.generate(batch, params, use_tqdm=False)  # warm-up: lazily compiled kernels, every batch shape
    before = spec_metrics(llm.get_metrics())
    walls = []
    for _ in range(job["reps"]):
        t1 = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        walls.append(time.perf_counter() - t1)
    after = spec_metrics(llm.get_metrics())
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    drafts = after["num_drafts"] - before["num_drafts"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    wall = min(walls)
    entry = {"tok_s": produced / wall, "tpot_ms": 1e3 * wall / tokens, "walls_s": walls, "output_tokens": produced,
             "drafts": drafts, "accepted": accepted, "tau": 1 + accepted / drafts if drafts else None,
             "tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    if timed:
        llm.collective_rpc(_timer_install)
        try:
            llm.generate(batch, SamplingParams(temperature=0, max_tokens=min(tokens, 48), ignore_eos=True,
                                               detokenize=False), use_tqdm=False)
        finally:
            calls = llm.collective_rpc(_timer_collect)[0]
        entry["steps"] = step_times(calls)
    return entry


def merge_round(by_c: dict, c: str, entry: dict) -> None:
    """Fold one round's ``entry`` for concurrency ``c`` into ``by_c``: the fastest round's numbers, every round's
    tok/s in ``tok_s_rounds``, the step times of the first round."""
    prev = by_c.get(c)
    if prev is None:
        by_c[c] = {**entry, "tok_s_rounds": [entry["tok_s"]]}
        return
    rounds = [*prev["tok_s_rounds"], entry["tok_s"]]
    best = entry if entry["tok_s"] > prev["tok_s"] else prev
    by_c[c] = {**best, "steps": prev.get("steps", entry.get("steps", {})), "tok_s_rounds": rounds}


def await_turn(turn: Path, rnd: int, timeout_s: float) -> str:
    """Parallel start: wait idle until the orchestrator writes ``turn.go{rnd}``; its text is the order:
    ``more`` (measure, then wait for the next round), ``last`` (measure, then finish) or ``stop`` (finish now).

    Raises:
        TimeoutError: no turn within ``timeout_s`` seconds.
    """
    go, waited = turn.with_suffix(f".go{rnd}"), time.monotonic()
    while not go.exists():
        if time.monotonic() - waited > timeout_s:
            raise TimeoutError(f"no turn to measure (round {rnd}) within {timeout_s:.0f} s")
        time.sleep(0.2)
    return go.read_text()


def worker_main(job_path: Path, result_path: Path) -> int:
    job = json.loads(job_path.read_text())
    partial: dict = {}
    try:
        result = {"status": "done", **run_engine(job, partial)}
    except Exception:
        # the rounds measured before the error stay in the JSON (the engine is not counted)
        result = {**partial, "status": "error", "error": traceback.format_exc()[-4000:]}
        print(result["error"], flush=True)
    write_atomic(result_path, json.dumps(result))
    return 0 if result["status"] == "done" else 1


# -- orchestration -------------------------------------------------------------------------------------------

def plan(args: argparse.Namespace, pair_prompts: list[list[int]] | None,
         slice_dirs: dict[str, str] | None) -> list[dict]:
    """The engines to run, in order (those named by ``--engines`` only, when given). Per model: the baseline,
    then by k (3 first) upstream and fork (and the fork held on a runner where k is in ``--v1-ks`` / ``--v2-ks``),
    the check engine after
    k = 3; for the slice the shallower baseline of the projection comes right after the first fork engine."""
    base = {"concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps}
    if not args.cpu_smoke:
        # CUDA graphs for exactly the batch sizes measured (decode c, verification c (k + 1)), the same for every
        # variant: vLLM's default list (up to 512 sizes' worth of captures per engine) costs minutes per start
        sizes = sorted({c * (k + 1) for c in args.concurrency for k in {0, *args.ks, *args.slice_ks}})
        args.engine = {**args.engine, "compilation_config": {"cudagraph_capture_sizes": sizes}}
    jobs: list[dict] = []
    if pair_prompts is not None:
        # a fixed KV cache skips vLLM's memory profiling; the low utilization is only the start-up check of free
        # memory, so that engines started side by side (--parallel-start) pass it
        small = {} if args.cpu_smoke else {"gpu_memory_utilization": 0.05}
        common = {**base, "model": "pair", "prompts": pair_prompts, "target": str(args.pair / "target"),
                  "engine": {**args.engine, "kv_cache_memory_bytes": 2 << 30, **small}}
        jobs += model_jobs(args, common, str(args.pair / "drafter"), args.ks)
    if slice_dirs is not None:
        vocab = json.loads(Path(slice_dirs["drafter"], "config.json").read_text())["draft_vocab_size"]
        # random weights: any ids do; 96..159 tokens each, inside the draft vocabulary (d2t is the identity)
        prompts = [[(7919 * i + 104729 * j) % (vocab - 2) + 2 for j in range(96 + (i * 13) % 64)]
                   for i in range(max(args.concurrency))]
        common = {**base, "model": "kimi_slice", "prompts": prompts, "tokens": args.slice_tokens,
                  "target": slice_dirs[f"target-L{SPEC_LAYERS}"],
                  "engine": {**args.engine, "load_format": "dummy", "skip_tokenizer_init": True,
                             "kv_cache_memory_bytes": args.slice_kv_gib << 30}}
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


def model_jobs(args: argparse.Namespace, common: dict, drafter: str, ks: list[int]) -> list[dict]:
    """One model's engines: ``nospec``, then per k ``upstream_k{k}``, ``fork_k{k}`` (``fork_v1_k{k}``,
    ``fork_v2_k{k}``), and ``check_k3`` (the fork with ``KIMI_DRAFT_GREEDY=check`` at the largest concurrency:
    does patch 0009 give upstream's draft ids on this device?) after k = 3."""
    model = common["model"]
    jobs = [{**common, "name": f"{model}/nospec", "variant": "nospec", "k": 0, "spec": None}]
    held_ks = {"v1": args.v1_ks, "v2": [] if args.cpu_smoke else args.v2_ks}  # V2 needs triton (CUDA)
    for k in sorted(ks, key=lambda k: (k != 3, k)):
        spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
        variants = ("upstream", "fork", *(f"fork_{r}" for r in HELD_RUNNERS if k in held_ks[r]))
        for variant in variants:
            jobs.append({**common, "name": f"{model}/{variant}_k{k}", "variant": variant, "k": k, "spec": spec})
        if k == 3 and args.check:
            jobs.append({**common, "name": f"{model}/check_k3", "variant": "fork", "greedy": "check", "k": 3,
                         "spec": spec, "concurrency": [max(common["concurrency"])]})
    return jobs


#: The runners a fork engine can be held on (variant ``fork_{runner}``) and their ``VLLM_USE_V2_MODEL_RUNNER``;
#: the other variants take their vLLM's default runner (the fork: V2 for these targets, patch 0013; upstream:
#: V1). The check engine is held on V1 (its count needs it).
HELD_RUNNERS = {"v1": "0", "v2": "1"}


def variant_env(args: argparse.Namespace, job: dict, scratch: Path, cache: str | None = None) -> dict:
    """The worker's environment for ``job``: its vLLM first on ``PYTHONPATH``, its runner and greedy-draft mode,
    and a compile cache (``cache``: a folder name under ``scratch``; default one per vLLM, upstream / fork)."""
    env = dict(os.environ)
    upstream = job["variant"].startswith("upstream")
    # upstream's pristine `vllm` shadows the fork's; its dependencies come from the installed site
    sites = (args.upstream_site, args.fork_site) if upstream else (args.fork_site,)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(str(p) for p in (*sites, ROOT)))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    # a cold torch.compile of the pair costs ~60 s of a ~90 s engine start on the H200
    env["VLLM_CACHE_ROOT"] = str(scratch / (cache or ("vllm-cache-upstream" if upstream else "vllm-cache-fork")))
    env["KIMI_DRAFT_GREEDY"] = "upstream" if upstream else (job.get("greedy") or args.fork_greedy)
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    # the check mode counts on the host (kimi/drafter/greedy.py): V1 for every engine that runs it
    check = env["KIMI_DRAFT_GREEDY"] == "check" and job["variant"] != "nospec"
    runner = "v1" if check else job["variant"].removeprefix("fork_")
    if runner in HELD_RUNNERS:
        env["VLLM_USE_V2_MODEL_RUNNER"] = HELD_RUNNERS[runner]
    return env


class Worker:
    """One engine's worker process (``--worker JOB RESULT``), its log in the scratch folder (a device call brings
    back only a few files from --out; a failed engine's tail goes into the JSON). With ``parallel`` it measures
    in turns (:func:`await_turn`; files ``<engine>.ready/.go<r>/.done<r>`` in the scratch folder) and compiles
    into a cache of its own; ``threads`` caps inductor's compile threads."""

    def __init__(self, args: argparse.Namespace, job: dict, scratch: Path, parallel: bool = False,
                 threads: int | None = None) -> None:
        name = job["name"].replace("/", "-")
        self.job, self.began = job, time.monotonic()
        job_path, self.result_path = scratch / f"{name}.job.json", scratch / f"{name}.result.json"
        self.log_path = scratch / f"{name}.log"
        turn = self.turn = scratch / name if parallel else None
        cache = f"vllm-cache-{name}" if parallel else None
        if turn is not None:
            for old in (turn.with_suffix(".ready"), *scratch.glob(f"{turn.name}.go*"),
                        *scratch.glob(f"{turn.name}.done*")):
                old.unlink(missing_ok=True)
            job = {**job, "turn": str(turn), "turn_timeout_s": args.budget_s}
        job_path.write_text(json.dumps(job))
        self.result_path.unlink(missing_ok=True)
        env = variant_env(args, job, scratch, cache)
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(job_path),
                                          str(self.result_path)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env=env, start_new_session=True)

    def ready(self) -> bool:
        """Parallel start: the engine is up and waits for its turn."""
        return self.turn is not None and self.turn.with_suffix(".ready").is_file()

    def go(self, rnd: int, order: str) -> None:
        """Round ``rnd``'s turn: ``order`` is ``more``, ``last`` or ``stop`` (:func:`await_turn`)."""
        write_atomic(self.turn.with_suffix(f".go{rnd}"), order)

    def wait_round(self, rnd: int, limit: float) -> bool:
        """Wait up to ``limit`` s until the worker has measured round ``rnd`` (False: it exited or ran over)."""
        done, end = self.turn.with_suffix(f".done{rnd}"), time.monotonic() + limit
        while not done.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                return False
            time.sleep(0.2)
        return True

    def collect(self, limit: float) -> dict:
        """Wait up to ``limit`` seconds for the worker to finish (killed after that); its result."""
        from gpu_e2e import _kill, _tail

        try:
            self.proc.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            return {"status": "timeout", "error": f"killed after {limit:.0f} s:\n{_tail(self.log_path)}",
                    "seconds": round(time.monotonic() - self.began, 1)}
        if self.result_path.is_file():
            result = json.loads(self.result_path.read_text())
        else:
            result = {"status": "error", "error": f"worker exited with {self.proc.returncode}:\n{_tail(self.log_path)}"}
        result["seconds"] = round(time.monotonic() - self.began, 1)
        return result

    def stop(self, status: str, why: str) -> dict:
        from gpu_e2e import _kill

        _kill(self.proc)
        return {"status": status, "error": why, "seconds": round(time.monotonic() - self.began, 1)}


def run_serial(args: argparse.Namespace, jobs: list[dict], deadline: float, runs: dict, report) -> None:
    """Each engine started, measured and stopped before the next; a model whose ``nospec`` engine failed skips
    its other engines (the same target fails the same way: keep the device time for the next model)."""
    for job in jobs:
        if deadline - time.monotonic() < 40:
            runs[job["name"]] = {"status": "skipped", "error": "time budget"}
            continue
        baseline = runs.get(f"{job['model']}/nospec", {})
        if baseline.get("status") not in (None, "done"):
            runs[job["name"]] = {"status": "skipped", "error": f"{job['model']}/nospec did not finish"}
            continue
        log(f"{job['name']}: starting")
        worker = Worker(args, job, args.scratch)
        runs[job["name"]] = worker.collect(min(args.job_timeout_s, deadline - time.monotonic()))
        report(job)


def run_parallel(args: argparse.Namespace, jobs: list[dict], deadline: float, runs: dict, report) -> None:
    """All of ``jobs`` start at once (each its own compile cache; inductor's compile threads shared out over the
    CPUs); once every engine is ready (or gone, or past ``--job-timeout-s``) they measure one at a time, in
    order, the others waiting idle, for ``--rounds`` rounds (engine by engine, round after round: a drift of the
    host over minutes then touches every engine alike; each concurrency keeps its fastest round; see
    :func:`measure_rounds`). Engines not collected when it ends (an error, an interrupt) are killed."""
    threads = max(1, len(os.sched_getaffinity(0)) // len(jobs))  # the CPUs this process may use (taskset)
    log(f"starting {len(jobs)} engines at once ({threads} inductor compile threads each)")
    workers = {job["name"]: Worker(args, job, args.scratch, parallel=True, threads=threads) for job in jobs}
    began = time.monotonic()
    waiting = set(workers)
    while waiting and time.monotonic() < min(deadline - 40, began + args.job_timeout_s):
        waiting = {n for n in waiting if not workers[n].ready() and workers[n].proc.poll() is None}
        time.sleep(0.5)
    log(f"{len(workers) - len(waiting)} of {len(workers)} engines up or gone after {time.monotonic() - began:.0f} s")
    for job in jobs:
        worker = workers[job["name"]]
        if worker.proc.poll() is not None:
            runs[job["name"]] = worker.collect(1.0)  # failed at start: its error and log tail
            report(job)
        elif not worker.ready():
            runs[job["name"]] = worker.stop("timeout", f"not ready within {time.monotonic() - began:.0f} s")
            report(job)
    live = [job for job in jobs if job["name"] not in runs]
    try:
        measure_rounds(args, live, workers, deadline, runs, report)
    finally:  # never leave an engine holding the GPU (workers run in their own sessions)
        for job in jobs:
            if job["name"] not in runs:
                runs[job["name"]] = workers[job["name"]].stop("error", "orchestrator stopped")


def measure_rounds(args: argparse.Namespace, live: list[dict], workers: dict, deadline: float, runs: dict,
                   report) -> None:
    """The rounds of :func:`run_parallel` over the engines that are up. A round starts only when the time left
    holds it (as long as the previous round, plus a margin), so every engine gets the same number of rounds;
    otherwise the engines are told to stop and keep what they measured. An engine that dies or overruns a
    round is collected with what it wrote."""
    last_round_s = 0.0
    for rnd in range(args.rounds):
        round_began = time.monotonic()
        active = [j for j in live if j["name"] not in runs]
        if rnd > 0 and deadline - round_began < 40 + 1.2 * last_round_s:
            for job in active:
                workers[job["name"]].go(rnd, "stop")
            for job in active:
                runs[job["name"]] = workers[job["name"]].collect(max(1.0, deadline - time.monotonic()))
                report(job)
            return
        final = rnd == args.rounds - 1
        for job in active:
            worker = workers[job["name"]]
            log(f"{job['name']}: measuring (round {rnd + 1}{', last' if final else ''})")
            worker.go(rnd, "last" if final else "more")
            limit = max(1.0, min(args.job_timeout_s, deadline - time.monotonic()))
            if final:
                runs[job["name"]] = worker.collect(limit)
            elif not worker.wait_round(rnd, limit):
                worker.go(rnd + 1, "stop")  # it may still finish this round; then it stops with it
                runs[job["name"]] = worker.collect(max(1.0, deadline - time.monotonic()))
            else:
                continue
            report(job)
        last_round_s = time.monotonic() - round_began


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a and b else None


def rows_of(runs: dict[str, dict], jobs: list[dict]) -> list[dict]:
    """One row per (model, concurrency, k) from the finished engines (see the module docstring for the fields).

    ``fork_*`` is the fork as it runs by default, ``fork_v1_*`` / ``fork_v2_*`` the fork held on vLLM's V1 / V2
    runner. Step times (``t_verify_ms``, ``t_draft_ms``) come from the fork's engine, else the fork's on V1, else
    upstream's (``steps_from``); V2 engines have none.
    """
    out = []
    done = {j["name"]: (j, runs[j["name"]]) for j in jobs if runs.get(j["name"], {}).get("status") == "done"}

    def at(name: str, c: str) -> dict:
        return done.get(name, (None, {}))[1].get("by_concurrency", {}).get(c, {})

    def tok_s(entry: dict) -> float | None:
        return round(entry["tok_s"], 1) if entry else None

    for job, result in done.values():
        if job["variant"] != "fork" or job.get("greedy"):
            continue
        model, k = job["model"], job["k"]
        for c, fork_c in result["by_concurrency"].items():
            up_c, base_c = at(f"{model}/upstream_k{k}", c), at(f"{model}/nospec", c)
            held = {runner: at(f"{model}/fork_{runner}_k{k}", c) for runner in HELD_RUNNERS}
            steps_from, steps = next(((n, e["steps"]) for n, e in (("fork", fork_c), ("fork_v1", held["v1"]),
                                                                  ("upstream", up_c))
                                      if e.get("steps", {}).get("draft_per_token_ms")), (None, {}))
            t_target = base_c.get("steps", {}).get("target_ms")
            t_verify, t_draft, tau = steps.get("target_ms"), steps.get("draft_per_token_ms"), fork_c.get("tau")
            ideal = (tau * t_target / (t_verify + k * t_draft)
                     if None not in (tau, t_target, t_verify, t_draft) else None)
            out.append({
                "model": model, "concurrency": int(c), "k": k,
                "fork_tok_s": tok_s(fork_c), "upstream_tok_s": tok_s(up_c), "nospec_tok_s": tok_s(base_c),
                "fork_vs_upstream": _ratio(fork_c["tok_s"], up_c.get("tok_s")),
                "fork_vs_nospec": _ratio(fork_c["tok_s"], base_c.get("tok_s")),
                "upstream_vs_nospec": _ratio(up_c.get("tok_s"), base_c.get("tok_s")),
                "tau": round(tau, 3) if tau else None,
                "tau_upstream": round(up_c["tau"], 3) if up_c.get("tau") else None,
                "tpot_ms_fork": round(fork_c["tpot_ms"], 3),
                "tpot_ms_upstream": round(up_c["tpot_ms"], 3) if up_c else None,
                "tpot_ms_nospec": round(base_c["tpot_ms"], 3) if base_c else None,
                "t_target_ms": round(t_target, 4) if t_target else None,
                "t_verify_ms": round(t_verify, 4) if t_verify else None,
                "t_draft_ms": round(t_draft, 4) if t_draft else None,
                "steps_from": steps_from,
                "t_draft_ms_upstream": round(up_c["steps"]["draft_per_token_ms"], 4)
                if up_c.get("steps", {}).get("draft_per_token_ms") else None,
                "ideal_speedup": round(ideal, 3) if ideal else None,
                "fork_runner": result.get("runner"),
                "rounds": [len(e.get("tok_s_rounds", [None])) for e in (fork_c, up_c) if e],  # fork, upstream
            })
            for runner, e in held.items():
                out[-1].update({f"fork_{runner}_tok_s": tok_s(e),
                                f"fork_{runner}_vs_upstream": _ratio(e.get("tok_s"), up_c.get("tok_s")),
                                f"tau_{runner}": round(e["tau"], 3) if e.get("tau") else None})
    return sorted(out, key=lambda r: (r["model"], r["k"], r["concurrency"]))


def projection(runs: dict[str, dict], rows: list[dict]) -> dict:
    """The 61-layer TP 8 projection of the Kimi slice (module docstring), per concurrency with a k = 3 row."""
    deep, shallow = runs.get("kimi_slice/nospec", {}), runs.get("kimi_slice/nospec_shallow", {})
    if deep.get("status") != "done" or shallow.get("status") != "done":
        return {}
    out = {}
    for row in rows:
        if row["model"] != "kimi_slice":
            continue
        c = str(row["concurrency"])
        t_deep = deep["by_concurrency"].get(c, {}).get("steps", {}).get("target_ms")
        t_shallow = shallow["by_concurrency"].get(c, {}).get("steps", {}).get("target_ms")
        # a fork engine marked invalid: upstream's verification and draft steps instead
        t_verify, t_draft = row["t_verify_ms"], row["t_draft_ms"]
        if row.get("invalid"):
            up = runs.get(f"kimi_slice/upstream_k{row['k']}", {}).get("by_concurrency", {}).get(c, {})
            t_verify, t_draft = up.get("steps", {}).get("target_ms"), row.get("t_draft_ms_upstream")
        if not (t_deep and t_shallow and t_verify and t_draft):
            continue
        t_moe = t_deep - t_shallow
        moe_here, moe_full = SPEC_LAYERS - 1, FULL_LAYERS - 1
        one_gpu = t_deep + (moe_full - moe_here) * t_moe
        tp8 = t_deep - moe_here * t_moe + moe_full * t_moe / 8
        verify_ratio = t_verify / t_deep
        k = row["k"]
        spent = verify_ratio * tp8 + k * t_draft
        out[f"c{c}_k{k}"] = {"t_moe_layer_ms": round(t_moe, 4), "t_target_61_1gpu_ms": round(one_gpu, 3),
                             "t_target_61_tp8_ms": round(tp8, 3), "t_verify_61_tp8_ms": round(verify_ratio * tp8, 3),
                             "t_draft_ms": t_draft, "break_even_tau": round(spent / tp8, 3),
                             "ideal_speedup_at_tau_3": round(3 * tp8 / spent, 3)}
    return out


def same_as_nospec(runs: dict[str, dict], jobs: list[dict]) -> dict:
    """``{engine: {c: [identical sequences, sequences]}}``: each speculative engine's greedy output against its
    model's ``nospec`` engine, batch by batch (bf16 numerics may flip near-tied tokens; the count says how often)."""
    out: dict = {}
    for job in jobs:
        result, base = runs.get(job["name"], {}), runs.get(f"{job['model']}/nospec", {})
        if not job["spec"] or result.get("status") != "done" or base.get("status") != "done":
            continue
        out[job["name"]] = {}
        for c, entry in result["by_concurrency"].items():
            ref = base["by_concurrency"].get(c, {}).get("tokens")
            if ref and entry.get("tokens"):
                out[job["name"]][c] = [sum(a == b for a, b in zip(entry["tokens"], ref, strict=True)), len(ref)]
    return out


def _without_tokens(result: dict) -> dict:
    if "by_concurrency" not in result:
        return result
    return {**result, "by_concurrency": {c: {k: v for k, v in e.items() if k != "tokens"}
                                         for c, e in result["by_concurrency"].items()}}


def goal(rows: list[dict]) -> dict:
    """Issue G's goal over the rows not marked ``invalid``."""
    rows = [r for r in rows if not r.get("invalid")]
    pair_k3 = [r["fork_vs_upstream"] for r in rows
               if r["model"] == "pair" and r["k"] == 3 and r["concurrency"] <= 16 and r["fork_vs_upstream"]]
    every = [r["fork_vs_upstream"] for r in rows if r["fork_vs_upstream"]]
    return {"pair_k3_c1_16_min": min(pair_k3) if pair_k3 else None,
            "pair_k3_c1_16_met": bool(pair_k3) and min(pair_k3) >= GOAL_PAIR_K3,
            "min_anywhere": min(every) if every else None,
            "floor_met": bool(every) and min(every) >= GOAL_FLOOR}


def write_outputs(out: Path, summary: dict, chart: bool = True) -> None:
    write_atomic(out / "perf_vs_upstream.json", json.dumps(summary, indent=2) + "\n")
    # the held-runner columns (fork_v1, fork_v2) that some row has
    held = [h for h in HELD_RUNNERS if any(r.get(f"fork_{h}_tok_s") for r in summary["rows"])]
    settings, versions = summary["settings"], summary["versions"]
    lines = ["# Fork versus upstream vLLM on one GPU (issue G)", "",
             f"- command: `{summary['command']}`", f"- date: {summary['date']}", f"- hardware: {summary['device']}",
             (f"- vLLM: fork {versions.get('fork')}, upstream {versions.get('upstream')}; "
              f"fork greedy drafts: KIMI_DRAFT_GREEDY={settings['fork_greedy']}"),
             (f"- output tokens per request: {settings['tokens']} (pair), {settings.get('slice_tokens')} "
              f"(Kimi slice); greedy, c requests at once; best of {settings['reps']}"),
             f"- goal: fork/upstream >= {GOAL_PAIR_K3} on the pair at k = 3, c <= 16: {summary['goal']}", "",
             ("| model | c | k | fork tok/s (runner) | upstream tok/s | no-spec tok/s | fork/upstream | fork/no-spec "
              "| tau | t_target ms | t_verify ms | t_draft ms (steps from / upstream) | ideal "
              + "".join(f"| fork on {r.upper()} tok/s (/ upstream) | tau on {r.upper()} " for r in held) + "|"),
             "|---" * (13 + 2 * len(held)) + "|"]
    for r in summary["rows"]:
        ratio = f"{r['fork_vs_upstream']}{' (not counted)' if r.get('invalid') else ''}"
        lines.append(f"| {r['model']} | {r['concurrency']} | {r['k']} | {r['fork_tok_s']} ({r.get('fork_runner')}) "
                     f"| {r['upstream_tok_s']} | {r['nospec_tok_s']} | {ratio} | {r['fork_vs_nospec']} "
                     f"| {r['tau']} | {r['t_target_ms']} | {r['t_verify_ms']} "
                     f"| {r['t_draft_ms']} ({r.get('steps_from')}) / {r['t_draft_ms_upstream']} | {r['ideal_speedup']} "
                     + "".join(f"| {r.get(f'fork_{h}_tok_s')} ({r.get(f'fork_{h}_vs_upstream')}) | {r.get(f'tau_{h}')} "
                               for h in held) + "|")
    invalid = {f"{r['model']}/fork_k{r['k']}": r["invalid"] for r in summary["rows"] if r.get("invalid")}
    if invalid or summary.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {engine}: not counted: {why}" for engine, why in invalid.items()]
        lines += [f"- {note}" for note in summary.get("notes", [])]
    if summary.get("projection"):
        lines += ["", "Kimi slice projected to 61 layers at TP 8 (module docstring of benchmarks/perf_vs_upstream.py):",
                  "", ("| c, k | t_moe/layer ms | 61 layers 1 GPU ms | 61 layers TP8 ms | verify TP8 ms | draft ms "
                       "| break-even tau | ideal at tau 3 |"), "|---|---|---|---|---|---|---|---|"]
        for key, p in summary["projection"].items():
            lines.append(f"| {key} | {p['t_moe_layer_ms']} | {p['t_target_61_1gpu_ms']} | {p['t_target_61_tp8_ms']} "
                         f"| {p['t_verify_61_tp8_ms']} | {p['t_draft_ms']} | {p['break_even_tau']} "
                         f"| {p['ideal_speedup_at_tau_3']} |")
    if summary.get("greedy_check"):
        lines += ["", ("Patch 0009 check (KIMI_DRAFT_GREEDY=check: upstream's draft ids used, the hook's compared "
                       f"at every draft step): {summary['greedy_check']}")]
    if summary.get("same_as_nospec"):
        lines += ["", "Greedy output identical to the same model without speculation (sequences, per concurrency): "
                  + "; ".join(f"{n}: " + ", ".join(f"c{c} {a}/{b}" for c, (a, b) in v.items())
                              for n, v in summary["same_as_nospec"].items())]
    failed = {n: r.get("status") for n, r in summary["runs"].items() if r.get("status") != "done"}
    if failed:
        lines += ["", f"Engines that did not finish: {failed}"]
    write_atomic(out / "perf_vs_upstream.md", "\n".join(lines) + "\n")
    if chart:
        draw_chart(summary, out / "perf_vs_upstream.png")


def draw_chart(summary: dict, path: Path) -> bool:
    """Output tokens/s against concurrency for fork, upstream, no speculation and the ideal bound
    (``ideal_speedup x`` no-spec tokens/s), one panel per model at k = 3. False without matplotlib."""
    plt = pyplot()
    if plt is None:
        log("matplotlib is not importable here: no PNG (redraw with --chart-only where it is)")
        return False
    models = sorted({r["model"] for r in summary["rows"]})
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rows = sorted((r for r in summary["rows"] if r["model"] == model and r["k"] == 3),
                      key=lambda r: r["concurrency"])
        c = [r["concurrency"] for r in rows]
        # fixed colours: a series missing from one panel does not shift the others
        for key, label, style in (("fork_tok_s", "fork", "C0o-"), ("upstream_tok_s", "upstream 0.26.0", "C1s--"),
                                  ("nospec_tok_s", "no speculation", "C2^:"),
                                  ("fork_v1_tok_s", "fork held on vLLM's V1 model runner", "C4v-."),
                                  ("fork_v2_tok_s", "fork held on vLLM's V2 model runner", "C3d-.")):
            points = [(r["concurrency"], r.get(key)) for r in rows
                      if r.get(key) and not (key.startswith("fork") and r.get("invalid"))]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ideal = [(r["concurrency"], r["ideal_speedup"] * r["nospec_tok_s"]) for r in rows
                 if r["ideal_speedup"] and r["nospec_tok_s"] and not r.get("invalid")]
        if ideal:
            ax.plot(*zip(*ideal, strict=True), "k-", alpha=0.35, label="ideal bound (tau, step times)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(c, [str(x) for x in c])
        ax.set_xlabel("concurrency (requests at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{model}, EAGLE-3 k = 3")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary['device']} - {summary['date'][:10]}")
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    return True


def summarize(args: argparse.Namespace, jobs: list[dict], runs: dict[str, dict], started: float) -> dict:
    done = [r for r in runs.values() if r.get("status") == "done"]
    device = done[0]["device"] if done else {}
    versions = {}
    for job in jobs:
        r = runs.get(job["name"], {})
        if r.get("status") == "done":
            versions.setdefault("upstream" if job["variant"] == "upstream" else "fork", r["vllm_version"])
    rows = rows_of(runs, jobs)
    return {
        "device": (f"{device.get('name')} ({device.get('memory_gib')} GiB, sm_{device.get('capability')}), "
                   f"torch {device.get('torch')}, CUDA {device.get('cuda')}") if device.get("cuda")
        else device.get("name"),
        "date": args.date, "command": args.command, "versions": versions,
        "settings": {"concurrency": args.concurrency, "tokens": args.tokens, "slice_tokens": args.slice_tokens,
                     "reps": args.reps, "ks": args.ks,
                     "slice_ks": args.slice_ks, "engine": args.engine, "fork_greedy": args.fork_greedy,
                     "profile": "cpu-smoke" if args.cpu_smoke else "gpu"},
        "rows": rows, "projection": projection(runs, rows), "goal": goal(rows),
        "same_as_nospec": same_as_nospec(runs, jobs),
        "greedy_check": {j["name"]: runs[j["name"]].get("greedy_check") for j in jobs
                         if j.get("greedy") == "check" and runs.get(j["name"], {}).get("status") == "done"},
        "runs": {j["name"]: _without_tokens(runs.get(j["name"], {"status": "not run"})) for j in jobs},
        "seconds": round(time.monotonic() - started, 1),
    }


def combine(parts: list[dict], invalid: dict[str, str] | None = None, notes: list[str] | None = None) -> dict:
    """One result from the results of several calls (one GPU call per model fits the device's time limit):
    rows, runs, checks and projections are joined, the goal is recomputed, each call's command is kept.

    ``invalid`` maps a fork engine (``model/fork_k{k}``) to the reason its measurement does not count: its rows
    keep their numbers with ``invalid`` set and leave the goal. ``notes`` are printed under the table.

    Raises:
        ValueError: the parts come from different devices or vLLM versions, or an ``invalid`` engine has no rows.
    """
    first = parts[0]
    for part in parts[1:]:
        if part["device"] != first["device"] or any(part["versions"].get(k, v) != v
                                                    for k, v in first["versions"].items()):
            raise ValueError(f"cannot combine results of {part['device']} {part['versions']} with "
                             f"{first['device']} {first['versions']}")
    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: (r["model"], r["k"], r["concurrency"]))
    merged = {key: {k: v for part in parts for k, v in part.get(key, {}).items()}
              for key in ("versions", "projection", "same_as_nospec", "greedy_check", "runs")}
    for engine, why in (invalid or {}).items():
        hit = [r for r in rows if f"{r['model']}/fork_k{r['k']}" == engine]
        if not hit:
            raise ValueError(f"--invalid {engine}: no rows of that engine")
        for row in hit:
            row["invalid"] = why
    # the projection's two depths may come from different calls; recomputed, so an invalid engine's steps go
    merged["projection"] = projection(merged["runs"], rows)
    merged["notes"] = [n for part in parts for n in part.get("notes", [])] + list(notes or [])
    return {**first, **merged, "rows": rows, "goal": goal(rows),
            "command": " ; ".join(part["command"] for part in parts),
            "date": max(part["date"] for part in parts), "seconds": sum(part["seconds"] for part in parts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--upstream-site", type=Path, help="folder holding upstream vLLM's pristine `vllm` package")
    parser.add_argument("--fork-site", type=Path, help="folder holding the fork's `vllm` (install-into'd site)")
    parser.add_argument("--pair", type=Path, default=ROOT / ".kimi" / "models" / "trained",
                        help="the trained reference pair (target/, drafter/)")
    parser.add_argument("--models", nargs="+", default=["pair", "kimi_slice"], choices=["pair", "kimi_slice"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--ks", type=int, nargs="+", default=list(PAIR_KS))
    parser.add_argument("--slice-ks", type=int, nargs="+", default=list(SLICE_KS))
    parser.add_argument("--v1-ks", type=int, nargs="*", default=[3],
                        help="k values where the fork also runs held on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0)")
    parser.add_argument("--v2-ks", type=int, nargs="*", default=[],
                        help="k values where the fork also runs held on vLLM's V2 runner (VLLM_USE_V2_MODEL_RUNNER=1)")
    parser.add_argument("--engines", nargs="+", metavar="NAME",
                        help="run only these engines of the plan (e.g. kimi_slice/nospec_shallow)")
    parser.add_argument("--parallel-start", action="store_true",
                        help="start the pair's engines at once, then measure them one at a time")
    parser.add_argument("--rounds", type=int, default=2,
                        help="with --parallel-start: measure every engine this many times, interleaved")
    parser.add_argument("--no-chart", dest="chart", action="store_false", help="no PNG (draw it after --combine)")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--slice-tokens", type=int, default=64, help="output tokens per request on the Kimi slice")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--slice-kv-gib", type=int, default=8)
    parser.add_argument("--fork-greedy", default="auto", help="KIMI_DRAFT_GREEDY for the fork's engines")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="leave out the KIMI_DRAFT_GREEDY=check engine of each model")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("KIMI_BUDGET_S", 540)))
    parser.add_argument("--job-timeout-s", type=float, default=240)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/perf_vs_upstream"))
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--chart-only", type=Path, metavar="JSON", help="redraw PNG and markdown from a result JSON")
    parser.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                        help="merge the results of several calls (e.g. one per model) into --out")
    parser.add_argument("--invalid", nargs="+", default=[], metavar="ENGINE=REASON",
                        help="with --combine: a fork engine whose rows do not count, and why")
    parser.add_argument("--note", action="append", default=[], help="with --combine: a note printed under the table")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)
    if args.chart_only:
        summary = json.loads(args.chart_only.read_text())
        write_outputs(args.chart_only.parent, summary)
        return 0
    if args.combine:
        bad = [item for item in args.invalid if "=" not in item]
        if bad:
            parser.error(f"--invalid takes ENGINE=REASON (e.g. kimi_slice/fork_k3=why), got {bad}")
        invalid = dict(item.split("=", 1) for item in args.invalid)
        try:
            summary = combine([json.loads(path.read_text()) for path in args.combine], invalid, args.note)
        except ValueError as exc:
            parser.error(str(exc))
        write_outputs(args.out, summary)
        return 0
    started = time.monotonic()
    deadline = started + args.budget_s
    given = argv if argv is not None else sys.argv[1:]
    args.command = " ".join(["python3", "benchmarks/perf_vs_upstream.py", *given])
    args.date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.engine = ({"dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "seed": 0,
                    "enable_prefix_caching": False} if args.cpu_smoke else
                   {"dtype": "bfloat16", "max_model_len": 1024, "seed": 0, "enable_prefix_caching": False,
                    "max_num_seqs": max(args.concurrency)})
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.cpu_smoke:
        args.upstream_site = args.upstream_site or args.fork_site
    if not args.upstream_site or not args.fork_site:
        parser.error("--upstream-site and --fork-site are required (the same folder with --cpu-smoke is allowed)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))

    pair_prompts = slice_dirs = None
    if "pair" in args.models:
        from gpu_e2e import code_prompts

        if not (args.pair / "MANIFEST.json").is_file():
            raise SystemExit(f"perf: no trained pair in {args.pair} (python3 -m kimi models train-pair)")
        # the held-out files give about 50 prompts: larger batches repeat them (prefix caching is off)
        pair_prompts = code_prompts(args.pair / "target" / "tokenizer.json", min(max(args.concurrency), 48), 256)
    if "kimi_slice" in args.models:
        from kimi.models.kimi_slice import KIMI, TINY, write_slice

        slice_dirs = write_slice(args.scratch / "kimi-slice", layers=(SPEC_LAYERS - 1, SPEC_LAYERS),
                                 dims=TINY if args.cpu_smoke else KIMI)
    jobs = plan(args, pair_prompts, slice_dirs)
    log(f"{len(jobs)} engines, budget {args.budget_s:.0f} s: {', '.join(j['name'] for j in jobs)}")
    runs: dict[str, dict] = {}

    def report(job: dict) -> None:
        r = runs[job["name"]]
        log(f"{job['name']}: {r['status']} in {r['seconds']} s" + (f" (start {r.get('start_s')} s, {r.get('runner')})"
                                                                   if r["status"] == "done" else
                                                                   f": {r.get('error', '').strip()[-300:]}"))
        for c, entry in r.get("by_concurrency", {}).items():  # in the call's output too
            log(f"  c={c}: {entry['tok_s']:.1f} tok/s, tpot {entry['tpot_ms']:.2f} ms, tau {entry['tau']}, "
                f"steps {json.dumps({k: round(v, 3) for k, v in entry.get('steps', {}).items()})}")
        write_outputs(args.out, summarize(args, jobs, runs, started), chart=False)

    for model in dict.fromkeys(j["model"] for j in jobs):
        group = [j for j in jobs if j["model"] == model]
        if args.parallel_start and model == "pair":
            run_parallel(args, group, deadline, runs, report)
        else:
            run_serial(args, group, deadline, runs, report)
    summary = summarize(args, jobs, runs, started)
    write_outputs(args.out, summary, chart=args.chart)
    mismatch = [v for n, v in summary["versions"].items() if ("+kimi." in (v or "")) != (n == "fork")]
    if mismatch and not args.cpu_smoke:
        log(f"version mix-up: {summary['versions']} (upstream must be plain 0.26.0, the fork +kimi)")
        return 1
    log(f"rows: {len(summary['rows'])}, goal {summary['goal']}")
    return 0 if all(r.get("status") == "done" for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
