"""benchmarks/perf_vs_upstream.py's library (kimi_lab.bench.perf) without a GPU: step times, rows, the ideal bound,
the projection, the goal, the worker protocol, and the Kimi slice's configs (accepted by ``kimi drafter inspect``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_benchmark
from kimi.models import kimi_slice
from kimi_lab.bench.hardware import cpu_cores, cpu_groups, cpu_list, thread_cpu
from kimi_lab.bench.perf import analysis, orchestrate
from kimi_lab.bench.perf.analysis import combine, projection, rows_of, same_as_nospec, without_tokens
from kimi_lab.bench.perf.measure import busy_threads, measure, merge_round, turn_concurrency
from kimi_lab.bench.perf.orchestrate import measure_rounds, run_parallel
from kimi_lab.bench.perf.plan import V1_RUNNER_FILE, plan, v1_runner_removed, variant_env
from kimi_lab.bench.perf.render import write_outputs
from kimi_lab.bench.timers import step_times
from kimi_lab.bench.workers import WorkerProcess, await_turn, give_turn
from pngs import assert_png, require_matplotlib


def test_step_times_take_the_steady_batch_and_spread_draft_time_over_draft_tokens() -> None:
    calls = {"target_forward": [(512, 0.5), (4, 0.002), (4, 0.004), (4, 0.003)],
             "target_logits": [(512, 0.1), (4, 0.001), (4, 0.001), (4, 0.001)],
             "draft_forward": [(16, 0.004), (4, 0.002)], "draft_head": [(4, 0.001)] * 3}
    steps = step_times(calls)
    assert steps["target_tokens"] == 4 and steps["target_calls"] == 3
    assert steps["target_ms"] == pytest.approx(3.0 + 1.0)
    assert steps["draft_per_token_ms"] == pytest.approx((6 + 3) / 3)
    assert step_times({}) == {}


def _result(tok_s: float, tau: float | None, target_ms: float | None, draft_ms: float | None = None,
            runner: str = "v1") -> dict:
    steps = {"target_ms": target_ms, **({"draft_per_token_ms": draft_ms} if draft_ms else {})} if target_ms else {}
    entry = {"tok_s": tok_s, "tpot_ms": 1.0, "tau": tau, "steps": steps, "tokens": [[1, 2], [3, 4]]}
    return {"status": "done", "runner": runner, "by_concurrency": {"4": entry}}


def _jobs(model: str = "pair", k: int = 3) -> list[dict]:
    spec = {"method": "eagle3"}
    return [{"name": f"{model}/nospec", "model": model, "variant": "nospec", "k": 0, "spec": None},
            {"name": f"{model}/upstream_k{k}", "model": model, "variant": "upstream", "k": k, "spec": spec},
            {"name": f"{model}/fork_k{k}", "model": model, "variant": "fork", "k": k, "spec": spec},
            {"name": f"{model}/check_k{k}", "model": model, "variant": "fork", "greedy": "check", "k": k,
             "spec": spec},
            {"name": f"{model}/fork_v1_k{k}", "model": model, "variant": "fork_v1", "k": k, "spec": spec},
            {"name": f"{model}/fork_v2_k{k}", "model": model, "variant": "fork_v2", "k": k, "spec": spec}]


def test_rows_ratios_and_ideal_speedup() -> None:
    runs = {"pair/nospec": _result(100.0, None, 2.0), "pair/upstream_k3": _result(180.0, 2.5, 2.4, 0.5),
            "pair/fork_k3": _result(198.0, 2.5, 2.4, 0.4), "pair/check_k3": _result(1.0, 2.5, 2.4, 0.5)}
    rows = rows_of(runs, _jobs())
    assert len(rows) == 1  # the check engine is not a row
    row = rows[0]
    assert (row["fork_vs_upstream"], row["fork_vs_nospec"], row["upstream_vs_nospec"]) == (1.1, 1.98, 1.8)
    # tau * t_target / (t_verify + k t_draft) = 2.5 * 2.0 / (2.4 + 3 * 0.4)
    assert row["ideal_speedup"] == pytest.approx(2.5 * 2.0 / 3.6, abs=1e-3)
    assert row["t_draft_ms_upstream"] == 0.5 and row["steps_from"] == "fork"
    goal = analysis.goal(rows)
    assert goal["pair_k3_c1_16_met"] and goal["floor_met"] and goal["min_anywhere"] == 1.1


def test_held_runner_columns_and_step_times_when_the_fork_has_none() -> None:
    """The fork on V2 (patch 0013) has no step times: they come from the fork held on V1, else from upstream."""
    runs = {"pair/nospec": _result(100.0, None, 2.0), "pair/upstream_k3": _result(180.0, 2.5, 2.4, 0.5),
            "pair/fork_k3": _result(270.0, 2.6, None, runner="v2"),
            "pair/fork_v2_k3": _result(260.0, 2.1, None, runner="v2")}
    row = rows_of(runs, _jobs())[0]
    assert (row["steps_from"], row["t_verify_ms"], row["t_draft_ms"]) == ("upstream", 2.4, 0.5)
    assert row["ideal_speedup"] == pytest.approx(2.6 * 2.0 / (2.4 + 3 * 0.5), abs=1e-3)  # the fork's tau
    assert (row["fork_v2_tok_s"], row["fork_v2_vs_upstream"], row["tau_v2"]) == (260.0, 1.4444, 2.1)
    assert (row["fork_v1_tok_s"], row["fork_v1_vs_upstream"], row["tau_v1"]) == (None, None, None)
    runs["pair/fork_v1_k3"] = _result(170.0, 2.9, 2.2, 0.45)
    row = rows_of(runs, _jobs())[0]
    assert (row["steps_from"], row["t_verify_ms"], row["t_draft_ms"]) == ("fork_v1", 2.2, 0.45)
    assert (row["fork_v1_tok_s"], row["fork_v1_vs_upstream"], row["tau_v1"]) == (170.0, 0.9444, 2.9)
    assert row["fork_runner"] == "v2"


def test_goal_fails_below_the_floor() -> None:
    rows = [{"model": "pair", "k": 3, "concurrency": 4, "fork_vs_upstream": 1.2},
            {"model": "pair", "k": 1, "concurrency": 64, "fork_vs_upstream": 0.97}]
    goal = analysis.goal(rows)
    assert goal["pair_k3_c1_16_met"] and not goal["floor_met"] and goal["min_anywhere"] == 0.97


def test_same_as_nospec_counts_identical_sequences() -> None:
    runs = {"pair/nospec": _result(100.0, None, 2.0), "pair/fork_k3": _result(150.0, 2.0, 2.4, 0.4)}
    runs["pair/fork_k3"]["by_concurrency"]["4"]["tokens"] = [[1, 2], [3, 5]]
    assert same_as_nospec(runs, _jobs()) == {"pair/fork_k3": {"4": [1, 2]}}


def test_projection_from_two_slice_depths() -> None:
    # 4-layer slice 10 ms, 3-layer 8 ms: 2 ms per MoE layer
    runs = {"kimi_slice/nospec": _result(1.0, None, 10.0), "kimi_slice/nospec_shallow": _result(1.0, None, 8.0)}
    rows = [{"model": "kimi_slice", "concurrency": 4, "k": 3, "t_verify_ms": 12.0, "t_draft_ms": 1.0}]
    p = projection(runs, rows)["c4_k3"]
    moe_full, moe_here = kimi_slice.FULL_LAYERS - 1, kimi_slice.SPEC_LAYERS - 1
    tp8 = 10.0 - moe_here * 2.0 + moe_full * 2.0 / 8
    assert p["t_moe_layer_ms"] == 2.0
    assert p["t_target_61_1gpu_ms"] == pytest.approx(10.0 + (moe_full - moe_here) * 2.0)
    assert p["t_target_61_tp8_ms"] == pytest.approx(tp8)
    spent = 1.2 * tp8 + 3 * 1.0
    assert p["break_even_tau"] == pytest.approx(spent / tp8, abs=1e-3)
    assert projection({}, rows) == {}


def test_markdown_and_json_are_written(tmp_path: Path) -> None:
    runs = {"pair/nospec": _result(100.0, None, 2.0), "pair/upstream_k3": _result(180.0, 2.5, 2.4, 0.5),
            "pair/fork_k3": _result(198.0, 2.5, 2.4, 0.4)}
    jobs = _jobs()[:3]
    rows = rows_of(runs, jobs)
    summary = {"command": "x", "date": "2026-11-30T00:00:00+00:00", "device": "test", "versions": {},
               "settings": {"fork_greedy": "auto", "tokens": 8, "slice_tokens": 4, "reps": 1}, "rows": rows,
               "projection": {},
               "goal": analysis.goal(rows), "same_as_nospec": same_as_nospec(runs, jobs), "greedy_check": {},
               "runs": {n: without_tokens(r) for n, r in runs.items()}}
    require_matplotlib()
    write_outputs(tmp_path, summary)
    assert assert_png(tmp_path / "perf_vs_upstream.png", min_size=(400, 300))
    text = (tmp_path / "perf_vs_upstream.md").read_text()
    assert "| pair | 4 | 3 | 198.0 (v1) | 180.0 | 100.0 | 1.1 |" in text
    data = json.loads((tmp_path / "perf_vs_upstream.json").read_text())
    assert "tokens" not in data["runs"]["pair/fork_k3"]["by_concurrency"]["4"]
    assert "fork on V1" not in text  # no held-runner engine, no such columns


def test_markdown_has_the_held_runner_columns_of_the_rows(tmp_path: Path) -> None:
    """The fork on V2 beside the fork held on V1: the table gains V1's two columns (and not V2's), header,
    separator and rows with as many cells."""
    runs = {"pair/nospec": _result(100.0, None, 2.0), "pair/upstream_k3": _result(180.0, 2.5, 2.4, 0.5),
            "pair/fork_k3": _result(300.0, 2.5, None, runner="v2"), "pair/fork_v1_k3": _result(190.0, 2.5, 2.4, 0.4)}
    rows = rows_of(runs, _jobs())
    summary = {"command": "x", "date": "2026-11-30T00:00:00+00:00", "device": "test", "versions": {},
               "settings": {"fork_greedy": "auto", "tokens": 8, "slice_tokens": 4, "reps": 1}, "rows": rows,
               "projection": {}, "goal": analysis.goal(rows), "same_as_nospec": {}, "greedy_check": {}, "runs": runs}
    write_outputs(tmp_path, summary, chart=False)
    table = [line for line in (tmp_path / "perf_vs_upstream.md").read_text().splitlines() if line.startswith("|")]
    assert "fork on V1 tok/s (/ upstream)" in table[0] and "V2" not in table[0]
    assert len({line.count("|") for line in table}) == 1 and len(table) == 3
    assert "| 300.0 (v2) |" in table[2] and table[2].endswith("| 190.0 (1.0556) | 2.5 |")


def test_hook_off_engine_gives_its_own_ratios_and_columns(tmp_path: Path) -> None:
    """--hook-off: per-round ratios of the fork with patch 0009's hook off against upstream, and of the fork
    against it, in the row and in three more columns of the table."""
    def rounds(rates: list[float], runner: str = "v2") -> dict:
        result = _result(max(rates), 2.5, None, runner=runner)
        result["by_concurrency"]["4"]["tok_s_rounds"] = rates
        return result

    spec = {"method": "eagle3"}
    jobs = [*_jobs()[:3], {"name": "pair/hookoff_k3", "model": "pair", "variant": "fork", "greedy": "upstream",
                           "k": 3, "spec": spec}]
    runs = {"pair/nospec": rounds([100.0]), "pair/upstream_k3": rounds([100.0, 100.0, 100.0]),
            "pair/fork_k3": rounds([99.0, 102.0, 104.0]), "pair/hookoff_k3": rounds([90.0, 100.0, 104.0])}
    [row] = rows_of(runs, jobs)  # the hook-off engine is not a row of its own
    assert row["fork_vs_upstream_median"] == 1.02
    assert row["hookoff_vs_upstream_rounds"] == [0.9, 1.0, 1.04] and row["hookoff_vs_upstream_median"] == 1.0
    assert row["fork_vs_hookoff_rounds"] == [1.1, 1.02, 1.0] and row["fork_vs_hookoff_spread"] == [1.0, 1.1]
    assert row["fork_hookoff_tok_s"] == 104.0
    summary = {"command": "x", "date": "2026-11-30T00:00:00+00:00", "device": "test", "versions": {},
               "settings": {"fork_greedy": "auto", "tokens": 8, "slice_tokens": 4, "reps": 1}, "rows": [row],
               "projection": {}, "goal": analysis.goal([row]), "same_as_nospec": {}, "greedy_check": {}, "runs": runs}
    write_outputs(tmp_path, summary, chart=False)
    table = [line for line in (tmp_path / "perf_vs_upstream.md").read_text().splitlines() if line.startswith("|")]
    assert "fork, hook off, tok/s" in table[0] and len({line.count("|") for line in table}) == 1
    assert table[2].endswith("| 104.0 | 1.0 (0.9-1.04) n=3 | 1.02 (1.0-1.1) n=3 |")


def test_slice_ids_skip_the_embedding_output_and_need_four_layers() -> None:
    assert kimi_slice.aux_ids(4) == [1, 2, 3]
    with pytest.raises(ValueError, match="at least 4 layers"):
        kimi_slice.aux_ids(3)


def test_slice_configs_pass_the_drafter_checks(tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="`kimi drafter inspect` reads safetensors headers")
    folders = kimi_slice.write_slice(tmp_path, layers=(3, 4))
    target = json.loads(Path(folders["target-L4"], "config.json").read_text())
    assert (target["hidden_size"], target["num_attention_heads"], target["n_routed_experts"],
            target["num_experts_per_tok"], target["vocab_size"]) == (7168, 64, 384, 8, 163840)
    command = [sys.executable, "-m", "kimi", "drafter", "inspect", folders["drafter"], "--target", folders["target-L4"],
               "--load-format", "dummy", "--json"]  # served with random weights: no weight files to check
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == [] and report["aux_layer_ids"] == [1, 2, 3]


def test_results_of_two_calls_combine_and_different_devices_do_not() -> None:
    part = {"device": "H200", "versions": {"fork": "0.26.0+kimi.1.cuda"}, "date": "2026-11-30T09:00:00+00:00",
            "command": "a", "seconds": 10, "settings": {}, "projection": {}, "same_as_nospec": {}, "greedy_check": {},
            "runs": {"pair/fork_k3": {}},
            "rows": [{"model": "pair", "k": 3, "concurrency": 4, "fork_vs_upstream": 1.0}]}
    other = {**part, "command": "b", "runs": {"kimi_slice/fork_k3": {}}, "projection": {"c4_k3": {}},
             "rows": [{"model": "kimi_slice", "k": 3, "concurrency": 4, "fork_vs_upstream": 0.99}]}
    both = combine([part, other])
    assert [r["model"] for r in both["rows"]] == ["kimi_slice", "pair"]
    assert set(both["runs"]) == {"pair/fork_k3", "kimi_slice/fork_k3"}
    assert both["projection"] == {}  # recomputed from the joined runs, which hold no step times here
    assert both["goal"]["min_anywhere"] == 0.99 and both["command"] == "a ; b" and both["seconds"] == 20
    with pytest.raises(ValueError, match="cannot combine"):
        combine([part, {**other, "device": "B200"}])


def test_combine_marks_invalid_engines_out_of_the_goal(tmp_path: Path) -> None:
    part = {"device": "H200", "versions": {}, "date": "2026-11-30T09:00:00+00:00", "command": "a", "seconds": 1,
            "settings": {"fork_greedy": "auto", "tokens": 8, "slice_tokens": 4, "reps": 1}, "projection": {},
            "same_as_nospec": {}, "greedy_check": {}, "runs": {},
            "rows": [{"model": "pair", "k": 3, "concurrency": 4, "fork_vs_upstream": 1.2},
                     {"model": "kimi_slice", "k": 3, "concurrency": 4, "fork_vs_upstream": 0.5}]}
    both = combine([part], {"kimi_slice/fork_k3": "stale head"}, ["seen twice"])
    assert both["goal"]["min_anywhere"] == 1.2 and both["goal"]["floor_met"]
    assert [r.get("invalid") for r in both["rows"]] == ["stale head", None]
    with pytest.raises(ValueError, match="no rows"):
        combine([part], {"pair/fork_k5": "x"})
    rows = [{**r, **{k: None for k in ("upstream_tok_s", "nospec_tok_s", "fork_vs_nospec", "tau", "t_target_ms",
                                       "t_verify_ms", "t_draft_ms", "t_draft_ms_upstream", "ideal_speedup")},
             "fork_tok_s": 1.0} for r in both["rows"]]
    write_outputs(tmp_path, {**both, "rows": rows}, chart=False)
    text = (tmp_path / "perf_vs_upstream.md").read_text()
    assert "- kimi_slice/fork_k3: not counted: stale head" in text and "- seen twice" in text
    assert "| 0.5 (not counted) |" in text


def test_projection_of_an_invalid_fork_engine_takes_upstreams_steps() -> None:
    runs = {"kimi_slice/nospec": _result(1.0, None, 10.0), "kimi_slice/nospec_shallow": _result(1.0, None, 8.0),
            "kimi_slice/upstream_k3": _result(1.0, 1.0, 15.0, 2.0)}
    row = {"model": "kimi_slice", "concurrency": 4, "k": 3, "t_verify_ms": 12.0, "t_draft_ms": 1.0,
           "t_draft_ms_upstream": 2.0, "invalid": "why"}
    p = projection(runs, [row])["c4_k3"]
    tp8 = p["t_target_61_tp8_ms"]
    assert p["t_draft_ms"] == 2.0 and p["t_verify_61_tp8_ms"] == pytest.approx(1.5 * tp8, abs=1e-3)


def test_combine_projects_the_slice_from_depths_measured_in_different_calls() -> None:
    slice_row = {"model": "kimi_slice", "concurrency": 4, "k": 3, "t_verify_ms": 12.0, "t_draft_ms": 1.0,
                 "fork_vs_upstream": 1.0}
    base = {"device": "H200", "versions": {}, "date": "2026-11-30T09:00:00+00:00", "command": "a", "seconds": 1,
            "settings": {}, "projection": {}, "same_as_nospec": {}, "greedy_check": {}}
    deep = {**base, "runs": {"kimi_slice/nospec": _result(1.0, None, 10.0)}, "rows": [slice_row]}
    shallow = {**base, "runs": {"kimi_slice/nospec_shallow": _result(1.0, None, 8.0)}, "rows": []}
    assert combine([deep, shallow])["projection"]["c4_k3"]["t_moe_layer_ms"] == 2.0


def test_upstream_engines_see_the_pristine_vllm_first(tmp_path: Path, monkeypatch) -> None:
    """... and the caller's PYTHONPATH after the sites: the GPU host's kit adds `cutlass` there (0.34.0 imports it at
    every CUDA engine's start; without it all three engines of the 2026-12-06 call died)."""
    import argparse

    monkeypatch.setenv("PYTHONPATH", "/tmp/site/extra")
    args = argparse.Namespace(upstream_site=Path("/tmp/upstream"), fork_site=Path("/tmp/site"), fork_greedy="auto")
    up = variant_env(args, {"variant": "upstream"}, tmp_path)
    fork = variant_env(args, {"variant": "fork", "greedy": "check"}, tmp_path)
    # the whole kimi package first (a folder holding only its link), then the vllm the engine must see
    kimi_only = tmp_path / "kimi-path"
    assert sorted(p.name for p in kimi_only.iterdir()) == ["kimi"] and (kimi_only / "kimi" / "hooks").is_dir()
    assert up["PYTHONPATH"].split(os.pathsep)[:3] == [str(kimi_only), "/tmp/upstream", "/tmp/site"]
    assert fork["PYTHONPATH"].split(os.pathsep)[:2] == [str(kimi_only), "/tmp/site"]
    assert "/tmp/upstream" not in fork["PYTHONPATH"]
    assert up["PYTHONPATH"].split(os.pathsep)[-1] == fork["PYTHONPATH"].split(os.pathsep)[-1] == "/tmp/site/extra"
    assert (up["KIMI_DRAFT_GREEDY"], fork["KIMI_DRAFT_GREEDY"]) == ("upstream", "check")
    nospec = variant_env(args, {"variant": "nospec"}, tmp_path)
    assert up["VLLM_CACHE_ROOT"] != fork["VLLM_CACHE_ROOT"] == nospec["VLLM_CACHE_ROOT"]
    assert variant_env(args, {"variant": "fork"}, tmp_path, cache="c1")["VLLM_CACHE_ROOT"] == str(tmp_path / "c1")
    own = variant_env(args, {"variant": "fork", "env": {"VLLM_USE_DEEP_GEMM": "0", "KIMI_DRAFT_GREEDY": "off"}},
                      tmp_path)
    assert own["VLLM_USE_DEEP_GEMM"] == "0" and own["KIMI_DRAFT_GREEDY"] == "off"  # the job's own env comes last
    assert "VLLM_USE_DEEP_GEMM" not in fork


def test_plan_order_and_the_runner_variants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    args = argparse.Namespace(concurrency=[1, 4], tokens=8, reps=1, rewarm_tokens=None, cpu_smoke=False, ks=[1, 3],
                              slice_ks=[3], v1_ks=[3], v2_ks=[1], check=True, hook_off=True, engine={}, pair=tmp_path,
                              slice_tokens=4, slice_kv_gib=1, engines=None)
    jobs = plan(args, [[1, 2]], None)
    assert [j["name"] for j in jobs] == ["pair/nospec", "pair/upstream_k3", "pair/fork_k3", "pair/fork_v1_k3",
                                         "pair/hookoff_k3", "pair/check_k3", "pair/upstream_k1", "pair/fork_k1",
                                         "pair/fork_v2_k1"]
    assert args.engine["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16]
    assert {j["engine"]["gpu_memory_utilization"] for j in jobs} == {0.05}  # side by side at --parallel-start
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # not inherited: each variant sets or clears it
    env_args = argparse.Namespace(upstream_site=tmp_path, fork_site=tmp_path, fork_greedy="auto")
    runner = {j["name"]: variant_env(env_args, j, tmp_path).get("VLLM_USE_V2_MODEL_RUNNER") for j in jobs}
    # the fork runs as it does by default; held variants and the check engine (its count needs V1) set it
    assert runner == {"pair/nospec": None, "pair/upstream_k3": None, "pair/fork_k3": None, "pair/fork_v1_k3": "0",
                      "pair/hookoff_k3": None, "pair/check_k3": "0", "pair/upstream_k1": None, "pair/fork_k1": None,
                      "pair/fork_v2_k1": "1"}
    # the hook-off engine: the fork on its default runner with patch 0009's hook off
    hookoff = next(j for j in jobs if j["name"] == "pair/hookoff_k3")
    assert variant_env(env_args, hookoff, tmp_path)["KIMI_DRAFT_GREEDY"] == "upstream"
    assert hookoff["concurrency"] == [1, 4] and hookoff["spec"]["num_speculative_tokens"] == 3
    env_args.fork_greedy = "check"  # every fork engine counts on the host: all held on V1
    runner = {j["name"]: variant_env(env_args, j, tmp_path).get("VLLM_USE_V2_MODEL_RUNNER") for j in jobs}
    assert {n for n, r in runner.items() if r == "0"} == {n for n in runner if "/fork" in n or "/check" in n}
    assert runner["pair/nospec"] is None and runner["pair/upstream_k3"] is None
    args.engines = ["pair/fork_k1", "pair/nospec"]
    assert [j["name"] for j in plan(args, [[1, 2]], None)] == ["pair/nospec", "pair/fork_k1"]
    args.engines = ["pair/fork_k9"]
    with pytest.raises(SystemExit, match=r"pair/fork_k9"):
        plan(args, [[1, 2]], None)


def test_v1_runner_removed_tells_0_34_sites_from_older_and_editable_ones(tmp_path: Path) -> None:
    old, new, editable = tmp_path / "old", tmp_path / "new", tmp_path / "editable"
    (old / V1_RUNNER_FILE).parent.mkdir(parents=True)
    (old / V1_RUNNER_FILE).write_text("")
    (new / "vllm" / "v1" / "worker").mkdir(parents=True)  # 0.34.0: the V2 runner's folder, V1's file gone
    editable.mkdir()
    assert v1_runner_removed(new)
    assert not v1_runner_removed(old) and not v1_runner_removed(editable) and not v1_runner_removed(None)


def test_perf_vs_upstream_drops_the_v1_engines_on_a_fork_without_v1(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm" / "v1" / "worker").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_vs_upstream.py"), "--fork-site", str(site),
                          "--upstream-site", str(site), "--cpu-smoke", "--out", str(tmp_path / "out"),
                          "--scratch", str(tmp_path / "scratch"), "--engines", "pair/nonexistent"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "has no V1 runner" in out.stdout + out.stderr, out.stdout + out.stderr


def test_slice_plan_puts_the_projection_baseline_before_optional_engines(tmp_path: Path) -> None:
    import argparse

    args = argparse.Namespace(concurrency=[1, 4], tokens=8, reps=1, rewarm_tokens=None, cpu_smoke=False, ks=[3],
                              slice_ks=[3], v1_ks=[3], v2_ks=[], check=True, hook_off=False, engine={}, slice_tokens=4,
                              slice_kv_gib=1,
                              engines=None)
    dirs = kimi_slice.write_slice(tmp_path, layers=(3, 4))
    names = [j["name"] for j in plan(args, None, dirs)]
    assert names == ["kimi_slice/nospec", "kimi_slice/upstream_k3", "kimi_slice/fork_k3", "kimi_slice/nospec_shallow",
                     "kimi_slice/fork_v1_k3", "kimi_slice/check_k3"]


def test_await_turn_reads_the_order_of_its_round(tmp_path: Path) -> None:
    import threading

    turn = tmp_path / "pair-fork_k3"
    # the orchestrator writes the turn file atomically (a plain write_text could be read while still empty)
    thread = threading.Timer(0.3, lambda: give_turn(turn, 1, "last"))
    thread.start()
    assert await_turn(turn, 1, timeout_s=30) == "last"
    thread.join()
    with pytest.raises(TimeoutError, match="turn 2"):
        await_turn(turn, 2, timeout_s=0.3)


def test_rounds_keep_the_fastest_and_every_rate() -> None:
    by_c: dict = {}
    merge_round(by_c, "4", {"tok_s": 100.0, "tau": 2.0, "steps": {"target_ms": 1.0}, "steal_share": 0.05})
    merge_round(by_c, "4", {"tok_s": 130.0, "tau": 2.1, "steal_share": 0.0})
    merge_round(by_c, "4", {"tok_s": 90.0, "tau": 2.2, "steal_share": None})
    merge_round(by_c, "4", {"tok_s": 95.0, "busy": [[3, 0.9]], "shared_core": False})
    assert by_c["4"] == {"tok_s": 130.0, "tau": 2.1, "steal_share": 0.0, "steps": {"target_ms": 1.0},
                         "tok_s_rounds": [100.0, 130.0, 90.0, 95.0], "steal_share_rounds": [0.05, 0.0, None, None],
                         "tau_rounds": [2.0, 2.1, 2.2, None], "draft_tokens_rounds": [None] * 4,
                         "verified_rounds": [None] * 4, "busy_rounds": [None, None, None, [[3, 0.9]]],
                         "shared_core_rounds": [None, None, None, False]}
    # a result from before a key was kept per round: its earlier rounds read None, the lists stay aligned
    old = {"4": {"tok_s": 100.0, "tok_s_rounds": [100.0, 80.0], "steal_share_rounds": [0.0, 0.01]}}
    merge_round(old, "4", {"tok_s": 90.0, "steal_share": 0.0, "shared_core": True})
    assert old["4"]["shared_core_rounds"] == [None, None, True] and old["4"]["busy_rounds"] == [None, None, None]


def test_steal_seconds_sum_the_steal_column_of_the_given_cpus(tmp_path: Path) -> None:
    """/proc/stat's 8th value per cpuN line, over the CPUs asked for (the aggregate ``cpu`` line left out), in
    seconds; None without the file, the column or any of the CPUs; the share of a process's CPU time from two
    readings."""
    from kimi_lab.bench.hardware import steal_seconds
    from kimi_lab.bench.perf.measure import steal_share

    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 999 0 0\n"
                    f"cpu0 1 2 3 4 5 6 7 {2 * hz} 0 0\ncpu1 1 2 3 4 5 6 7 {hz} 0 0\ncpu2 1 2 3 4 5 6 7 {4 * hz} 0 0\n"
                    "\nintr 12 3\nctxt 5\n")
    assert steal_seconds([0, 2], stat) == 6.0 and steal_seconds([1], stat) == 1.0
    assert steal_seconds([7], stat) is None and steal_seconds([0], tmp_path / "missing") is None
    stat.write_text("cpu0 1 2 3 4\n")
    assert steal_seconds([0], stat) is None
    cpus = len(os.sched_getaffinity(0))
    assert steal_share(1.0, 3.0, 4.0) == round(2.0 / (4.0 * cpus), 4)
    assert steal_share(None, 3.0, 4.0) is None and steal_share(1.0, 1.0, 0.0) is None
    if Path("/proc/stat").is_file():
        assert steal_seconds() is not None  # this machine's own, over this process's CPUs


def test_parallel_start_measures_ready_engines_in_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines up: measured one at a time in plan order (reversed in odd rounds), round after round, the last round
    marked; one that died at start: its error; one still starting after --job-timeout-s: stopped."""
    import argparse
    import time

    events: list[str] = []
    pinned: dict = {}

    class FakeWorker:
        def __init__(self, args, job, scratch, parallel=False, threads=None, cpus=None) -> None:
            self.name, self.kind = job["name"], job["fake"]
            assert parallel and threads >= 1
            pinned[self.name] = cpus
            self.proc = argparse.Namespace(poll=lambda: 1 if self.kind == "dies" else None)

        def ready(self) -> bool:
            return self.kind == "ready"

        def go(self, rnd: int, order: str) -> None:
            events.append(f"go{rnd} {order} {self.name}")

        def wait_turn(self, rnd: int, limit: float) -> bool:
            events.append(f"wait{rnd} {self.name}")
            return self.kind != "overruns"

        def collect(self, limit: float) -> dict:
            events.append(f"collect {self.name}")
            return {"status": "done" if self.kind == "ready" else "error", "seconds": 0.0}

        def stop(self, status: str, why: str) -> dict:
            events.append(f"stop {self.name}")
            return {"status": status, "error": why, "seconds": 0.0}

    monkeypatch.setattr(orchestrate, "Worker", FakeWorker)
    jobs = [{"name": "pair/nospec", "fake": "ready"}, {"name": "pair/upstream_k3", "fake": "dies"},
            {"name": "pair/fork_k3", "fake": "ready"}, {"name": "pair/fork_v2_k3", "fake": "slow"}]
    args = argparse.Namespace(job_timeout_s=0.5, scratch=tmp_path, rounds=2, pin=False, turns="engine")
    runs: dict = {}
    reported: list[str] = []
    run_parallel(args, jobs, time.monotonic() + 600, runs, lambda job: reported.append(job["name"]))
    assert set(pinned.values()) == {None}
    # round 1 runs in reverse order (a drift within a round cancels over two rounds)
    assert events == ["collect pair/upstream_k3", "stop pair/fork_v2_k3", "go0 more pair/nospec", "wait0 pair/nospec",
                      "go0 more pair/fork_k3", "wait0 pair/fork_k3", "go1 last pair/fork_k3", "collect pair/fork_k3",
                      "go1 last pair/nospec", "collect pair/nospec"]
    assert {n: r["status"] for n, r in runs.items()} == {"pair/nospec": "done", "pair/upstream_k3": "error",
                                                         "pair/fork_k3": "done", "pair/fork_v2_k3": "timeout"}
    assert sorted(reported) == sorted(j["name"] for j in jobs)

    # an engine that overruns a round is told to stop at the next one and collected; with too little time left
    # for another round, every engine is told to stop (the same number of rounds for all)
    events.clear()
    jobs = [{"name": "pair/nospec", "fake": "ready"}, {"name": "pair/fork_k3", "fake": "overruns"}]
    workers = {j["name"]: FakeWorker(args, j, tmp_path, parallel=True, threads=1) for j in jobs}
    runs = {}
    measure_rounds(argparse.Namespace(rounds=3, job_timeout_s=5, turns="engine"), jobs, workers,
                   time.monotonic() + 30, runs, lambda job: None)
    assert events == ["go0 more pair/nospec", "wait0 pair/nospec", "go0 more pair/fork_k3", "wait0 pair/fork_k3",
                      "go1 stop pair/fork_k3", "collect pair/fork_k3", "go1 stop pair/nospec", "collect pair/nospec"]


@pytest.mark.install
def test_parallel_start_rounds_with_real_engines(tmp_path: Path, trained_pair: Path) -> None:
    """The file protocol between the orchestrator and real workers (CPU, the trained pair): two engines start
    at once, each is measured in two interleaved rounds, both finish with every round's rate kept."""
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_vs_upstream.py"), "--cpu-smoke",
                          "--fork-site", str(ROOT), "--pair", str(trained_pair), "--models", "pair", "--ks", "3",
                          "--engines", "pair/nospec", "pair/fork_k3", "--parallel-start", "--rounds", "2",
                          "--concurrency", "2", "--tokens", "4", "--reps", "1", "--no-chart",
                          "--scratch", str(tmp_path / "scratch"), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    runs = json.loads((out / "perf_vs_upstream.json").read_text())["runs"]
    assert {n: r["status"] for n, r in runs.items()} == {"pair/nospec": "done", "pair/fork_k3": "done"}
    assert [len(r["by_concurrency"]["2"]["tok_s_rounds"]) for r in runs.values()] == [2, 2]
    assert "round 2, last" in run.stdout


def _fake_call(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``perf_vs_upstream.py --cpu-smoke`` with the stand-in vLLM (``tmp_path/site``, made unless there) as the
    fork's site: the real orchestrator, worker processes, file protocol, analysis and rendering, no engine."""
    from engine_script import fake_vllm_site

    site, out = tmp_path / "site", tmp_path / "out"
    if not site.is_dir():
        fake_vllm_site(site)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_vs_upstream.py"), "--cpu-smoke",
                          "--fork-site", str(site), "--ks", "3", "--concurrency", "1", "2", "--tokens", "4",
                          "--slice-tokens", "4", "--reps", "1", "--scratch", str(tmp_path / "scratch"),
                          "--out", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (out / "perf_vs_upstream.json").is_file(), (run.stdout + run.stderr)[-3000:]
    return run, json.loads((out / "perf_vs_upstream.json").read_text())


def test_a_call_runs_every_engine_of_the_plan_in_its_own_worker(tmp_path: Path) -> None:
    run, summary = _fake_call(tmp_path, "--models", "kimi_slice", "--no-chart")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    runs = summary["runs"]
    assert list(runs) == ["kimi_slice/nospec", "kimi_slice/upstream_k3", "kimi_slice/fork_k3",
                          "kimi_slice/nospec_shallow", "kimi_slice/fork_v1_k3", "kimi_slice/check_k3"]
    assert {r["status"] for r in runs.values()} == {"done"} and runs["kimi_slice/fork_k3"]["runner"] == "v1"
    assert set(runs["kimi_slice/nospec"]["by_concurrency"]) == {"1", "2"}
    assert runs["kimi_slice/check_k3"]["greedy_env"] == "check" and list(runs["kimi_slice/check_k3"][
        "by_concurrency"]) == ["2"]
    rows = summary["rows"]
    assert [(r["concurrency"], r["tau"]) for r in rows] == [(1, 2.0), (2, 2.0)]
    assert summary["same_as_nospec"]["kimi_slice/fork_k3"] == {"1": [1, 1], "2": [2, 2]}
    text = (tmp_path / "out" / "perf_vs_upstream.md").read_text()
    assert "| kimi_slice | 2 | 3 |" in text and "- command: `python3 benchmarks/perf_vs_upstream.py --cpu-smoke" in text


def test_a_failed_engine_keeps_its_error_and_the_call_goes_on(tmp_path: Path) -> None:
    """An engine that cannot start (the stand-in vLLM made to raise for the drafter) is an error with its
    traceback; the others are done and the call's status says one failed."""
    from engine_script import fake_vllm_site

    site = fake_vllm_site(tmp_path / "site")
    init = site / "vllm" / "__init__.py"
    init.write_text(init.read_text().replace("self.spec, self.counts = speculative_config, [0.0, 0.0, 0.0]",
                                             "self.spec, self.counts = speculative_config, [0.0, 0.0, 0.0]\n"
                                             "        assert not speculative_config, 'no drafter here'"))
    run, summary = _fake_call(tmp_path, "--models", "kimi_slice", "--no-chart", "--no-check", "--v1-ks")
    assert run.returncode == 1
    status = {n: r["status"] for n, r in summary["runs"].items()}
    assert status == {"kimi_slice/nospec": "done", "kimi_slice/upstream_k3": "error", "kimi_slice/fork_k3": "error",
                      "kimi_slice/nospec_shallow": "done"}
    assert "AssertionError: no drafter here" in summary["runs"]["kimi_slice/fork_k3"]["error"]


def test_parallel_start_rounds_through_the_worker_protocol(tmp_path: Path) -> None:
    """The install test's protocol check with the stand-in vLLM: two engines start at once, each is measured in
    two interleaved rounds (turn files, ready and round events), both finish with every round's rate kept."""
    pytest.importorskip("tokenizers")
    from engine_script import tiny_tokenizer

    pair = tmp_path / "pair"
    tiny_tokenizer(pair / "target" / "tokenizer.json")
    (pair / "MANIFEST.json").write_text("{}")
    run, summary = _fake_call(tmp_path, "--pair", str(pair), "--models", "pair", "--engines", "pair/nospec",
                              "pair/fork_k3", "--parallel-start", "--rounds", "2", "--concurrency", "2", "--no-chart")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    runs = summary["runs"]
    assert {n: r["status"] for n, r in runs.items()} == {"pair/nospec": "done", "pair/fork_k3": "done"}
    assert [len(r["by_concurrency"]["2"]["tok_s_rounds"]) for r in runs.values()] == [2, 2]
    assert "round 2, last" in run.stdout

    # the same with a turn per concurrency and short re-warm-ups: every engine measured at each c in each round
    run, summary = _fake_call(tmp_path, "--pair", str(pair), "--models", "pair", "--engines", "pair/nospec",
                              "pair/fork_k3", "--parallel-start", "--rounds", "2", "--turns", "concurrency",
                              "--rewarm-tokens", "2", "--no-chart")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    runs = summary["runs"]
    assert {n: r["status"] for n, r in runs.items()} == {"pair/nospec": "done", "pair/fork_k3": "done"}
    assert {n: {c: len(e["tok_s_rounds"]) for c, e in r["by_concurrency"].items()} for n, r in runs.items()} == {
        n: {"1": 2, "2": 2} for n in runs}
    steals = [x for r in runs.values() for e in r["by_concurrency"].values() for x in e["steal_share_rounds"]]
    assert len(steals) == 8
    if Path("/proc/stat").is_file():  # Linux: every measurement has its stolen share and its busy threads
        assert all(x is not None and x >= 0 for x in steals), steals
        for entry in (e for r in runs.values() for e in r["by_concurrency"].values()):
            assert all(isinstance(x, list) for x in entry["busy_rounds"]), entry["busy_rounds"]
            assert all(isinstance(x, bool) for x in entry["shared_core_rounds"]), entry["shared_core_rounds"]
        assert all(r["cpus"] == sorted(os.sched_getaffinity(0)) and r["cpu_cores"] for r in runs.values())
    assert "round 2, turn 2 of 2, last" in run.stdout


def test_pool_joins_the_rounds_of_calls_of_the_same_plan() -> None:
    """--pool: the per-round ratios of two calls in one list per row (median, spread and goal recomputed), the
    rest of the row from the first call; results of another device are refused."""
    from kimi_lab.bench.perf.analysis import pool
    from kimi_lab.bench.perf.render import pinned_words

    def part(rounds: list[float], hookoff: list[float], device: str = "H200") -> dict:
        row = {"model": "pair", "k": 3, "concurrency": 4, "fork_vs_upstream": max(rounds), "fork_tok_s": 10.0,
               "fork_vs_upstream_rounds": rounds, "fork_vs_upstream_median": 0.0, "fork_vs_upstream_spread": [0, 0],
               "fork_vs_hookoff_rounds": hookoff}
        return {"device": device, "versions": {"fork": "0.32.0+kimi.1"}, "command": f"call {rounds}",
                "date": "2026-12-01T00:00:00+00:00", "seconds": 1.0, "rows": [row],
                "settings": {"concurrency": [4], "tokens": 256, "ks": [3], "reps": len(rounds),
                             "turns": "concurrency" if len(rounds) > 2 else None,
                             **({"pinned": "cores"} if len(rounds) > 2 else {})}}

    got = pool([part([0.9, 1.2], [1.0]), part([1.05, 1.1, 0.99], [])], ["tau is the first call's"])
    [row] = got["rows"]
    assert row["fork_vs_upstream_rounds"] == [0.9, 1.2, 1.05, 1.1, 0.99] and row["fork_vs_upstream_median"] == 1.05
    assert row["fork_vs_upstream_spread"] == [0.9, 1.2] and row["fork_vs_hookoff_rounds"] == [1.0]
    assert row["calls"] == 2 and row["fork_vs_upstream"] == 1.2  # the first call's best-of ratio
    assert got["goal"]["pair_k3_median_min"] == 1.05 and got["goal"]["pair_k3_median_met"] is False  # 0.9 < 0.98
    assert got["command"] == "call [0.9, 1.2] ; call [1.05, 1.1, 0.99]" and "pooled over 2 calls" in got["notes"][0]
    assert got["notes"][-1] == "tau is the first call's"  # --note with --pool
    assert got["settings"]["reps"] == [2, 3] and got["settings"]["turns"] == [None, "concurrency"]
    assert got["settings"]["pinned"] == ["unrecorded", "cores"]  # each call's --pin, not the first call's alone
    assert pinned_words(got["settings"]["pinned"]) == "; pinned per call: unrecorded, cores"
    assert [pinned_words(p) for p in (None, True, "shares")] == ["", "; each engine pinned to its own CPUs",
                                                               "; each engine pinned to its own cores"]
    assert row["rounds"] == [5, 5] and row["fork_vs_upstream_ci95"] is None  # 5 rounds hold no 95 % interval
    six = pool([part([0.9, 1.2, 1.0], []), part([1.05, 1.1, 0.99], [])])["rows"][0]
    assert six["fork_vs_upstream_ci95"] == [0.9, 1.2] and six["fork_vs_upstream_median"] == 1.025
    with pytest.raises(ValueError, match="cannot combine"):
        pool([part([1.0], []), part([1.0], [], device="H100")])
    other = part([1.0], [])
    other["settings"]["tokens"] = 128
    with pytest.raises(ValueError, match="different tokens"):
        pool([part([1.0], []), other])


def test_the_median_interval_is_the_sign_tests() -> None:
    """Order statistics of the binomial tail (sign-test interval, tables e.g. Conover 1999): none below 6 values,
    min-max at 6, the 2nd and 9th of 10, the 6th and 17th of 22 (1-based); unsorted input is fine."""
    from kimi_lab.bench.perf.analysis import median_ci95

    assert median_ci95([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_ci95([6.0, 1.0, 3.0, 2.0, 5.0, 4.0]) == [1.0, 6.0]
    assert median_ci95([float(x) for x in range(10, 0, -1)]) == [2.0, 9.0]
    assert median_ci95([float(x) for x in range(1, 23)]) == [6.0, 17.0]


def test_markdown_shows_the_median_interval_and_the_rounds(tmp_path: Path) -> None:
    from kimi_lab.bench.perf.render import per_round

    row = {"fork_vs_upstream_rounds": [1.0] * 6, "fork_vs_upstream_median": 1.0, "fork_vs_upstream_ci95": [0.9, 1.1],
           "fork_vs_upstream_spread": [0.8, 1.2]}
    assert per_round(row, "fork_vs_upstream") == "1.0 [0.9-1.1] (0.8-1.2) n=6"
    row.update(fork_vs_upstream_rounds=[1.0], fork_vs_upstream_ci95=None, fork_vs_upstream_spread=[1.0, 1.0])
    assert per_round(row, "fork_vs_upstream") == "1.0 (1.0-1.0)"
    assert per_round({}, "fork_vs_upstream") == "-"


def test_noise_of_a_call_spread_correlations_and_steal(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--noise: per row the SD of log(fork/upstream), r between fork and upstream, each engine's CV, largest stolen
    share and r against the shares (rounds without one left out), the rounds whose busy threads shared a core and r
    against that; the call's SD pooled within rows; the CLI writes markdown and JSON and refuses what holds no
    rounds, a missing file, two files of one label, and --noise beside --pool or --combine."""
    import math
    import statistics

    from kimi_lab.bench.perf.noise import noise

    def run(by_c: dict[str, list[float]], steal: list[float | None] | None = None,
            shared: list[bool | None] | None = None) -> dict:
        return {"status": "done", "by_concurrency": {
            c: {"tok_s_rounds": rates, **({"steal_share_rounds": steal} if steal is not None else {}),
                **({"shared_core_rounds": shared} if shared is not None else {})}
            for c, rates in by_c.items()}}

    fork, up = [100.0, 120.0, 90.0, 110.0], [100.0, 100.0, 100.0, 105.0]
    fork16, up16 = [200.0, 210.0, 190.0, 220.0], [205.0, 200.0, 195.0, 200.0]
    part = {"command": "x", "date": "d", "device": "H200",
            "runs": {"pair/nospec": run({"4": [50.0, 60.0, 55.0, 40.0]}, [0.0, 0.1, None, 0.4]),
                     "pair/upstream_k3": run({"4": up, "16": up16}),
                     "pair/fork_k3": run({"4": fork, "16": fork16}, [0.03, 0.01, 0.05, 0.02],
                                         [False, True, None, True]),
                     "pair/fork_v1_k3": run({"4": [1.0, 2.0, 3.0, 4.0]}), "pair/hookoff_k3": {"status": "error"}}}
    got = noise(part)
    row, row16 = got["rows"]
    logs = [math.log(f / u) for f, u in zip(fork, up, strict=True)]
    logs16 = [math.log(f / u) for f, u in zip(fork16, up16, strict=True)]
    assert (row["concurrency"], row16["concurrency"]) == (4, 16)
    assert row["rounds"] == 4 and row["log_ratio_sd"] == round(statistics.stdev(logs), 3)
    pooled = math.sqrt((statistics.variance(logs) + statistics.variance(logs16)) / 2)  # equal rounds: the mean
    assert got["log_ratio_sd"] == round(pooled, 3) != round(statistics.stdev(logs + logs16), 3)
    assert row["r_fork_upstream"] == round(statistics.correlation(fork, up), 2)
    assert row["engines"]["fork_k3"] == {"cv": round(statistics.stdev(fork) / statistics.mean(fork), 3),
                                         "steal_max": 0.05,
                                         "r_steal": round(statistics.correlation(fork, [0.03, 0.01, 0.05, 0.02]), 2),
                                         "shared": "2/3",
                                         "r_shared": round(statistics.correlation([100.0, 120.0, 110.0], [0, 1, 1]), 2)}
    assert row["engines"]["nospec"]["r_steal"] == round(statistics.correlation([50.0, 60.0, 40.0], [0.0, 0.1, 0.4]), 2)
    assert row["engines"]["upstream_k3"] == {"cv": row["engines"]["upstream_k3"]["cv"], "steal_max": None,
                                             "r_steal": None, "shared": None, "r_shared": None}
    assert set(row["engines"]) == {"nospec", "upstream_k3", "fork_k3", "fork_v1_k3"}

    bench = load_benchmark("perf_vs_upstream")
    (tmp_path / "a").mkdir()
    call = tmp_path / "a" / "call1.json"
    call.write_text(json.dumps(part))
    assert bench.main(["--noise", str(call), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "perf_noise.md").read_text()
    assert f"| a/call1 | pair | 3 | 4 | 4 | {row['log_ratio_sd']} |" in text and "upstream_k3 -" in text
    assert "| nospec -, upstream_k3 -, fork_k3 2/3, fork_v1_k3 - |" in text  # the shared-core column
    assert f"| a/call1 | all | | | | {got['log_ratio_sd']} | | | | | | |" in text  # as many cells as the header
    assert json.loads((tmp_path / "out" / "perf_noise.json").read_text())["a/call1"] == got
    (tmp_path / "b" / "a").mkdir(parents=True)
    (tmp_path / "b" / "a" / "call1.json").write_text(json.dumps(part))
    pooled_result = tmp_path / "pooled.json"
    pooled_result.write_text(json.dumps({"rows": [], "runs": {}}))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"runs": {"pair/nospec": {"status": "done", "by_concurrency": {"4": {"tok_s": 1.0}}}}}))
    for argv, message in (([str(call), str(tmp_path / "b" / "a" / "call1.json")], "share a label"),
                          ([str(tmp_path / "missing.json")], "No such file"),
                          ([str(pooled_result)], "not a --pool or --combine result"),
                          ([str(old)], "predates interleaved rounds")):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--noise", *argv, "--out", str(tmp_path / "out2")])
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv
    for other in ("--pool", "--combine"):  # one of the result-file modes, not the first silently
        with pytest.raises(SystemExit) as stop:
            bench.main(["--noise", str(call), other, str(call), "--out", str(tmp_path / "out2")])
        assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err, other
    assert not (tmp_path / "out2").exists()


def test_round_ratios_pair_rounds_and_the_median_goal() -> None:
    from kimi_lab.bench.perf.analysis import goal, round_ratios

    got = round_ratios({"tok_s_rounds": [110.0, 90.0, 105.0]}, {"tok_s_rounds": [100.0, 100.0, 100.0]})
    assert got == {"fork_vs_upstream_rounds": [1.1, 0.9, 1.05], "fork_vs_upstream_median": 1.05,
                   "fork_vs_upstream_ci95": None, "fork_vs_upstream_spread": [0.9, 1.1]}
    assert round_ratios({"tok_s_rounds": [1.0]}, {}) == {}
    row = {"model": "pair", "k": 3, "concurrency": 4, "fork_vs_upstream": 1.1, **got}
    assert goal([row])["pair_k3_median_min"] == 1.05 and goal([row])["pair_k3_round_min"] == 0.9
    assert goal([row])["pair_k3_median_met"] is False  # one round below 0.98
    row.update(fork_vs_upstream_spread=[0.99, 1.1])
    assert goal([row])["pair_k3_median_met"] is True


class TurnRecorder:
    """A worker of :func:`measure_rounds` that records the orders it gets (``events``) and measures at once."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def go(self, number: int, order: str) -> None:
        self.events.append(f"go{number} {order} {self.name}")

    def wait_turn(self, number: int, limit: float) -> bool:
        self.events.append(f"wait{number} {self.name}")
        return True

    def collect(self, limit: float) -> dict:
        self.events.append(f"collect {self.name}")
        return {"status": "done", "seconds": 0.0}


def test_turns_per_concurrency_give_every_engine_a_turn_at_one_concurrency_before_the_next() -> None:
    """--turns concurrency: a round is one turn per engine and concurrency, numbered across rounds; the engine
    order flips every turn and every round; too little time for a round stops every engine at that round's first
    turn number."""
    import argparse
    import time

    events: list[str] = []
    jobs = [{"name": "F"}, {"name": "U"}]
    workers = {j["name"]: TurnRecorder(j["name"], events) for j in jobs}
    args = argparse.Namespace(rounds=2, job_timeout_s=5, turns="concurrency", concurrency=[1, 4])
    runs: dict = {}
    measure_rounds(args, jobs, workers, time.monotonic() + 600, runs, lambda job: None)
    assert events == ["go0 more F", "wait0 F", "go0 more U", "wait0 U",   # round 1, c = 1
                      "go1 more U", "wait1 U", "go1 more F", "wait1 F",   # round 1, c = 4
                      "go2 more U", "wait2 U", "go2 more F", "wait2 F",   # round 2, c = 1
                      "go3 last F", "collect F", "go3 last U", "collect U"]
    assert set(runs) == {"F", "U"}

    events.clear()
    measure_rounds(argparse.Namespace(rounds=3, job_timeout_s=5, turns="concurrency", concurrency=[1, 4]), jobs,
                   workers, time.monotonic() + 30, {}, lambda job: None)
    assert events[-4:] == ["go2 stop F", "go2 stop U", "collect F", "collect U"] and len(events) == 12


def test_a_turn_measures_every_concurrency_or_one_in_order() -> None:
    """A turn per concurrency follows the call's list; an engine that measures only some of them (the check engine:
    the largest) takes every turn and measures at its own ones only."""
    job = {"concurrency": [1, 4, 16]}
    assert [turn_concurrency(job, n) for n in range(2)] == [[1, 4, 16], [1, 4, 16]]
    job.update(turns="concurrency", call_concurrency=[1, 4, 16])
    assert [turn_concurrency(job, n) for n in range(5)] == [[1], [4], [16], [1], [4]]
    check = {"concurrency": [16], "turns": "concurrency", "call_concurrency": [1, 4, 16]}
    assert [turn_concurrency(check, n) for n in range(6)] == [[], [], [16], [], [], [16]]


def test_turn_options_are_checked_before_anything_starts() -> None:
    """What :func:`turn_errors` refuses: turn options without turns, a re-warm-up outside 2..--tokens, a
    concurrency given twice; both benchmarks' parsers carry the options run_parallel reads."""
    import argparse

    from kimi_lab.bench.perf.plan import add_turn_options, turn_errors

    p = argparse.ArgumentParser()
    add_turn_options(p, "with turns")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])

    def errors(*argv: str, parallel: bool = True) -> str:
        return "; ".join(turn_errors(p.parse_args(list(argv)), parallel))

    assert errors("--pin", "--turns", "concurrency", "--rewarm-tokens", "8") == ""
    assert errors() == "" and errors(parallel=False) == ""
    got = errors("--pin", "--turns", "concurrency", "--rewarm-tokens", "8", parallel=False)
    assert [f"{flag} acts on the turns of --parallel-start" in got for flag in ("--pin", "--turns", "--rewarm-tokens")
            ] == [True, True, True]
    assert "between 2 (one decode step) and --tokens (64), got 1" in errors("--rewarm-tokens", "1")
    assert "got 65" in errors("--rewarm-tokens", "65")
    assert "--concurrency lists [4] more than once" in errors("--concurrency", "4", "1", "4")
    for script in ("perf_vs_upstream", "quantized"):
        dests = {a.dest for a in load_benchmark(script).parser()._actions}
        assert {"pin", "turns", "rewarm_tokens", "rounds", "concurrency", "tokens", "budget_s"} <= dests, script


def test_quantized_runs_its_engines_through_run_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/quantized.py's arguments hold everything run_parallel and measure_rounds read (it lacked --pin
    once: an AttributeError after its targets were made)."""
    import argparse
    import time

    started: list[str] = []

    class GoneAtOnce:
        def __init__(self, args, job, scratch, parallel=False, threads=None, cpus=None) -> None:
            started.append(job["name"])
            self.proc = argparse.Namespace(poll=lambda: 1)

        def ready(self) -> bool:
            return False

        def collect(self, limit: float) -> dict:
            return {"status": "error", "seconds": 0.0}

    monkeypatch.setattr(orchestrate, "Worker", GoneAtOnce)
    args = load_benchmark("quantized").parser().parse_args(["--scratch", str(tmp_path), "--turns", "concurrency"])
    runs: dict = {}
    run_parallel(args, [{"name": "bf16/nospec"}], time.monotonic() + 600, runs, lambda job: None)
    assert started == ["bf16/nospec"] and runs["bf16/nospec"]["status"] == "error"


def test_later_measurements_of_a_concurrency_warm_up_with_rewarm_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first measurement of c: a full-length warm-up, the timed batch, the step timer's short batch; a later
    one: the --rewarm-tokens warm-up and the timed batch (without the option: full-length warm-ups)."""
    import types

    from engine_script import FAKE_TORCH, FAKE_VLLM

    fake, fake_torch = types.ModuleType("vllm"), types.ModuleType("torch")
    exec(FAKE_VLLM, fake.__dict__)
    exec(FAKE_TORCH, fake_torch.__dict__)  # the step timer's, as in the stand-in site
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    lengths: list[int] = []

    class Recording(fake.LLM):
        def generate(self, requests, params, use_tqdm=True):
            lengths.append(params.max_tokens)
            return super().generate(requests, params, use_tqdm)

    llm = Recording("target", speculative_config={"num_speculative_tokens": 3})
    job = {"prompts": [[5, 6, 7]], "tokens": 64, "reps": 1, "rewarm_tokens": 8}
    first = measure(llm, job, 2, first=True)
    assert lengths == [64, 64, 48] and first["output_tokens"] == 128 and "steps" in first
    lengths.clear()
    later = measure(llm, job, 2, first=False)
    assert lengths == [8, 64] and later["output_tokens"] == 128 and "steps" not in later
    lengths.clear()
    measure(llm, {**job, "rewarm_tokens": None}, 2, first=False)
    assert lengths == [64, 64]


def test_cpu_groups_split_in_order_and_share_when_short() -> None:
    def single(*cpus: int) -> list[list[int]]:  # CPUs without SMT: each a core of its own
        return [[cpu] for cpu in cpus]

    assert cpu_groups(2, single(3, 2, 1, 0)) == [[0, 1], [2, 3]]
    assert cpu_groups(2, single(*range(5))) == [[0, 1], [2, 3]]  # the remainder is left out, groups stay equal
    assert cpu_groups(3, single(0, 1)) == [[0], [1], [0]]
    for bad in ({"workers": 0}, {"workers": 2, "mode": "threads"}):
        with pytest.raises(ValueError):
            cpu_groups(cores=single(0, 1), **bad)


def test_cpu_groups_keep_smt_siblings_together_or_use_one_thread_per_core() -> None:
    """16 CPUs as 8 cores of two threads (Linux numbers siblings i and i + 8 on many x86 hosts): shares give each
    engine whole cores, never a sibling of another engine's CPU (the old contiguous split gave [0-4], [5-9], ...
    whose CPUs 0 and 8 share a core); ``cores`` gives every engine one thread of each core."""
    cores = [[i, i + 8] for i in range(8)]
    groups = cpu_groups(3, cores)
    assert groups == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13]]
    core_of = {cpu: i for i, core in enumerate(cores) for cpu in core}
    assert len({core_of[cpu] for group in groups for cpu in group}) == 6  # no core in two groups
    assert cpu_groups(3, cores, mode="cores") == [list(range(8))] * 3
    # fewer cores than engines: the CPUs are split (siblings apart: nothing better is left)
    assert cpu_groups(3, [[0, 2], [1, 3]]) == [[0], [1], [2]]


