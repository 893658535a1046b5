"""The engines of an adaptive-verification call, the prompt sets they measure, and the CPU's upstream site.

Five engines per model (:data:`ENGINES`), each a :mod:`kimi_lab.bench.perf` job (``variant`` ``fork``, ``upstream`` or
``nospec`` picks its vLLM through :func:`kimi_lab.bench.perf.plan.variant_env`), measuring every point
(:func:`kimi_lab.bench.perf.measure.points`): a prompt set at a concurrency.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kimi.e2e.presets import PERF_CPU_SMOKE, PERF_GPU, PERF_SIDE_BY_SIDE
from kimi.errors import KimiError

#: The draft tokens of the fixed-k engines and of adaptive verification (its most per request and step).
K = 3
#: Upstream's batch-size table as its docs suggest: ``[first, last, k]`` per inclusive batch-size range, with
#: ``num_speculative_tokens`` at the table's largest k.
BATCH_SIZE_TABLE = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]
TABLE_K = 5

#: engine -> (variant: which vLLM, what it adds to EAGLE-3's speculative config; None: no speculation), in plan
#: order. ``adaptive`` is the engine every ratio is of.
ENGINES = {
    "nospec": ("nospec", None),
    "upstream_k3": ("upstream", {"num_speculative_tokens": K}),
    "upstream_table": ("upstream", {"num_speculative_tokens": TABLE_K,
                                    "num_speculative_tokens_per_batch_size": BATCH_SIZE_TABLE}),
    "fork_k3": ("fork", {"num_speculative_tokens": K}),
    "adaptive": ("fork", {"num_speculative_tokens": K, "enable_adaptive_verification": True}),
}
OTHERS = tuple(e for e in ENGINES if e != "adaptive")

#: Prompt sets: in-domain (held-out code), off-domain (:mod:`kimi.models.offdomain`), and half of each in one batch.
SETS = ("in", "off", "mixed")
CONCURRENCY = (1, 8, 32, 64)

#: The patches of the series an upstream engine keeps on CPU: the pristine release's CPU platform
#: refuses to start without Triton's CPU backend ("vLLM on x86 CPUs requires Triton (triton-cpu)"), which patch 0023
#: lets the interpreter stand for. Patch 0024 (the torch-only platform's entry point, not a ``vllm/`` file) acts
#: through the installed distribution's metadata, so it stays too; every other ``vllm/`` change is taken out.
UPSTREAM_CPU_KEEPS = ("0023-triton-interpreter-is-a-driver",)
UPSTREAM_CPU_NOTE = ("upstream on CPU: the laid vllm/ with every vllm/ hunk of the series taken out except patch "
                     "0023 (Triton's interpreter as a driver: without it the release's CPU platform refuses to "
                     "start, \"vLLM on x86 CPUs requires Triton (triton-cpu)\"); patch 0024 (pyproject.toml: the "
                     "torch-only CPU platform as a vLLM platform plugin) acts through the installed metadata; the "
                     "copy keeps the laid tree's version string")


def engine_options(engine: str, adaptive_k: int = K) -> dict | None:
    """What ``engine`` (:data:`ENGINES`) adds to EAGLE-3's speculative config (None: no speculation); the
    ``adaptive`` engine's ``num_speculative_tokens`` is ``adaptive_k`` (the most drafts per request and step its
    budget and draft depth choose from).

    Raises:
        KimiError: an unknown engine.
    """
    if engine not in ENGINES:
        raise KimiError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    extra = ENGINES[engine][1]
    return {**extra, "num_speculative_tokens": adaptive_k} if engine == "adaptive" else extra


def speculative_config(engine: str, drafter: str, adaptive_k: int = K) -> dict | None:
    """vLLM's ``speculative_config`` of ``engine`` (:func:`engine_options`) with ``drafter``; None for no
    speculation.

    Raises:
        KimiError: an unknown engine.
    """
    extra = engine_options(engine, adaptive_k)
    return None if extra is None else {"method": "eagle3", "model": drafter, **extra}


def measurement_points(sets: list[str], concurrency: list[int]) -> list[list]:
    """``[set, c]`` per point, concurrency by concurrency: every set at each c, but ``mixed`` only from c = 2 (one
    request cannot be half of each)."""
    return [[name, c] for c in concurrency for name in sets if not (name == "mixed" and c < 2)]


def interleave(a: list, b: list) -> list:
    """``a[0], b[0], a[1], b[1], ...`` up to the shorter list: any ``c`` requests taken in order are half of each."""
    return [x for pair in zip(a, b, strict=False) for x in pair]


def prompt_sets(tokenizer_json: Path, count: int, off_kind: str, off_lengths: tuple[int, int]) -> dict:
    """``{"in", "off", "mixed"}``: ``count`` held-out code prompts (24..256 tokens), ``count`` off-domain prompts of
    ``off_kind`` (:func:`kimi.models.offdomain.offdomain_prompts`, ``off_lengths`` = (min, max) tokens), and the
    two interleaved (:func:`interleave`)."""
    from kimi.models.offdomain import offdomain_prompts
    from kimi.models.prompts import code_prompt_ids

    code = code_prompt_ids(tokenizer_json, count, 256)
    off = offdomain_prompts(off_kind, tokenizer_json, count, off_lengths[1], off_lengths[0])
    return {"in": code, "off": off, "mixed": interleave(code, off)}


def engine_settings(device: str, concurrency: list[int], kv_bytes: int) -> dict:
    """The ``LLM(...)`` settings every engine of a call shares: on CPU eager float32 (``PERF_CPU_SMOKE``); on a GPU
    vLLM's defaults (``PERF_GPU``) with CUDA graphs for every batch size up to the largest verification batch
    (adaptive verification profiles its cost curves at the captured sizes); room for the largest concurrency and a
    fixed KV cache of ``kv_bytes``."""
    if device == "cpu":
        return {**PERF_CPU_SMOKE, "max_num_seqs": max(concurrency), "kv_cache_memory_bytes": kv_bytes}
    largest = max(concurrency) * (TABLE_K + 1)
    sizes = sorted({*range(1, 9), *range(8, largest + 1, 8), *(c * (k + 1) for c in concurrency for k in (0, K))})
    return {**PERF_GPU, **PERF_SIDE_BY_SIDE, "max_num_seqs": max(concurrency), "kv_cache_memory_bytes": kv_bytes,
            "compilation_config": {"cudagraph_capture_sizes": [s for s in sizes if s <= largest]}}


def jobs_of(model: str, pair: Path, common: dict, engines: list[str] | None = None, adaptive_k: int = K
            ) -> list[dict]:
    """The engines of one model (``pair``: a folder with ``target/`` and ``drafter/``) in plan order, as
    :mod:`kimi_lab.bench.perf` jobs named ``<model>/<engine>`` (``engines``: only these; ``adaptive_k``: as
    :func:`speculative_config`); ``common``: what every job carries (``prompt_sets``, ``points``, ``tokens``,
    ``reps``, ``engine``, ...)."""
    jobs = []
    for engine, (variant, _) in ENGINES.items():
        if engines and engine not in engines:
            continue
        spec = speculative_config(engine, str(pair / "drafter"), adaptive_k)
        job = {**common, "name": f"{model}/{engine}", "model": model, "setting": engine, "variant": variant,
               "k": spec["num_speculative_tokens"] if spec else 0, "spec": spec, "target": str(pair / "target")}
        jobs.append(job)
    return jobs


def upstream_site(root: Path, dest: Path) -> dict:
    """Lay the CPU's upstream site at ``dest`` (``dest/vllm``): the laid tree's ``vllm/`` under ``root`` with the
    series' ``vllm/`` hunks taken out but those of :data:`UPSTREAM_CPU_KEEPS`
    (:func:`kimi.fork.revert.reverted_copy`). Returns ``{"kept", "removed", "files"}``: the patches kept and taken
    out, and the files changed.

    Raises:
        KimiError: the checkout is not synced, or its laid files do not hold the series' hunks.
    """
    from kimi.fork.layout import Layout
    from kimi.fork.patches import load_series
    from kimi.fork.revert import reverted_copy, under_vllm
    from kimi.fork.state import SyncState
    from kimi.fork.unidiff import parse

    layout = Layout.of(root)
    state = SyncState.load(layout.state_file)
    if state is None or state.failed or not (root / "vllm").is_dir():
        raise KimiError(f"no synced line laid at {root}: run python3 -m kimi setup")
    series = load_series(layout.patches_dir(state.line))
    touching = [p for p in series if any(under_vllm(fd.path) for fd in parse(p.diff, where=str(p.path)))]
    removed = [p for p in touching if p.name not in UPSTREAM_CPU_KEEPS]
    files = reverted_copy(root, dest, removed)
    return {"kept": [p.name for p in touching if p.name in UPSTREAM_CPU_KEEPS], "removed": [p.name for p in removed],
            "files": files}


def sites(args: argparse.Namespace, root: Path) -> dict:
    """Set ``args.fork_site`` and ``args.upstream_site`` for ``args.device``: on CPU the checkout's laid tree (the
    editable install) and an upstream site laid under ``args.scratch`` (:func:`upstream_site`; returned, with
    :data:`UPSTREAM_CPU_NOTE`); on a GPU the sites given (``--fork-site``, ``--upstream-site``: the GPU kit's).

    Raises:
        KimiError: on a GPU without both sites; on CPU as :func:`upstream_site`.
    """
    if args.device == "gpu":
        if not (args.fork_site and args.upstream_site):
            raise KimiError("--device gpu needs --fork-site and --upstream-site (benchmarks/gpu_call.sh sets "
                            "KIMI_SITE and KIMI_UPSTREAM_SITE)")
        return {"note": "upstream: the GPU kit's pristine copy of the release's vllm package"}
    args.fork_site = args.fork_site or root
    args.upstream_site = args.scratch / "upstream-site"
    return {**upstream_site(root, args.upstream_site), "note": UPSTREAM_CPU_NOTE}
