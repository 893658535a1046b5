"""EAGLE-3 on quantized targets: the library of ``benchmarks/quantized.py``.

The shipped pair widened to 128-multiple widths (``kimi.models.widen``: the same function, so that block-FP8 takes
the published 128 x 128 blocks; the shipped pair's widths allow 16, which no vLLM kernel takes), its drafter trained
on the bf16 target as a user would reuse one, served at k = 3 against the same target in the layouts users serve
(``kimi.models.quantize``: block-FP8 as DeepSeek-V3 / Kimi-K2 write it, INT4 W4A16 routed experts as Kimi-K2.5 writes
it), with an FP8 KV cache on the target, and with the drafter's own KV cache dtype and attention backend
(``speculative_config``'s ``kv_cache_dtype`` / ``attention_backend``, which the v0.32 line's V2 EAGLE speculator
applies through ``SpeculativeConfig.apply_draft_overrides``).

Each :class:`Variant` is a "model" of ``kimi_lab.bench.perf``'s plan: its engines (``nospec``, ``fork_k3``,
``upstream_k3``) are perf_vs_upstream's, started side by side and measured in interleaved rounds by
``kimi_lab.bench.perf.orchestrate.run_parallel``. What this module adds: the variants, their targets, and the rows
(greedy output against the same target without speculation, τ against the bf16 target's, fork against upstream).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kimi_lab.bench.perf.analysis import round_ratios
from kimi_lab.bench.results import header

K = 3


@dataclass(frozen=True)
class Variant:
    """One target configuration of the run.

    ``scheme``: the ``kimi models quantize`` scheme of the target (None: the bf16 target as shipped);
    ``kv_cache_dtype``: the target's KV cache dtype (``LLM(kv_cache_dtype=...)``; the drafter inherits it unless
    ``draft`` says otherwise); ``draft``: additions to ``speculative_config`` (the drafter's ``kv_cache_dtype``,
    ``attention_backend``); ``engine``: additions to every engine's ``LLM(...)`` settings; ``engines``: which of
    ``nospec``, ``fork``, ``upstream`` run; ``baseline``: the variant whose ``nospec`` engine this one's greedy
    output is compared with (default: its own); ``environ``: environment variables of its engines' processes.
    """

    name: str
    scheme: str | None = None
    kv_cache_dtype: str = "auto"
    draft: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)
    engines: tuple[str, ...] = ("nospec", "fork", "upstream")
    baseline: str | None = None
    environ: dict = field(default_factory=dict)

    @property
    def reference(self) -> str:
        return self.baseline or self.name


#: The control of an engine's own batch numerics: every request alone (one sequence per step), so its greedy output
#: is what the same engine gives without batching. Set against the batched ``nospec`` engine of the same target and
#: KV cache, it shows how many sequences batching alone flips; set against that variant's fork, how many speculation
#: flips beyond that.
ONE_BY_ONE = {"max_num_seqs": 1, "compilation_config": {"cudagraph_capture_sizes": [1]}}
#: The block-FP8 targets' engines: the FP8 GEMMs on vLLM's precompiled CUTLASS kernels instead of DeepGEMM. Where
#: DeepGEMM is installed (the H200 kit) the v0.32 line's vLLM prefers it for 128 x 128 blocks and JIT-compiles its
#: kernels at start (``VLLM_DEEP_GEMM_WARMUP=relax``): 2377 for the widened pair, of which 910 were done after
#: 4 min 19 s with six FP8 engines starting at once, more than a device call can wait for (quantized H200 run 3,
#: benchmarks/results/logs/quantized-h200-3).
NO_DEEP_GEMM = {"VLLM_USE_DEEP_GEMM": "0"}

#: The run's variants, in plan order. Fork against upstream on the three weight layouts and on the bf16 target with
#: an FP8 KV cache; the FP8 target's KV cache and the drafter's own KV dtype and backend on the fork only (lossless
#: and τ; the speed of those paths is not the fork's); the one-by-one controls (:data:`ONE_BY_ONE`) of the bf16
#: target with each KV cache dtype and of the block-FP8 target; and the fork on the block-FP8 target with its greedy
#: draft-head hook off (``KIMI_DRAFT_GREEDY=upstream``, upstream's drafting path), which tells the hook's part in
#: the fork's greedy output from the rest of the fork's.
VARIANTS = (
    Variant("bf16"),
    Variant("fp8-block", "fp8-block", environ=NO_DEEP_GEMM),
    Variant("int4-experts", "int4-experts"),
    Variant("bf16+kv-fp8", kv_cache_dtype="fp8"),
    Variant("fp8-block+kv-fp8", "fp8-block", kv_cache_dtype="fp8", engines=("nospec", "fork"), environ=NO_DEEP_GEMM),
    Variant("fp8-block+kv-fp8+drafter-bf16-kv-triton", "fp8-block", kv_cache_dtype="fp8",
            draft={"kv_cache_dtype": "auto", "attention_backend": "TRITON_ATTN"}, engines=("fork",),
            baseline="fp8-block+kv-fp8", environ=NO_DEEP_GEMM),
    Variant("bf16+one-by-one", engine=ONE_BY_ONE, engines=("nospec",), baseline="bf16"),
    Variant("bf16+kv-fp8+one-by-one", kv_cache_dtype="fp8", engine=ONE_BY_ONE, engines=("nospec",),
            baseline="bf16+kv-fp8"),
    Variant("fp8-block+one-by-one", "fp8-block", engine=ONE_BY_ONE, engines=("nospec",), baseline="fp8-block",
            environ=NO_DEEP_GEMM),
    Variant("fp8-block+draft-greedy-upstream", "fp8-block", engines=("fork",), baseline="fp8-block",
            environ={**NO_DEEP_GEMM, "KIMI_DRAFT_GREEDY": "upstream"}),
)
#: On CPU (``--cpu-smoke``): the v0.32 line's CPU backend runs neither quantized layout (docs/reference-models.md).
CPU_VARIANTS = ("bf16",)


def pick(names: list[str] | None, cpu: bool) -> list[Variant]:
    """The variants named (all by default; on CPU :data:`CPU_VARIANTS`), each with its baseline's variant first
    where it lacks an engine of its own (a ``nospec`` to compare with, or, for a control, the fork it checks).

    Raises:
        ValueError: an unknown name.
    """
    known = {v.name: v for v in VARIANTS}
    names = list(dict.fromkeys(names or (CPU_VARIANTS if cpu else known)))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}: choose from {', '.join(known)}")
    chosen = [known[n] for n in names]
    needed = {v.reference for v in chosen if v.engines != ("nospec", "fork", "upstream")} - set(names)
    return [v for v in VARIANTS if v.name in needed] + chosen


#: Written into ``--scratch`` after every engine: the call's variants, engine results and targets, which a later
#: call on the same machine adds its own to (``--merge``).
RUNS_FILE = "quantized-runs.json"


def earlier_call(path, measured: dict) -> dict:
    """The :data:`RUNS_FILE` at ``path`` that an earlier call left, checked before this call runs anything.

    ``measured``: this call's measurement settings (concurrency, tokens, rounds, ...); the earlier call's must be
    the same, or the merged report would show its rows under settings it did not run with.

    Raises:
        ValueError: no such file, not the runs file of a call of ``benchmarks/quantized.py``, or other settings.
    """
    from pathlib import Path

    from kimi.fork.fsutil import read_json_object

    path = Path(path)
    try:
        data = read_json_object(path)
    except ValueError as exc:
        raise ValueError(f"{exc}; run without --merge") from None
    if data is None:
        raise ValueError(f"no earlier call's results in {path}")
    if not isinstance(data.get("variants"), list) or not isinstance(data.get("runs"), dict) or not isinstance(
            data.get("targets"), dict):
        raise ValueError(f"{path} is not a runs file of benchmarks/quantized.py; run without --merge")
    if data.get("measured") != measured:
        raise ValueError(f"the earlier call measured with {data.get('measured')}, this one with {measured}: "
                         "give both calls the same settings")
    missing = [p for p in data["targets"].values() if not (Path(p) / "config.json").is_file()]
    if missing:
        raise ValueError(f"the earlier call's targets are gone ({', '.join(missing)}); run without --merge")
    return data


def merged(earlier: dict | None, variants: list[Variant], runs: dict[str, dict]) -> tuple[list[Variant], dict]:
    """The variants and engine results of a report that adds this call's ``variants`` and ``runs`` to an earlier
    call's (``earlier``: its :data:`RUNS_FILE`, ``{"variants": [names], "runs": {engine: result}, ...}``, or None):
    the union of the variants in :data:`VARIANTS` order, and each engine's result, this call's replacing the
    earlier call's for an engine both ran (a variant run again is measured again)."""
    if not earlier:
        return variants, runs
    current = {v.name for v in variants}
    kept = {n: r for n, r in earlier["runs"].items() if n.split("/")[0] not in current}
    return [v for v in VARIANTS if v.name in current | set(earlier["variants"])], {**kept, **runs}