def test_cpu_cores_read_the_thread_siblings_lists(tmp_path: Path) -> None:
    for cpu, siblings in {0: "0,4", 1: "1,5", 4: "0,4", 5: "1,5", 6: "2-3,6\n"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings)
    assert cpu_list("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    # siblings outside the CPUs asked for are left out; a CPU without a list (7) is a core of its own
    assert cpu_cores([0, 1, 4, 5, 6, 7], tmp_path) == [[0, 4], [1, 5], [6], [7]]
    assert cpu_cores([5, 0], tmp_path) == [[0], [5]]
    # lists that disagree (cpu2 names 0 and 2, cpu0 only itself; cpu3 unreadable while cpu1 names 3): no CPU lost
    # or given twice
    for cpu, siblings in {10: "10", 12: "10,12", 11: "11,13"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings)
    assert cpu_cores([10, 11, 12, 13], tmp_path) == [[10], [11, 13], [12]]
    assert sorted(cpu for core in cpu_cores() for cpu in core) == sorted(os.sched_getaffinity(0))  # this machine


def test_thread_cpu_follows_the_child_processes(tmp_path: Path) -> None:
    """thread_cpu: this process's threads and its children's (the engine core runs in one), with their CPU time."""
    burn = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
            "print('done', flush=True)\ntime.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"
        seen = thread_cpu()
        assert os.getpid() in seen and child.pid in seen  # a main thread's id is its process's
        used, cpu = seen[child.pid]
        assert used >= 0.4 and cpu in os.sched_getaffinity(0)
        assert thread_cpu(os.getpid(), proc=tmp_path) == {}  # no /proc there: nothing
        # a command name cut inside a UTF-8 character (comm holds 15 bytes) neither stops nor hides the others
        fake = tmp_path / "proc"
        for pid, comm in ((7, b"engine"), (8, b"ab\xc3) x\xff")):
            (fake / str(pid) / "task" / str(pid)).mkdir(parents=True)
            # fields 3 (state), 4 (ppid), 5-13, 14-15 (utime, stime), 16-38, 39 (processor)
            line = b"%d (%s) S %d " % (pid, comm, 1 if pid == 8 else 0) + b"0 " * 9 + b"100 50 " + b"0 " * 23 + b"3"
            for stat in (fake / str(pid) / "stat", fake / str(pid) / "task" / str(pid) / "stat"):
                stat.write_bytes(line)
        tick = os.sysconf("SC_CLK_TCK")
        assert thread_cpu(7, proc=fake) == {7: (150 / tick, 3)}
        assert thread_cpu(1, proc=fake) == {8: (150 / tick, 3)}  # the child of 1 (not there itself), odd name read
    finally:
        child.kill()
        child.wait()


def test_busy_threads_say_when_two_share_a_core() -> None:
    """Two threads busy for most of 2 s on CPUs 0 and 8 (SMT siblings): shared; on 0 and 1: not; an idle thread
    (under a fifth of a CPU) never counts; no readings: unknown."""
    cores = [[i, i + 8] for i in range(8)]
    before = {10: (1.0, 0), 11: (5.0, 3), 12: (0.0, 8)}
    assert busy_threads(before, {10: (2.8, 0), 11: (5.1, 8), 12: (1.6, 8)}, 2.0, cores) == {
        "busy": [[0, 0.9], [8, 0.8]], "shared_core": True}
    assert busy_threads(before, {10: (2.8, 0), 11: (5.1, 8), 12: (1.6, 1)}, 2.0, cores)["shared_core"] is False
    assert busy_threads(before, {10: (2.8, 0), 13: (9.0, 0)}, 2.0, cores) == {"busy": [[0, 0.9]],
                                                                               "shared_core": False}
    assert busy_threads({}, {10: (2.8, 0)}, 2.0, cores) == {"busy": None, "shared_core": None}


def test_a_pinned_worker_runs_on_its_cpus_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--pin: the worker process (and what it starts) is held to its group; an unpinned one keeps them all."""
    import time

    script = tmp_path / "bench" / "report_cpus.py"
    script.parent.mkdir()
    script.write_text("import json, os, sys\n"
                      "with open(sys.argv[3], 'a') as f:\n"
                      "    f.write(json.dumps({'event': 'done', 'job': 'j', 'cpus': sorted(os.sched_getaffinity(0))})"
                      " + '\\n')\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    mine = sorted(os.sched_getaffinity(0))
    for name, cpus, expected in (("pinned", [mine[-1]], [mine[-1]]), ("free", None, mine)):
        worker = WorkerProcess({"jobs": []}, tmp_path / f"{name}.json", tmp_path / f"{name}.events",
                               tmp_path / f"{name}.log", dict(os.environ), cpus=cpus)
        assert worker.proc.wait(timeout=30) == 0, (tmp_path / f"{name}.log").read_text()
        deadline = time.monotonic() + 5
        while worker.outcome("j") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.outcome("j") == {"status": "done", "cpus": expected}


def test_parallel_start_with_pin_gives_each_engine_its_own_cpus(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import time

    given: dict = {}

    class FakeWorker:
        def __init__(self, args, job, scratch, parallel=False, threads=None, cpus=None) -> None:
            given[job["name"]] = cpus
            self.proc = argparse.Namespace(poll=lambda: 1)  # gone at once: collected, nothing measured

        def ready(self) -> bool:
            return False

        def collect(self, limit: float) -> dict:
            return {"status": "error", "seconds": 0.0}

    monkeypatch.setattr(orchestrate, "Worker", FakeWorker)
    smt = [[i, i + 8] for i in range(8)]  # 8 cores of two threads
    monkeypatch.setattr(orchestrate, "cpu_groups", lambda n, mode: cpu_groups(n, smt, mode))
    jobs = [{"name": "pair/fork_k3"}, {"name": "pair/upstream_k3"}]
    for pin, expected in (("shares", [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]),
                          ("cores", [list(range(8))] * 2)):
        run_parallel(argparse.Namespace(job_timeout_s=0.5, scratch=tmp_path, rounds=1, pin=pin, turns="engine"),
                     jobs, time.monotonic() + 600, {}, lambda job: None)
        assert list(given.values()) == expected, pin
    args = load_benchmark("perf_vs_upstream").parser().parse_args
    assert (args(["--pin"]).pin, args(["--pin", "cores"]).pin, args([]).pin) == ("shares", "cores", None)


def test_gpu_clocks_sample_while_the_block_runs_and_stop_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """--gpu-clocks: a stand-in nvidia-smi writes its arguments and pid, then a line a tick until stopped; it is
    stopped when the block ends, also by an error (no `pkill -f` in the device command); without nvidia-smi the
    CLI refuses before anything starts."""
    import time

    from kimi_lab.bench.hardware import GPU_CLOCK_FIELDS, gpu_clocks

    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nout=\"$6\"\necho \"$* pid $$\" > \"$out\"\n"
                    "while true; do echo 1980 >> \"$out\"; sleep 0.05; done\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    csv = tmp_path / "out" / "gpu-clocks.csv"
    with pytest.raises(RuntimeError), gpu_clocks(csv):
        deadline = time.monotonic() + 10
        while (not csv.exists() or csv.read_text().count("1980") < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert csv.read_text().count("1980") >= 2  # sampling while the block runs
        raise RuntimeError("an engine failed")
    head = csv.read_text().splitlines()[0]
    assert head.startswith(f"--query-gpu={GPU_CLOCK_FIELDS} --format=csv -l 1 -f {csv}")
    pid = int(head.rsplit(" ", 1)[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
    size = csv.stat().st_size
    time.sleep(0.2)
    assert csv.stat().st_size == size
    with gpu_clocks(None):  # off: nothing started, nothing written
        pass
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="nvidia-smi"), gpu_clocks(csv):
        pass
    bench = load_benchmark("perf_vs_upstream")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--gpu-clocks", "--cpu-smoke", "--out", str(tmp_path / "never")])
    assert stop.value.code == 2 and "nvidia-smi, which is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
