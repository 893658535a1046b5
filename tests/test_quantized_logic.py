"""benchmarks/quantized.py's library (kimi_lab.bench.quantized) without a GPU: the variants picked, the engines planned
for them, the rows (greedy output against the right baseline, tau against bf16, per-round ratios), the failures and
the markdown."""

from __future__ import annotations

import json

import pytest

from kimi_lab.bench.quantized import (
    ONE_BY_ONE,
    VARIANTS,
    K,
    _parting,
    controls,
    earlier_call,
    failures,
    jobs_of,
    markdown,
    merged,
    pick,
    rows,
    totals,
    variant_settings,
)
from kimi_lab.bench.workers import site_errors

COMMON = {"concurrency": [1, 4], "tokens": 8, "reps": 1, "prompts": [[5, 6, 7]],
          "engine": {"dtype": "bfloat16", "kv_cache_memory_bytes": 1 << 30}}
TARGETS = {None: "/t/bf16", "fp8-block": "/t/fp8", "int4-experts": "/t/int4"}


def test_pick_defaults_to_every_variant_on_a_gpu_and_bf16_on_cpu() -> None:
    assert [v.name for v in pick(None, cpu=False)] == [v.name for v in VARIANTS]
    assert [v.name for v in pick(None, cpu=True)] == ["bf16"]


def test_a_variant_without_its_own_baseline_brings_the_baseline_variant() -> None:
    chosen = pick(["fp8-block+kv-fp8+drafter-bf16-kv-triton"], cpu=False)
    assert [v.name for v in chosen] == ["fp8-block+kv-fp8", "fp8-block+kv-fp8+drafter-bf16-kv-triton"]
    assert [v.name for v in pick(["int4-experts"], cpu=False)] == ["int4-experts"]
    assert [v.name for v in pick(["bf16", "bf16"], cpu=False)] == ["bf16"]  # one engine per name
    assert [v.name for v in pick(["bf16+kv-fp8+one-by-one"], cpu=False)] == ["bf16+kv-fp8", "bf16+kv-fp8+one-by-one"]
    assert [v.name for v in pick(["fp8-block+one-by-one"], cpu=False)] == ["fp8-block", "fp8-block+one-by-one"]


def test_pick_names_the_known_variants_for_an_unknown_one() -> None:
    with pytest.raises(ValueError, match="unknown variant.*fp4.*choose from bf16, fp8-block"):
        pick(["fp4"], cpu=False)


def test_jobs_carry_the_target_the_kv_dtype_and_the_drafter_overrides() -> None:
    jobs = {j["name"]: j for j in jobs_of(pick(None, cpu=False), TARGETS, "/d", COMMON)}
    assert len(jobs) == 3 + 3 + 3 + 3 + 2 + 1 + 1 + 1 + 1 + 1
    assert jobs["bf16/nospec"]["spec"] is None and jobs["bf16/nospec"]["target"] == "/t/bf16"
    assert jobs["int4-experts/upstream_k3"]["variant"] == "upstream"
    assert jobs["int4-experts/upstream_k3"]["target"] == "/t/int4"
    assert jobs["bf16+kv-fp8/fork_k3"]["engine"]["kv_cache_dtype"] == "fp8"
    assert jobs["bf16/fork_k3"]["engine"]["kv_cache_dtype"] == "auto"
    assert jobs["bf16/fork_k3"]["engine"]["kv_cache_memory_bytes"] == 1 << 30
    own = jobs["fp8-block+kv-fp8+drafter-bf16-kv-triton/fork_k3"]
    assert own["spec"] == {"method": "eagle3", "model": "/d", "num_speculative_tokens": K, "kv_cache_dtype": "auto",
                           "attention_backend": "TRITON_ATTN"}
    assert own["target"] == "/t/fp8" and own["engine"]["kv_cache_dtype"] == "fp8"
    assert "linear_backend" not in own["engine"]  # the widened pair's 128 x 128 blocks take vLLM's own choice
    alone = jobs["bf16+kv-fp8+one-by-one/nospec"]["engine"]
    assert alone["max_num_seqs"] == 1 and alone["compilation_config"] == ONE_BY_ONE["compilation_config"]
    assert alone["kv_cache_dtype"] == "fp8" and jobs["bf16+kv-fp8+one-by-one/nospec"]["spec"] is None
    assert COMMON["engine"] == {"dtype": "bfloat16", "kv_cache_memory_bytes": 1 << 30}  # not changed in place


