"""benchmarks/soak.py's library (kimi_lab.bench.soak) without a server: the process-tree memory reader on a fake /proc,
and the plateau verdict on recorded curves."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_lab.bench.soak import growth, plateaus, role_curves, round_prompts, tree_memory, tree_pids, verdict


def _proc(root: Path, pid: int, ppid: int, comm: str, rss_kb: int | None, pss_kb: int | None = None) -> None:
    folder = root / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304\n")
    rss = f"VmRSS:\t  {rss_kb} kB\n" if rss_kb is not None else ""
    (folder / "status").write_text(f"Name:\t{comm}\nState:\tS (sleeping)\n{rss}Threads:\t4\n")
    (folder / "cmdline").write_bytes(comm.encode() + b"\0--flag\0")
    if pss_kb is not None:
        (folder / "smaps_rollup").write_text(f"00400000-7fff [rollup]\nRss:  {rss_kb} kB\nPss:  {pss_kb} kB\n")


def test_tree_pids_and_memory_follow_parents_on_a_fake_proc(tmp_path: Path) -> None:
    _proc(tmp_path, 100, 1, "vllm serve", 1000, 900)
    _proc(tmp_path, 105, 100, "VLLM::EngineCore", 3000, 2500)
    _proc(tmp_path, 107, 105, "pt_main) (x", 10, 10)  # a comm holding ') (' must not shift the fields
    _proc(tmp_path, 200, 1, "other", 99999, 99999)
    (tmp_path / "self").mkdir()  # non-numeric entries are skipped
    assert tree_pids(100, tmp_path) == [100, 105, 107]
    assert tree_pids(105, tmp_path) == [105, 107]
    mem = tree_memory(100, tmp_path)
    assert mem["rss_mb"] == pytest.approx((1000 + 3000 + 10) * 1024 / 1e6)
    assert mem["pss_mb"] == pytest.approx((900 + 2500 + 10) * 1024 / 1e6)
    assert [p["name"] for p in mem["processes"]] == ["vllm serve", "VLLM::EngineCore", "pt_main) (x"]


def test_pss_is_none_when_a_process_has_no_smaps_rollup(tmp_path: Path) -> None:
    _proc(tmp_path, 100, 1, "server", 1000, 900)
    _proc(tmp_path, 101, 100, "child", 500)
    mem = tree_memory(100, tmp_path)
    assert mem["pss_mb"] is None and mem["processes"][1]["pss_mb"] is None
    assert tree_memory(4242, tmp_path) == {"rss_mb": 0, "pss_mb": None, "processes": []}


def test_growth_splits_rounds_after_the_first() -> None:
    g = growth([100.0, 160.0, 170.0, 175.0, 178.0, 179.0])  # start-up, rounds 1..5; mid = round 3
    assert g["warmup"] == 60.0 and g["mid_round"] == 3
    assert (g["first"], g["second"], g["total"]) == (15.0, 4.0, 19.0)
    with pytest.raises(ValueError):
        growth([1.0, 2.0])


def test_verdict_tells_a_plateau_from_steady_growth_and_names_eagle3s_share() -> None:
    flat = [2000.0, 2100.0] + [2100.0 + 200.0 * (1 - 0.8 ** r) for r in range(1, 41)]
    linear = [2000.0, 2100.0] + [2100.0 + 3.0 * r for r in range(1, 41)]
    out = verdict({"eagle3": linear, "nospec": flat})
    assert out["engines"]["nospec"]["plateaus"] and not out["engines"]["eagle3"]["plateaus"]
    diff = out["eagle3_only"]
    assert diff["second"] == pytest.approx(out["engines"]["eagle3"]["second"] - out["engines"]["nospec"]["second"])
    assert any(line.startswith("eagle3: still growing") for line in out["text"])
    assert any(line.startswith("nospec: plateaus") for line in out["text"])
    # below the floor counts as flat even when the first half did not grow; a shrinking curve is flat
    assert plateaus({"first": 0.0, "second": 5.0}) and plateaus({"first": 50.0, "second": -3.0})
    assert not plateaus({"first": 50.0, "second": 9.0})
    assert plateaus({"first": 500.0, "second": 40.0}, floor_mb=8.0)


def test_round_prompts_change_with_the_round_and_are_the_same_per_engine() -> None:
    assert round_prompts(1, 16) == round_prompts(1, 16)
    assert round_prompts(1, 16) != round_prompts(2, 16) and len(round_prompts(3, 16)) == 16


def test_role_curves_key_processes_by_name_with_the_root_as_api_server() -> None:
    def row(*procs):
        return {"processes": [{"pid": pid, "name": name, "rss_mb": mb} for pid, name, mb in procs]}

    rows = [row((1, "python", 500.0), (2, "VLLM::Worker", 1200.0)),
            row((1, "python", 501.0), (2, "VLLM::Worker", 1300.0), (3, "python", 14.0))]
    assert role_curves(rows, 1) == {"api_server": [500.0, 501.0], "VLLM::Worker": [1200.0, 1300.0],
                                    "python": [0.0, 14.0]}
