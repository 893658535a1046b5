"""benchmarks/adaptive.py's logic without engines: the goal rule, rows from engine results, the five engines'
speculative configs, the points and prompt sets, the off-domain prompts, and the CPU's upstream site."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi.errors import KimiError
from kimi_lab.bench.adaptive.analysis import GOAL_BEST, GOAL_OVER_UPSTREAM, goal, row_goal, rows_of
from kimi_lab.bench.adaptive.plan import (
    BATCH_SIZE_TABLE,
    ENGINES,
    OTHERS,
    interleave,
    jobs_of,
    measurement_points,
    speculative_config,
)
from kimi_lab.bench.perf.measure import call_points, turn_points

PAIR = Path(__file__).resolve().parents[1] / "models" / "pair"


def row(adaptive: float, none: float = 100.0, up: float = 80.0, table: float = 90.0, fork: float = 95.0) -> dict:
    """A row with one rate per engine and no rounds (the goal reads the ratios of the medians)."""
    return {"tok_s": {"nospec": none, "upstream_k3": up, "upstream_table": table, "fork_k3": fork,
                      "adaptive": adaptive}, "ratios": {}}


def test_adaptive_within_two_percent_of_the_best_other_meets_the_goal_and_below_does_not() -> None:
    best = 100.0  # no speculation is the best of the other four here; upstream k3 (80) loses to it
    ok = row_goal(row(adaptive=best * 0.99, up=best * 0.99 / 1.2))
    assert ok["met"] is True and ok["best_other"] == "nospec" and ok["vs_best"] == 0.99
    low = row_goal(row(adaptive=97.0, up=50.0))  # 0.97 x the best: below the 0.98 of the rule
    assert low["met"] is False and low["met_best"] is False and low["met_upstream"] is True
    assert (GOAL_BEST, GOAL_OVER_UPSTREAM) == (0.98, 1.10)


def test_where_upstream_k3_loses_to_no_speculation_adaptive_must_beat_it_by_ten_percent() -> None:
    # upstream k3 at 95 < none 100: the 1.10 rule applies; adaptive 100 is only 1.05 x upstream
    r = row_goal(row(adaptive=100.0, none=100.0, up=95.0, table=90.0, fork=97.0))
    assert r["upstream_loses"] is True and r["met_best"] is True and r["met_upstream"] is False and r["met"] is False
    r = row_goal(row(adaptive=100.0, none=100.0, up=100.0 / 1.11))
    assert r["met_upstream"] is True and r["met"] is True


def test_where_upstream_k3_beats_no_speculation_the_ten_percent_rule_does_not_apply() -> None:
    r = row_goal(row(adaptive=120.0, none=100.0, up=119.0, table=110.0, fork=121.0))
    assert r["upstream_loses"] is False and r["vs_upstream"] < GOAL_OVER_UPSTREAM and r["met"] is True
    assert row_goal(row(adaptive=117.0, none=100.0, up=119.0, table=110.0, fork=121.0))["met"] is False


def test_per_round_ratios_decide_over_the_medians_and_a_missing_engine_is_not_judged() -> None:
    r = row(adaptive=100.0)
    r["ratios"] = {"adaptive_vs_fork_k3": {"median": 0.9}}  # rounds side by side say adaptive lost
    assert row_goal(r)["met"] is False and row_goal(r)["best_other"] == "fork_k3"
    gone = row(adaptive=100.0)
    del gone["tok_s"]["upstream_table"]
    assert row_goal(gone)["met"] is None and row_goal(gone)["missing"] == ["upstream_table"]


def test_the_call_meets_the_goal_only_when_every_row_does() -> None:
    rows = [{"model": "pair", "set": s, "concurrency": c, "goal": {"met": m}}
            for s, c, m in [("in", 1, True), ("off", 8, True)]]
    assert goal(rows)["met"] is True
    rows.append({"model": "pair", "set": "mixed", "concurrency": 8, "goal": {"met": None}})
    assert goal(rows)["met"] is None and goal(rows)["unjudged"] == ["pair/mixed/8"]
    rows.append({"model": "pair", "set": "off", "concurrency": 64, "goal": {"met": False}})
    assert goal(rows)["met"] is False and goal(rows)["failing"] == ["pair/off/64"]
    assert goal([])["met"] is False


def result(rates: list[float], tokens: list[list[int]], tau: float | None = 2.0, verified=None) -> dict:
    entry = {"tok_s": max(rates), "tok_s_rounds": rates, "tau_rounds": [tau] * len(rates),
             "draft_tokens_rounds": [30.0] * len(rates), "verified_rounds": [verified] * len(rates), "tokens": tokens}
    return {"status": "done", "by_concurrency": {"off/8": entry}}


def test_rows_take_per_round_ratios_medians_verified_drafts_and_the_lossless_check() -> None:
    jobs = jobs_of("pair", PAIR, {"prompt_sets": {}, "points": [["off", 8]]})
    same, other = [[5, 6]], [[5, 7]]
    runs = {"pair/nospec": result([100.0, 120.0, 110.0], same, tau=None),
            "pair/upstream_k3": result([60.0, 70.0, 65.0], same),
            "pair/upstream_table": result([50.0, 55.0, 52.0], same),
            "pair/fork_k3": result([62.0, 72.0, 66.0], same),
            "pair/adaptive": result([101.0, 119.0, 112.0], other, tau=1.2, verified=3.0)}
    [r] = rows_of(runs, jobs)
    assert (r["set"], r["concurrency"], r["tok_s"]["nospec"]) == ("off", 8, 110.0)
    assert r["ratios"]["adaptive_vs_nospec"]["rounds"] == [1.01, 0.9917, 1.0182]
    assert r["ratios"]["adaptive_vs_nospec"]["median"] == 1.01
    assert r["verified"] == {"nospec": 30.0, "upstream_k3": 30.0, "upstream_table": 30.0, "fork_k3": 30.0,
                             "adaptive": 3.0}
    assert r["identical"]["adaptive"] == [0, 1] and r["identical"]["fork_k3"] == [1, 1] and r["lossless"] is False
    # upstream k3 loses to none by ~0.6 and adaptive beats it by ~1.7, within 2 % of none: met
    assert r["goal"]["upstream_loses"] is True and r["goal"]["met"] is True


def test_the_five_engines_and_their_speculative_configs() -> None:
    assert list(ENGINES) == ["nospec", "upstream_k3", "upstream_table", "fork_k3", "adaptive"]
    assert set(OTHERS) == set(ENGINES) - {"adaptive"}
    assert speculative_config("nospec", "D") is None
    assert speculative_config("adaptive", "D") == {"method": "eagle3", "model": "D", "num_speculative_tokens": 3,
                                                   "enable_adaptive_verification": True}
    table = speculative_config("upstream_table", "D")
    assert table["num_speculative_tokens"] == 5 and table["num_speculative_tokens_per_batch_size"] == BATCH_SIZE_TABLE
    assert BATCH_SIZE_TABLE[0][0] == 1 and all(len(e) == 3 for e in BATCH_SIZE_TABLE)  # vLLM's (first, last, k)
    jobs = jobs_of("pair", PAIR, {})
    assert [(j["variant"], j["k"]) for j in jobs] == [("nospec", 0), ("upstream", 3), ("upstream", 5), ("fork", 3),
                                                     ("fork", 3)]
    with pytest.raises(KimiError, match="unknown engine"):
        speculative_config("eagle5", "D")
    assert speculative_config("adaptive", "D", adaptive_k=5)["num_speculative_tokens"] == 5
    assert speculative_config("fork_k3", "D", adaptive_k=5)["num_speculative_tokens"] == 3
    assert [j["k"] for j in jobs_of("pair", PAIR, {}, adaptive_k=5)] == [0, 3, 5, 3, 5]


def test_points_skip_mixed_at_one_request_and_mixed_batches_are_half_of_each() -> None:
    assert measurement_points(["in", "off", "mixed"], [1, 8]) == [["in", 1], ["off", 1], ["in", 8], ["off", 8],
                                                                   ["mixed", 8]]
    mixed = interleave(["a1", "a2", "a3"], ["b1", "b2", "b3"])
    assert mixed[:4] == ["a1", "b1", "a2", "b2"] and len(mixed) == 6


def test_turns_per_point_walk_every_set_and_concurrency_of_the_call() -> None:
    job = {"prompt_sets": {"in": [[1]], "off": [[2]]}, "points": [["in", 1], ["off", 1], ["in", 8]],
           "concurrency": [1, 8]}
    keys = call_points(job, [1, 8])
    assert keys == ["in/1", "off/1", "in/8"]
    assert [k for k, _, _ in turn_points(job, 0)] == keys  # a turn per engine: every point
    job.update(turns="concurrency", call_points=keys)
    assert [[(k, c, p) for k, c, p in turn_points(job, n)] for n in (0, 1, 2, 3)] == [
        [("in/1", 1, [[1]])], [("off/1", 1, [[2]])], [("in/8", 8, [[1]])], [("in/1", 1, [[1]])]]


def test_offdomain_prompts_are_deterministic_with_the_lengths_asked() -> None:
    pytest.importorskip("tokenizers")
    from kimi.models.offdomain import offdomain_prompts, prompt_lengths

    tok = PAIR / "target" / "tokenizer.json"
    for kind in ("random-text", "random-ids", "prose"):
        a = offdomain_prompts(kind, tok, 4, 200, 100)
        assert a == offdomain_prompts(kind, tok, 4, 200, 100)
        assert [len(p) for p in a] == prompt_lengths(4, 200, 100) == [100, 137, 174, 110]
        assert all(i > 2 for p in a for i in p) or kind == "prose"  # no special ids drawn
    assert offdomain_prompts("random-text", tok, 2, 200, 100, seed=1) != offdomain_prompts("random-text", tok, 2, 200,
                                                                                         100)
    with pytest.raises(KimiError, match="unknown off-domain"):
        offdomain_prompts("klingon", tok, 1, 50)


def test_the_upstream_copy_takes_the_patches_out_and_leaves_the_laid_tree_alone(tmp_path: Path) -> None:
    from kimi.fork.patches import Patch
    from kimi.fork.revert import reverted_copy

    root = tmp_path / "root"
    (root / "vllm").mkdir(parents=True)
    (root / ".kimi").mkdir()
    (root / "vllm" / "a.py").write_text("one\ntwo\nfork\n")
    (root / "vllm" / "new.py").write_text("x = 1\n")
    diff = ("diff --git a/vllm/a.py b/vllm/a.py\n--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,3 @@\n one\n two\n+fork\n"
            "diff --git a/vllm/new.py b/vllm/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/vllm/new.py\n"
            "@@ -0,0 +1 @@\n+x = 1\n")
    patch = Patch(path=tmp_path / "0001-x.patch", header={}, diff=diff)
    changed = reverted_copy(root, tmp_path / "up", [patch])
    assert changed == ["vllm/a.py", "vllm/new.py"]
    assert (tmp_path / "up" / "vllm" / "a.py").read_text() == "one\ntwo\n"
    assert not (tmp_path / "up" / "vllm" / "new.py").exists()
    assert (root / "vllm" / "a.py").read_text() == "one\ntwo\nfork\n" and (root / "vllm" / "new.py").exists()