def test_block_fp8_engines_run_without_deep_gemm_and_the_others_as_vllm_chooses() -> None:
    jobs = jobs_of(pick(None, cpu=False), TARGETS, "/d", COMMON)
    fp8 = [j for j in jobs if j["target"] == "/t/fp8"]
    hook_off = [j for j in fp8 if j["name"] == "fp8-block+draft-greedy-upstream/fork_k3"]
    # every block-FP8 engine without DeepGEMM, the control's too
    assert len(fp8) == 8 and all(j["env"] == {"VLLM_USE_DEEP_GEMM": "0"} for j in fp8 if j not in hook_off)
    assert hook_off[0]["env"] == {"VLLM_USE_DEEP_GEMM": "0", "KIMI_DRAFT_GREEDY": "upstream"}
    assert all(not j["env"] for j in jobs if j["target"] != "/t/fp8")
    assert variant_settings(VARIANTS[1])["environment"] == {"VLLM_USE_DEEP_GEMM": "0"}


def _done(by_c: dict) -> dict:
    return {"status": "done", "by_concurrency": by_c}


def _entry(tok_s: float, tokens: list, tau: float | None = None, rounds: list | None = None) -> dict:
    return {"tok_s": tok_s, "tau": tau, "tokens": tokens, "tok_s_rounds": rounds or [tok_s]}


def test_rows_compare_with_the_baseline_and_with_bf16() -> None:
    variants = pick(["bf16", "int4-experts", "fp8-block+kv-fp8+drafter-bf16-kv-triton"], cpu=False)
    same, other = [[1, 2], [3, 4]], [[1, 2], [9, 9]]
    runs = {
        "bf16/nospec": _done({"4": _entry(100, same)}),
        "bf16/fork_k3": _done({"4": _entry(150, same, 2.0, [150, 120])}),
        "bf16/upstream_k3": _done({"4": _entry(140, same, 2.0, [100, 150])}),
        "int4-experts/nospec": _done({"4": _entry(90, same)}),
        "int4-experts/fork_k3": _done({"4": _entry(120, other, 1.5)}),
        "int4-experts/upstream_k3": {"status": "error", "error": "Traceback\nValueError: no kernel\n"},
        "fp8-block+kv-fp8/nospec": _done({"4": _entry(80, other)}),
        "fp8-block+kv-fp8+drafter-bf16-kv-triton/fork_k3": _done({"4": _entry(100, other, 1.8)}),
    }
    table = {r["variant"]: r for r in rows(variants, runs)}
    assert list(table) == ["bf16", "int4-experts", "fp8-block+kv-fp8+drafter-bf16-kv-triton"]  # fork engines that ran
    bf16 = table["bf16"]
    assert bf16["identical"] == [2, 2] and bf16["identical_upstream"] == [2, 2]
    assert bf16["fork_vs_upstream_rounds"] == [1.5, 0.8] and bf16["fork_vs_upstream_median"] == pytest.approx(1.15)
    assert bf16["fork_vs_nospec"] == 1.5 and bf16["tau_vs_bf16"] == 1.0
    int4 = table["int4-experts"]
    assert int4["identical"] == [1, 2] and int4["identical_upstream"] is None and int4["upstream_tok_s"] is None
    assert int4["tau_vs_bf16"] == 0.75 and "fork_vs_upstream_rounds" not in int4
    own = table["fp8-block+kv-fp8+drafter-bf16-kv-triton"]
    assert own["identical"] == [2, 2]  # against fp8-block+kv-fp8/nospec, its baseline
    assert own["drafter_overrides"] == {"kv_cache_dtype": "auto", "attention_backend": "TRITON_ATTN"}
    jobs = jobs_of(variants, TARGETS, "/d", COMMON)
    failed = failures(jobs, runs)
    assert failed == {"int4-experts/upstream_k3": "error: ValueError: no kernel",
                      "fp8-block+kv-fp8/fork_k3": "not run"}
    total = totals(list(table.values()))
    assert total == {"identical": [5, 6], "fork_vs_upstream_median": pytest.approx(1.15), "rounds_measured": 2}
    report = {"command": "python3 benchmarks/quantized.py", "date": "d", "device": "H200",
              "versions": {"fork": "0.32.0+kimi.1.cuda", "upstream": "0.32.0"},
              "settings": {"tokens": 8, "rounds": 2, "reps": 1, "engine": {}},
              "totals": total, "rows": list(table.values()), "failures": failed,
              "targets": {"bf16": "/t/bf16 (bf16)"}}
    text = "\n".join(markdown(report))
    assert "; 2 interleaved rounds, best of 1 per round;" in text
    # a budget that ran out after the first round: the report says each ratio is one sample
    one = [{**r, "fork_vs_upstream_rounds": r["fork_vs_upstream_rounds"][:1]} if "fork_vs_upstream_rounds" in r
           else r for r in table.values()]
    short = "\n".join(markdown({**report, "settings": {**report["settings"], "rounds": 3}, "totals": totals(one)}))
    assert ("3 interleaved rounds planned, 1 measured (the time budget ran out; each fork/upstream ratio below is "
            "one sample)") in short
    assert "| int4-experts | auto |  | 4 | 1/2 |  | 1.5 | None | 0.75 |" in text
    assert "`int4-experts/upstream_k3`: error: ValueError: no kernel" in text
    assert "- bf16: /t/bf16 (bf16)" in text