def variant_settings(v: Variant) -> dict:
    """What a result records of ``v``: its scheme, KV cache dtype, engine and drafter additions, engines, baseline."""
    return {"scheme": v.scheme or "bf16", "kv_cache_dtype": v.kv_cache_dtype, "engine": v.engine,
            "drafter_overrides": v.draft, "engines": list(v.engines), "baseline": v.reference,
            "environment": v.environ}


def jobs_of(variants: list[Variant], targets: dict[str, str], drafter: str, common: dict) -> list[dict]:
    """perf_vs_upstream jobs (``kimi_lab.bench.perf.measure``) for ``variants``: per variant its engines, named
    ``<variant>/nospec``, ``<variant>/fork_k3``, ``<variant>/upstream_k3``, the target from ``targets`` (by
    scheme, ``None`` for bf16) and the KV cache dtype in the engine settings of ``common``."""
    jobs = []
    for v in variants:
        base = {**common, "model": v.name, "target": targets[v.scheme], "env": v.environ,
                "engine": {**common["engine"], **v.engine, "kv_cache_dtype": v.kv_cache_dtype}}
        spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": K, **v.draft}
        for engine in v.engines:
            if engine == "nospec":
                jobs.append({**base, "name": f"{v.name}/nospec", "variant": "nospec", "k": 0, "spec": None})
            else:
                jobs.append({**base, "name": f"{v.name}/{engine}_k{K}", "variant": engine, "k": K, "spec": spec})
    return jobs


