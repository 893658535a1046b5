"""The runs of ``benchmarks/parallel.py``: EAGLE-3 on DeepSeek-V3 targets across tensor- and
pipeline-parallel layouts on vLLM's CPU backend (gloo between the worker processes), each against the same target
on one rank without speculation.

A layout's run either serves the prompts (greedy tokens, spec-decode counters, start-up seconds) or is refused
before anything loads (the fork's pre-load check, ``kimi/drafter/serve_checks.py``, keeps the message).
The v0.32 line's vLLM cannot serve EAGLE-3 with pipeline parallelism on these targets; the fork serves it on CPU (patch
``0022-eagle3-pipeline-parallel``) and refuses it on GPUs. Needs the fork's venv (vLLM, torch).

With ``backend="ray"`` the multi-worker layouts go through vLLM's Ray executor
(``distributed_executor_backend="ray"``) on a local Ray cluster (:func:`local_ray`, ``pip install ray``), each
against the same target on one rank; the v0.32 line's vLLM refuses Ray on its CPU backend (:data:`RAY_ON_CPU`), the fork
serves it (patch ``0021-cpu-ray-executor``).

With ``backend="serve"`` the layouts of :data:`SERVE_LAYOUTS` (PP 2) run as ``vllm serve`` (vLLM's multiprocessing
executor), the prompts sent at once by the official ``openai`` client, each against the same target on one rank
(:func:`serve_over_http`).
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from kimi.e2e.engine import GreedyRun, identical, vllm_greedy
from kimi.e2e.presets import CPU_ENGINE
from kimi.errors import KimiError
from kimi_lab.bench.hardware import cpu_groups

#: (tensor_parallel_size, pipeline_parallel_size) of the runs, one rank first (the reference); PP 3 has a middle
#: stage, which receives aux states, makes its own and sends both on.
LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2), (1, 3))
#: The layouts run through vLLM's Ray executor (``backend="ray"``), as a multi-node site runs them.
RAY_LAYOUTS = ((2, 1), (1, 2), (2, 2))
#: The layouts served by ``vllm serve`` (``backend="serve"``): PP 2, what a Hopper site runs Kimi-K2 across nodes with.
SERVE_LAYOUTS = ((1, 2),)
#: What the refusal of an unservable layout says (``check_pipeline_parallel``).
REFUSED = "EAGLE-3 with pipeline_parallel_size="
#: What the v0.32 line's vLLM says when its Ray executor starts on the CPU backend: ``CpuPlatform`` keeps the empty
#: ``ray_device_key`` of ``Platform``, and ``initialize_ray_cluster`` (``vllm/v1/executor/ray_utils.py``) raises
#: this right after ``ray.init``, before any worker or weight (upstream vllm#21602, closed as stale).
RAY_ON_CPU = "current platform cpu does not support ray"


def omp_bind(workers: int, cores: list[list[int]] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` CPU workers on one host: the CPUs this process may use,
    grouped by physical core (``cores``, default :func:`kimi_lab.bench.hardware.cpu_cores`), split into ``workers``
    contiguous runs of whole cores joined by ``|`` (``"0|1"`` for two workers on CPUs 0 and 1); with fewer cores
    than workers the CPUs are split, and with fewer CPUs one CPU each, shared in turn (``"0|1|0|1"``). vLLM's
    automatic binding wants a NUMA node per worker, which small hosts lack."""
    return "|".join(",".join(str(c) for c in group) for group in cpu_groups(workers, cores))


