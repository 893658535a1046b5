"""The plausibility numbers that gate the reference pair: loops and distinct-2 (kimi.models.quality)."""

from __future__ import annotations

import math

from kimi.models.quality import distinct_n, is_loop, loop_share


def test_a_tail_repeating_one_ngram_to_the_end_is_a_loop() -> None:
    varied = list(range(100, 132))
    assert is_loop(varied + [7] * 32)                      # one token to the end
    assert is_loop(varied + [1, 2, 3, 4, 5] * 7)           # a 5-gram to the end
    assert not is_loop(list(range(64)))                     # no repetition
    assert not is_loop([1, 2, 3, 4, 5] * 6 + list(range(100, 134)))  # repeated early, then varied to the end
    assert not is_loop(varied + [1, 2, 3, 4, 5] * 6 + [9])  # the repetition stops before the end
    assert not is_loop([7] * 30)                             # too short to judge


def test_loop_share_and_distinct_2() -> None:
    assert loop_share([[7] * 64, list(range(64)), list(range(64)), list(range(64))]) == 0.25
    assert math.isnan(loop_share([]))
    assert distinct_n([[1, 2, 1, 2]]) == 2 / 3                       # (1,2) (2,1) (1,2)
    assert distinct_n([[1, 2, 3], [1, 2, 4]]) == 3 / 4               # pooled over completions
    assert math.isnan(distinct_n([[1]]))


def test_the_pair_gates_name_each_limit_missed() -> None:
    from kimi_lab.bench.acceptance import gates

    result = {"tau": 2.5, "tau_shifted_ids": 2.1, "quality": {"loop_share": 0.1, "distinct_2": 0.6}}
    assert gates(result)["all_met"]
    low = gates({**result, "tau": 1.5, "tau_shifted_ids": 1.4})
    assert not low["all_met"] and not low["tau"]["met"] and not low["shifted_gap"]["met"] and low["loop_share"]["met"]
    loops = gates({**result, "quality": {"loop_share": 0.75, "distinct_2": 0.28}})
    assert [name for name in ("loop_share", "distinct_2", "tau", "shifted_gap") if not loops[name]["met"]] == [
        "loop_share", "distinct_2"]