def _parts(entry: dict, ref: dict) -> dict[int, int] | None:
    """``{request index: the first output token index where it differs}`` for the requests whose greedy output
    differs between ``entry`` and ``ref`` (a length difference parts at the shorter one's end); None without both.
    Late parting under a batch-shape change is what near-tied logits give; a drafter fed wrong inputs cannot move
    a greedy output at all, so where a sequence parts is the evidence to set beside the controls."""
    from kimi.e2e.engine import common_prefix

    if not entry.get("tokens") or not ref.get("tokens"):
        return None
    return {i: common_prefix(a, b) for i, (a, b) in enumerate(zip(entry["tokens"], ref["tokens"], strict=True))
            if a != b}


def _differing(entry: dict, ref: dict) -> list[int] | None:
    """The request indices whose greedy output differs between ``entry`` and ``ref``; None without both."""
    parts = _parts(entry, ref)
    return None if parts is None else list(parts)


def _identical(entry: dict, ref: dict) -> list[int] | None:
    """[sequences equal in ``entry`` and ``ref``, sequences]; None without both."""
    differing = _differing(entry, ref)
    return None if differing is None else [len(ref["tokens"]) - len(differing), len(ref["tokens"])]


def _done(runs: dict, name: str) -> dict:
    run = runs.get(name, {})
    return run.get("by_concurrency", {}) if run.get("status") == "done" else {}


def rows(variants: list[Variant], runs: dict[str, dict]) -> list[dict]:
    """One row per (variant, concurrency) that its fork engine measured: ``identical`` (fork's greedy output
    against the reference ``nospec`` engine, [same, total]) and ``identical_upstream``, ``tau`` and
    ``tau_upstream``, ``tau_vs_bf16`` (τ over the bf16 target's at the same concurrency), tok/s of each engine,
    ``fork_vs_upstream`` (best rounds) with the per-round median and spread, and ``fork_vs_nospec``."""
    out = []
    bf16 = _done(runs, f"bf16/fork_k{K}")
    for v in variants:
        fork, up = _done(runs, f"{v.name}/fork_k{K}"), _done(runs, f"{v.name}/upstream_k{K}")
        base = _done(runs, f"{v.reference}/nospec")
        for c, f in fork.items():
            u, b, ref_tau = up.get(c, {}), base.get(c, {}), bf16.get(c, {}).get("tau")
            out.append({
                "variant": v.name, "scheme": v.scheme or "bf16", "kv_cache_dtype": v.kv_cache_dtype,
                "drafter_overrides": v.draft, "concurrency": int(c),
                "identical": _identical(f, b), "identical_upstream": _identical(u, b) if u else None,
                "differing": _differing(f, b), "differing_upstream": _differing(u, b) if u else None,
                "parts_at": _parts(f, b), "parts_at_upstream": _parts(u, b) if u else None,
                "tau": _round(f.get("tau")), "tau_upstream": _round(u.get("tau")),
                "tau_vs_bf16": _round(f["tau"] / ref_tau) if f.get("tau") and ref_tau else None,
                "fork_tok_s": _round(f["tok_s"], 1), "upstream_tok_s": _round(u.get("tok_s"), 1),
                "nospec_tok_s": _round(b.get("tok_s"), 1),
                "fork_vs_upstream": _round(f["tok_s"] / u["tok_s"]) if u.get("tok_s") else None,
                "fork_vs_nospec": _round(f["tok_s"] / b["tok_s"]) if b.get("tok_s") else None,
                **round_ratios(f, u),
            })
    return sorted(out, key=lambda r: ([v.name for v in variants].index(r["variant"]), r["concurrency"]))