@contextmanager
def bound_threads(workers: int):
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` (:func:`omp_bind`) unless the caller set it; restored
    after."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or workers == 1:
        yield
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(workers)
    try:
        yield
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]


class Captured:
    """What :func:`captured_stderr` caught: ``text``, set when the block ends."""

    text = ""


@contextmanager
def captured_stderr():
    """File descriptor 2 into a temporary file while the block runs (vLLM's engine-core process inherits it, and
    prints there the traceback of a failed start-up that ``LLM(...)`` only calls "root cause above"), written to
    the real stderr when the block ends; yields a :class:`Captured` whose ``text`` is set then."""
    import sys
    import tempfile

    captured = Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace")
            sys.stderr.write(captured.text)
            sys.stderr.flush()


def root_cause(text: str) -> str | None:
    """The last ``SomeError: message`` line at the start of a line of ``text`` (a traceback's last line), or
    None."""
    found = re.findall(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$", text, re.MULTILINE)
    return f"{found[-1][0]}: {found[-1][1].strip()}" if found else None


def serve_layout(target: str, prompt_ids: list[list[int]], tokens: int, tp: int, pp: int,
                 spec: dict | None, engine: dict = CPU_ENGINE,
                 backend: str | None = None) -> tuple[GreedyRun | None, dict]:
    """One engine at ``tp`` x ``pp`` (vLLM's default executor, :func:`executor`, unless ``backend`` names one
    (``"ray"``: a Ray cluster must be reachable, :func:`local_ray`); ``engine``: float32 with
    torch.compile by default,
    since the v0.32 line's CPU workers allocate the pipeline's intermediate tensors in the compile warm-up, so an eager
    engine with ``pipeline_parallel_size > 1`` fails its first step on the later stages): ``(run, entry)`` where
    ``entry`` holds ``status`` (``done``, ``refused`` before loading, or ``error``), the seconds, and on ``done``
    the start-up seconds and counters; ``run`` is None unless done. With ``backend`` the engine-core's stderr is
    read (:func:`captured_stderr`) so that a failed start-up is reported with its root cause first."""
    began = time.monotonic()
    layout = {**engine, "tensor_parallel_size": tp, "pipeline_parallel_size": pp}
    if backend is not None:
        layout["distributed_executor_backend"] = backend
    captured = Captured()
    try:
        with bound_threads(tp * pp), (captured_stderr() if backend is not None else nullcontext(captured)) \
                as captured:
            run = vllm_greedy(target, prompt_ids, tokens, speculative=spec, **layout)
    except Exception as exc:  # a refusal names the fix; anything else is reported, not raised
        cause = root_cause(captured.text)
        text = f"{cause} (in the engine core; LLM() raised: {exc})" if cause and cause not in str(exc) else str(exc)
        return None, {**failure(text), "seconds": round(time.monotonic() - began, 1)}
    return run, {"status": "done", "start_s": run.start_s, "seconds": round(time.monotonic() - began, 1),
                 "counters": dict(run.counters)}


def serve_over_http(target: str, prompt_ids: list[list[int]], tokens: int, tp: int, pp: int, spec: dict | None,
                    logs: Path, engine: dict = CPU_ENGINE) -> tuple[GreedyRun | None, dict]:
    """The layout as ``vllm serve`` (``engine`` as its flags, ``--tensor-parallel-size`` / ``--pipeline-parallel-size``,
    vLLM's multiprocessing executor, OMP threads bound per worker), asked by the official ``openai`` client: every
    prompt at once, one greedy completion each of ``tokens`` tokens (EOS ignored, token ids returned). Same
    ``(run, entry)`` as :func:`serve_layout`; ``entry`` also counts the ``requests`` and those that ``failed``
    (status other than ok: an HTTP error, a hang, a dropped connection), and a run with a failed request is
    ``error``. The server's log is ``logs/serve-tp{tp}-pp{pp}-{spec or none}.log``; a server that does not start is
    reported from it (the fork's refusal as ``refused``)."""
    from kimi.e2e.server import VllmServer, serve_args, vllm_command
    from kimi_lab.bench.torture import Call, client, greedy_params, send_all

    began = time.monotonic()
    args = [*serve_args({**engine, **({"speculative_config": spec} if spec else {})}),
            "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    log = logs / f"serve-tp{tp}-pp{pp}-{'eagle3' if spec else 'none'}.log"
    with bound_threads(tp * pp), VllmServer(vllm_command(), target, args, log) as server:
        try:
            server.start(timeout=900)
        except KimiError as exc:
            text = log.read_text(errors="replace") if log.exists() else str(exc)
            return None, {**failure(text), "seconds": round(time.monotonic() - began, 1)}
        start_s = round(time.monotonic() - began, 1)
        calls = [Call(f"prompt {i}", "parallel", {"prompt": ids, **greedy_params(tokens)})
                 for i, ids in enumerate(prompt_ids)]
        answered = send_all(client(server.base), server.model, calls)
        counters = server.counters()
    outcomes = [answered[c.name] for c in calls]
    failed = [f"{c.name}: {o.status} {o.error}".strip() for c, o in zip(calls, outcomes, strict=True)
              if o.status != "ok"]
    entry = {"start_s": start_s, "seconds": round(time.monotonic() - began, 1), "counters": counters,
             "requests": len(calls), "failed": len(failed)}
    if failed:
        return None, {**entry, "status": "error", "error": "; ".join(failed)[-1500:]}
    run = GreedyRun([o.choices[0]["token_ids"] for o in outcomes], counters, start_s=start_s)
    return run, {**entry, "status": "done"}


def executor(tp: int, pp: int, backend: str = "mp") -> str:
    """The executor of a run: ``uni`` (in the engine's process) for one worker; for more, the one vLLM picks when
    none is named, ``mp`` (one process per worker on this host), or ``backend`` (``ray``; ``serve``: ``vllm serve``
    with vLLM's ``mp`` executor) when named."""
    return "uni" if tp * pp == 1 else backend


def failure(text: str) -> dict:
    """``{"status", "error"}`` of an engine that did not start: ``refused`` with the fork's message alone (pydantic
    puts "1 validation error for SpeculativeConfig" before it and the input and a link after it),
    ``unsupported`` when vLLM itself refuses the executor before loading (:data:`RAY_ON_CPU`), else ``error``;
    both with the text's last 1500 characters."""
    at = text.find(REFUSED)
    if at < 0:
        return {"status": "unsupported" if RAY_ON_CPU in text else "error", "error": text[-1500:]}
    # pydantic follows the message with " [type=value_error, input_value=...]" and a link to its docs
    return {"status": "refused", "error": text[at:].split(" [type=")[0].split("\n")[0].strip()}


def tau(counters: dict) -> float | None:
    """Mean accepted length per verification, ``1 + accepted / drafts``; None without drafts."""
    drafts = counters.get("num_drafts") or 0
    return round(1 + counters["num_accepted_tokens"] / drafts, 4) if drafts else None


def model_rows(name: str, target: str, drafters: dict[str, str], prompt_ids: list[list[int]], tokens: int, k: int,
               log, backend: str = "mp", logs: Path | None = None,
               layouts: tuple[tuple[int, int], ...] | None = None) -> list[dict]:
    """Every layout of :data:`LAYOUTS` for one target (``backend="ray"``: the layouts of :data:`RAY_LAYOUTS` through
    vLLM's Ray executor; ``"serve"``: those of :data:`SERVE_LAYOUTS` through ``vllm serve``, :func:`serve_over_http`,
    its logs under ``logs``): without speculation and with each drafter style of ``drafters`` (style -> folder). Rows
    compare each run's greedy tokens with the target alone on one rank (``identical_to_tp1``) and, with
    speculation, with the target alone at the same layout (``identical_to_layout_nospec``) and its counters with
    the same drafter on one rank (``same_counters_as_tp1``); τ from the counters. Layouts that cannot start are rows
    with their status. With ``ray`` or ``serve`` the one-rank runs are not rows (they are the ``mp`` run's) and are
    made only once such a run has served, to be compared with. ``layouts`` ((tp, pp) pairs) keeps only those of the
    backend's layouts."""
    rows: list[dict] = []
    one_rank: dict[str, GreedyRun | None] = {}  # style -> the run at TP 1 x PP 1 ("none": the reference)
    nospec: dict[tuple[int, int], GreedyRun] = {}
    specs = {style: None if drafter is None else {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
             for style, drafter in [("none", None), *drafters.items()]}

    def at_one_rank(style: str) -> GreedyRun | None:
        if style not in one_rank:
            log(f"{name}: tp 1 pp 1, drafter {style} (the one-rank run to compare the {backend} runs with)")
            one_rank[style] = serve_layout(target, prompt_ids, tokens, 1, 1, specs[style])[0]
        return one_rank[style]

    for tp, pp in {"mp": LAYOUTS, "ray": RAY_LAYOUTS, "serve": SERVE_LAYOUTS}[backend]:
        if layouts is not None and (tp, pp) not in layouts:
            continue
        for style, spec in specs.items():
            log(f"{name}: tp {tp} pp {pp}, drafter {style}" + (f", {backend} executor" if backend != "mp" else ""))
            if backend == "serve":
                run, entry = serve_over_http(target, prompt_ids, tokens, tp, pp, spec, logs or Path("."))
            else:
                run, entry = serve_layout(target, prompt_ids, tokens, tp, pp, spec,
                                          backend=None if backend == "mp" else backend)
            row = {"model": name, "tp": tp, "pp": pp, "executor": executor(tp, pp, backend), "drafter": style,
                   "k": k if spec else 0, **entry}
            if run is not None:
                if (tp, pp) == (1, 1):
                    one_rank[style] = run
                elif backend != "mp":
                    at_one_rank("none")
                    at_one_rank(style)
                if spec is None:
                    nospec[(tp, pp)] = run
                else:
                    row["tau"] = tau(run.counters)
                    if (tp, pp) in nospec:
                        row["identical_to_layout_nospec"] = identical(run, nospec[(tp, pp)])
                    if (tp, pp) != (1, 1) and one_rank.get(style) is not None:
                        row["same_counters_as_tp1"] = run.counters == one_rank[style].counters
                reference = one_rank.get("none")
                row["identical_to_tp1"] = identical(run, reference) if reference is not None else None
            log(f"{name}: tp {tp} pp {pp}, drafter {style}: {row['status']} "
                + (f"tau {row.get('tau')}, {row['identical_to_tp1']}" if run is not None else row["error"][:200]))
            rows.append(row)
    return rows


def ray_cpus(layouts=RAY_LAYOUTS) -> int:
    """The CPUs a local Ray cluster declares so that each of ``layouts`` gets its placement group: the largest
    layout's bundles as the fork sizes them on this host (one per worker, each as large as the largest group
    :func:`omp_bind` gives: ``kimi.cpu_platform.ray_workers.cpus_per_worker``; CPUs shared in turn when the workers
    outnumber them count once per worker), and at least this process's CPUs."""
    return max(len(os.sched_getaffinity(0)),
               *(tp * pp * max(map(len, cpu_groups(tp * pp))) for tp, pp in layouts))


@contextmanager
def local_ray(num_cpus: int | None = None):
    """A Ray cluster for the block: the one ``RAY_ADDRESS`` names if the caller set it (a site's cluster, left as
    it is), else a local one started by this process (``ray.init``: a head node whose GCS, raylet and workers are
    this process's children, ``num_cpus`` CPUs, default this process's) and stopped after (``ray.shutdown``), with
    ``RAY_ADDRESS`` naming it meanwhile so that vLLM's engine-core process joins it. Yields the address."""
    if os.environ.get("RAY_ADDRESS"):
        yield os.environ["RAY_ADDRESS"]
        return
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    context = ray.init(num_cpus=num_cpus or len(os.sched_getaffinity(0)), include_dashboard=False)
    os.environ["RAY_ADDRESS"] = context.address_info["gcs_address"]
    try:
        yield os.environ["RAY_ADDRESS"]
    finally:
        del os.environ["RAY_ADDRESS"]
        ray.shutdown()


def boundary_ids(num_layers: int) -> tuple[int, int, int]:
    """Aux ids (vLLM's convention, the state entering layer k) for a two-stage pipeline of ``num_layers`` layers as
    vLLM splits it (``get_pp_indices``): one inside the first stage, one exactly at the boundary (the state entering
    the second stage's first layer, which the first stage computes), one inside the second stage ((2, 3, 5) for
    6 layers)."""
    from vllm.distributed.utils import get_pp_indices

    boundary = get_pp_indices(num_layers, 0, 2)[1]
    return boundary - 1, boundary, num_layers - 1


def boundary_drafter(drafter: Path, target: Path, out: Path) -> tuple[Path, tuple[int, ...]]:
    """A copy of ``drafter`` in ``out`` whose config names the aux ids of :func:`boundary_ids` for ``target`` (a
    drafter wired to other layers than it was trained on: its acceptance drops, its output must not change); returns
    the folder and the ids. The copy is written beside ``out`` and renamed into place."""
    import json
    import shutil

    num_layers = int(json.loads((target / "config.json").read_text())["num_hidden_layers"])
    ids = boundary_ids(num_layers)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(drafter, staging)
    config = json.loads((staging / "config.json").read_text())
    config.update(eagle_aux_hidden_state_layer_ids=list(ids), eagle_aux_hidden_state_layer_ids_convention="layer_input")
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out, ids


def reference_drafters(models: Path) -> dict[str, str]:
    """The reference models' drafters by style (``kimi models make``: ``drafter-llama``, ``drafter-mla``)."""
    return {style: str(models / f"drafter-{style}") for style in ("llama", "mla")}