def test_a_control_tells_batching_flips_from_speculation_flips() -> None:
    variants = pick(["bf16+kv-fp8+one-by-one"], cpu=False)
    alone, batched, fork = [[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 9], [5, 6]], [[1, 2], [3, 9], [7, 7]]
    runs = {"bf16+kv-fp8+one-by-one/nospec": _done({"16": _entry(50, alone)}),
            "bf16+kv-fp8/nospec": _done({"16": _entry(100, batched)}),
            f"bf16+kv-fp8/fork_k{K}": _done({"16": _entry(120, fork, 1.9)})}
    table = controls(variants, runs)
    assert table == [{"control": "bf16+kv-fp8+one-by-one", "of": "bf16+kv-fp8", "kv_cache_dtype": "fp8",
                      "concurrency": 16, "batched_nospec": [2, 3], "differing_batched": [1], "fork": [1, 3],
                      "differing_fork": [1, 2], "parts_at_batched": {1: 1}, "parts_at_fork": {1: 1, 2: 0}}]
    table_rows = rows(variants, runs)
    assert [(r["differing"], r["parts_at"]) for r in table_rows] == [([2], {2: 0})]  # fork against batched no-spec
    text = "\n".join(markdown({"command": "c", "date": "d", "device": "H200", "versions": {},
                               "settings": {"tokens": 8, "rounds": 1, "reps": 1, "engine": {}},
                               "totals": {}, "rows": table_rows, "controls": table, "failures": {}, "targets": {}}))
    assert "| bf16+kv-fp8+one-by-one | bf16+kv-fp8 | fp8 | 16 | 2/3 | [1] | 1/3 | [1, 2] |" in text
    # where each differing sequence parts (request@token), as JSON gives it back (string keys), fork / upstream
    assert "- bf16+kv-fp8 c=16: 2@0 / -" in text
    assert "- bf16+kv-fp8+one-by-one c=16 (control: batched no-spec / fork against alone): 1@1 / 1@1, 2@0" in text
    again = json.loads(json.dumps(table))
    assert _parting(again[0]["parts_at_fork"]) == "1@1, 2@0"


def test_a_refusal_at_config_time_keeps_its_reason_not_pydantics_link() -> None:
    error = ("Traceback ...\npydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
             "  Value error, vLLM 0.32.0's CPU backend cannot serve the target T on this host: ...\n"
             "    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n")
    jobs = jobs_of(pick(["int4-experts"], cpu=False), TARGETS, "/d", COMMON)
    failed = failures(jobs[:1], {jobs[0]["name"]: {"status": "error", "error": error}})
    assert failed == {"int4-experts/nospec": "error: Value error, vLLM 0.32.0's CPU backend cannot serve the target T "
                                             "on this host: ..."}