def controls(variants: list[Variant], runs: dict[str, dict]) -> list[dict]:
    """One row per (control variant, concurrency): a variant with only a ``nospec`` engine (every request alone,
    :data:`ONE_BY_ONE`) against its baseline variant's engines. ``batched_nospec``: the baseline's ``nospec`` (run
    batched) against the control, [same, total], and ``differing_batched`` its differing request indices;
    ``fork`` / ``differing_fork``: the baseline's ``fork_k3`` against the control."""
    out = []
    for v in variants:
        if v.engines != ("nospec",):
            continue
        alone = _done(runs, f"{v.name}/nospec")
        batched, fork = _done(runs, f"{v.reference}/nospec"), _done(runs, f"{v.reference}/fork_k{K}")
        for c, a in alone.items():
            b, f = batched.get(c, {}), fork.get(c, {})
            out.append({"control": v.name, "of": v.reference, "kv_cache_dtype": v.kv_cache_dtype, "concurrency": int(c),
                        "batched_nospec": _identical(b, a), "differing_batched": _differing(b, a),
                        "fork": _identical(f, a), "differing_fork": _differing(f, a),
                        "parts_at_batched": _parts(b, a), "parts_at_fork": _parts(f, a)})
    return sorted(out, key=lambda r: ([v.name for v in variants].index(r["control"]), r["concurrency"]))


def _round(x: float | None, digits: int = 3) -> float | None:
    return round(x, digits) if x is not None else None


def failures(jobs: list[dict], runs: dict[str, dict]) -> dict[str, str]:
    """``{engine: "status: the last line of its error that says something"}`` for every engine that did not finish
    (``"not run"`` for one the run never reached; pydantic's closing "For further information visit ..." line is
    skipped, so a refusal at config time keeps its reason)."""
    out = {}
    for job in jobs:
        run = runs.get(job["name"], {"status": "not run"})
        if run.get("status") != "done":
            lines = [ln.strip() for ln in (run.get("error") or "").splitlines()
                     if ln.strip() and not ln.strip().startswith("For further information")]
            out[job["name"]] = (f"{run.get('status')}: {lines[-1]}" if lines else str(run.get("status")))[:400]
    return out


def totals(table: list[dict]) -> dict:
    """Over all rows: identical / total greedy sequences (fork), crashes are counted by :func:`failures`; the
    median fork/upstream of the per-round ratios over every row that has them, and the rounds that every such row
    measured (fewer than ``--rounds`` when the time budget ran out)."""
    same = [r["identical"] for r in table if r["identical"]]
    per_row = [r["fork_vs_upstream_rounds"] for r in table if r.get("fork_vs_upstream_rounds")]
    ratios = [x for rounds in per_row for x in rounds]
    return {"identical": [sum(s for s, _ in same), sum(n for _, n in same)],
            "fork_vs_upstream_median": round(statistics.median(ratios), 4) if ratios else None,
            "rounds_measured": min(map(len, per_row)) if per_row else None}


def _rounds(planned: int, total: dict) -> str:
    """The rounds of a report: those planned, and those measured where fewer (a single round's fork/upstream ratio
    is one sample of a shared host's noise)."""
    measured = total.get("rounds_measured")
    if measured is None or measured >= planned:
        return f"{planned} interleaved rounds"
    return (f"{planned} interleaved rounds planned, {measured} measured (the time budget ran out; each fork/upstream "
            f"ratio below is {'one sample' if measured == 1 else f'{measured} samples'})")


def _parting(parts: dict | None) -> str:
    """``{index: token}`` as ``1@22, 3@1`` (JSON keys are strings once written); "-" for none."""
    return ", ".join(f"{i}@{t}" for i, t in sorted((int(i), t) for i, t in parts.items())) if parts else "-"


def markdown(result: dict) -> list[str]:
    """``quantized.md``: the settings, one table row per (variant, concurrency), the engines that failed."""
    s = result["settings"]
    lines = [*header("EAGLE-3 on quantized targets", result["command"], result["date"]),
             *([f"- merged over {len(result['commands'])} calls: " + "; ".join(f"`{c}`" for c in result["commands"])]
               if len(result.get("commands") or []) > 1 else []),
             f"- hardware: {result['device']}",
             f"- vLLM: fork {result['versions'].get('fork')}, upstream {result['versions'].get('upstream')}",
             (f"- the shipped pair's drafter (trained on the bf16 target), k = {K}, greedy; {s['tokens']} output "
              f"tokens per request, c requests at once; {_rounds(s['rounds'], result['totals'])}, best of "
              f"{s['reps']} per round; engine settings {s['engine']}"),
             f"- over all rows: {result['totals']}", "",
             ("| variant | KV (target) | drafter overrides | c | identical fork | identical upstream | tau "
              "| tau upstream | tau / bf16 | fork tok/s | upstream tok/s | no-spec tok/s "
              "| fork/upstream per round, median (min-max) | fork/no-spec |"),
             "|---" * 14 + "|"]
    for r in result["rows"]:
        spread = r.get("fork_vs_upstream_spread")
        per_round = (f"{r['fork_vs_upstream_median']} ({spread[0]}-{spread[1]})" if spread else "")
        lines.append(f"| {r['variant']} | {r['kv_cache_dtype']} | {r['drafter_overrides'] or ''} | {r['concurrency']} "
                     f"| {_frac(r['identical'])} | {_frac(r['identical_upstream'])} | {r['tau']} | {r['tau_upstream']} "
                     f"| {r['tau_vs_bf16']} | {r['fork_tok_s']} | {r['upstream_tok_s']} | {r['nospec_tok_s']} "
                     f"| {per_round} | {r['fork_vs_nospec']} |")
    if result.get("controls"):
        lines += ["", ("Controls: the same target and KV cache with every request alone (one sequence per step), "
                       "against the batched engine without speculation and against the batched fork with EAGLE-3 "
                       "(same / total; the request indices that differ):"), "",
                  "| control | of | KV (target) | c | batched no-spec | differing | fork k=3 | differing |",
                  "|---" * 8 + "|"]
        lines += [f"| {r['control']} | {r['of']} | {r['kv_cache_dtype']} | {r['concurrency']} "
                  f"| {_frac(r['batched_nospec'])} | {r['differing_batched']} | {_frac(r['fork'])} "
                  f"| {r['differing_fork']} |" for r in result["controls"]]
    parted = [(f"{r['variant']} c={r['concurrency']}", r.get("parts_at"), r.get("parts_at_upstream"))
              for r in result["rows"] if r.get("parts_at") or r.get("parts_at_upstream")]
    parted += [(f"{r['control']} c={r['concurrency']} (control: batched no-spec / fork against alone)",
                r.get("parts_at_batched"), r.get("parts_at_fork")) for r in result.get("controls") or []
               if r.get("parts_at_batched") or r.get("parts_at_fork")]
    if parted:
        lines += ["", (f"Where the differing sequences part (request index: first differing output token of "
                       f"{s['tokens']}), fork / upstream against the same target without speculation:"), ""]
        lines += [f"- {name}: {_parting(fork)} / {_parting(up)}" for name, fork, up in parted]
    if result["failures"]:
        lines += ["", "Engines that did not finish:", ""]
        lines += [f"- `{name}`: {why}" for name, why in result["failures"].items()]
    if result.get("targets"):
        lines += ["", "Targets:", ""]
        lines += [f"- {scheme}: {info}" for scheme, info in result["targets"].items()]
    for key, title in (("engine", "Engine settings added per variant"), ("environment", "Environment per variant")):
        added = {name: v[key] for name, v in (s.get("variants") or {}).items() if isinstance(v, dict) and v.get(key)}
        if added:
            lines += ["", f"{title}:", ""]
            lines += [f"- {name}: {value}" for name, value in added.items()]
    return lines


def _frac(pair: list[int] | None) -> str:
    return f"{pair[0]}/{pair[1]}" if pair else ""


def quantization_of(target: Path) -> str:
    """One line naming ``target``'s quantization (``kimi drafter inspect``'s wording), or ``bf16``."""
    import json

    from kimi.drafter.inspect import describe_quantization

    return describe_quantization(json.loads((target / "config.json").read_text())) or "bf16"