def test_the_result_records_what_each_variant_adds() -> None:
    fp8 = next(v for v in VARIANTS if v.name == "fp8-block+kv-fp8+drafter-bf16-kv-triton")
    overrides = {"kv_cache_dtype": "auto", "attention_backend": "TRITON_ATTN"}
    assert variant_settings(fp8) == {"scheme": "fp8-block", "kv_cache_dtype": "fp8",
                                     "engine": {}, "drafter_overrides": overrides,
                                     "engines": ["fork"], "baseline": "fp8-block+kv-fp8",
                                     "environment": {"VLLM_USE_DEEP_GEMM": "0"}}
    text = "\n".join(markdown({"command": "c", "date": "d", "device": "H200", "versions": {},
                               "settings": {"tokens": 8, "rounds": 1, "reps": 1, "engine": {},
                                            "variants": {fp8.name: variant_settings(fp8)}},
                               "totals": {}, "rows": [], "failures": {}, "targets": {}}))
    assert f"- {fp8.name}: {{'VLLM_USE_DEEP_GEMM': '0'}}" in text
    alone = next(v for v in VARIANTS if v.name == "bf16+one-by-one")
    text = "\n".join(markdown({"command": "c", "date": "d", "device": "H200", "versions": {},
                               "settings": {"tokens": 8, "rounds": 1, "reps": 1, "engine": {},
                                            "variants": {alone.name: variant_settings(alone)}},
                               "totals": {}, "rows": [], "failures": {}, "targets": {}}))
    assert f"- {alone.name}: {ONE_BY_ONE}" in text


def test_a_site_without_vllm_is_named_before_anything_starts(tmp_path) -> None:
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    assert site_errors(fork_site=tmp_path / "site", upstream_site=tmp_path / "site") == []
    assert site_errors(fork_site=tmp_path / "site", upstream_site=tmp_path / "nope") == [
        f"--upstream-site {tmp_path / 'nope'} holds no vllm package (no vllm/__init__.py there)"]
    assert site_errors(fork_site=None, upstream_site=tmp_path / "site") == ["--fork-site is required"]


def test_a_merged_report_shows_both_calls_and_a_variant_run_again_replaces_its_engines() -> None:
    first = {"variants": ["bf16", "fp8-block"], "runs": {"bf16/nospec": _done({}), "bf16/fork_k3": _done({}),
                                                          "fp8-block/nospec": {"status": "timeout"}}}
    again = {"fp8-block/nospec": _done({"1": {}}), "bf16+kv-fp8/fork_k3": _done({})}
    shown, engines = merged(first, pick(["bf16+kv-fp8", "fp8-block"], cpu=False), again)
    assert [v.name for v in shown] == ["bf16", "fp8-block", "bf16+kv-fp8"]  # in VARIANTS order
    assert engines["fp8-block/nospec"]["status"] == "done" and set(engines) == {
        "bf16/nospec", "bf16/fork_k3", "fp8-block/nospec", "bf16+kv-fp8/fork_k3"}
    only = pick(["int4-experts"], cpu=False)
    assert merged(None, only, again) == (only, again)
    text = "\n".join(markdown({"command": "b", "commands": ["a", "b"], "date": "d", "device": "H200", "versions": {},
                               "settings": {"tokens": 8, "rounds": 1, "reps": 1, "engine": {}, "variants": {}},
                               "totals": {}, "rows": [], "failures": {}, "targets": {}}))
    assert "- merged over 2 calls: `a`; `b`" in text


def test_merge_refuses_a_missing_broken_or_differently_measured_earlier_call(tmp_path) -> None:
    import json

    measured = {"concurrency": [1, 16], "tokens": 128, "reps": 1, "rounds": 3, "cpu_smoke": False, "pair": "p"}
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text("{}")
    path = tmp_path / "quantized-runs.json"
    with pytest.raises(ValueError, match="no earlier call's results"):
        earlier_call(path, measured)
    path.write_text('{"variants": [')
    with pytest.raises(ValueError, match="not valid JSON"):
        earlier_call(path, measured)
    path.write_text('{"foo": 1}')
    with pytest.raises(ValueError, match="not a runs file"):
        earlier_call(path, measured)
    good = {"variants": ["bf16"], "runs": {}, "targets": {"bf16": str(target)}, "measured": measured}
    path.write_text(json.dumps(good))
    assert earlier_call(path, measured) == good
    with pytest.raises(ValueError, match="measured with .*'tokens': 128.* this one with .*'tokens': 8"):
        earlier_call(path, {**measured, "tokens": 8})
    path.write_text(json.dumps({**good, "targets": {"bf16": str(tmp_path / "gone")}}))
    with pytest.raises(ValueError, match="targets are gone"):
        earlier_call(path, measured)
