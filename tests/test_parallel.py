"""Issue K: EAGLE-3 across tensor- and pipeline-parallel layouts on CPU (``kimi_lab.bench.parallel``,
``benchmarks/parallel.py``); issue 19: the same through vLLM's Ray executor. The logic runs here without vLLM;
the engines in the ``install`` tests (the Ray one also needs ``.venv/bin/python -m pip install ray``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi.e2e.engine import GreedyRun
from kimi_lab.bench import parallel
from kimi_lab.bench.parallel import LAYOUTS, RAY_LAYOUTS, model_rows, omp_bind, tau


def test_omp_bind_splits_the_cpus_and_shares_them_when_short() -> None:
    def single(*cpus: int) -> list[list[int]]:  # CPUs without SMT: each a core of its own
        return [[cpu] for cpu in cpus]

    assert omp_bind(2, single(0, 1)) == "0|1"
    assert omp_bind(2, single(4, 5, 6, 7)) == "4,5|6,7"
    assert omp_bind(4, single(0, 1)) == "0|1|0|1"  # TP 2 x PP 2 on two CPUs: each CPU serves two workers
    assert omp_bind(3, single(0, 1, 2, 3, 4)) == "0|1|2"
    assert omp_bind(2, [[0, 2], [1, 3]]) == "0,2|1,3"  # SMT siblings stay with one worker


def test_bound_threads_keeps_a_binding_the_caller_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "7|8")
    with parallel.bound_threads(2):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "7|8"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    with parallel.bound_threads(2):
        assert "|" in os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_rows_compare_every_layout_with_one_rank_and_keep_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """TP 2 flips one sequence with speculation; PP layouts with a drafter are refused; every layout is a row."""
    def fake(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        assert backend is None  # vLLM's default executors
        if spec and pp > 1:
            return None, {"status": "refused", "error": parallel.REFUSED + "2 ...", "seconds": 0.1}
        tokens_ = [[1, 2], [3, 4]] if not (spec and tp == 2) else [[1, 2], [3, 5]]
        run = GreedyRun(tokens_, {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 6.0}
                        if spec else {"num_drafts": 0.0}, start_s=1.5)
        return run, {"status": "done", "start_s": 1.5, "seconds": 2.0, "counters": run.counters}

    monkeypatch.setattr(parallel, "serve_layout", fake)
    rows = model_rows("pair", "t", {"llama": "d"}, [[9]], 2, 3, lambda msg: None)
    assert [(r["tp"], r["pp"], r["drafter"]) for r in rows] == [(tp, pp, s) for tp, pp in LAYOUTS
                                                                  for s in ("none", "llama")]
    by = {(r["tp"], r["pp"], r["drafter"]): r for r in rows}
    assert by[(1, 1, "llama")]["identical_to_tp1"] == {"identical": 2, "total": 2}
    assert by[(1, 1, "llama")]["tau"] == 2.5 and by[(1, 1, "none")].get("tau") is None
    assert by[(2, 1, "llama")]["identical_to_tp1"] == {"identical": 1, "total": 2}
    assert by[(2, 1, "llama")]["identical_to_layout_nospec"] == {"identical": 1, "total": 2}
    assert by[(1, 2, "none")]["identical_to_tp1"] == {"identical": 2, "total": 2}
    assert by[(2, 2, "llama")]["status"] == "refused" and "identical_to_tp1" not in by[(2, 2, "llama")]
    assert by[(1, 1, "none")]["executor"] == "uni" and by[(2, 1, "none")]["executor"] == "mp"
    assert tau({"num_drafts": 0.0}) is None


def test_layouts_keeps_only_the_named_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def fake(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        calls.append((tp, pp))
        run = GreedyRun([[1, 2]], {"num_drafts": 0.0}, start_s=1.0)
        return run, {"status": "done", "start_s": 1.0, "seconds": 1.0, "counters": run.counters}

    monkeypatch.setattr(parallel, "serve_layout", fake)
    rows = model_rows("pair", "t", {}, [[9]], 2, 3, lambda msg: None, layouts=((1, 1), (2, 2)))
    assert calls == [(1, 1), (2, 2)] and [(r["tp"], r["pp"]) for r in rows] == calls


def test_without_one_rank_no_layout_is_called_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the target alone on one rank fails, later layouts have nothing to be compared with (not each other)."""
    def fake(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        if (tp, pp) == (1, 1) and spec is None:
            return None, {"status": "error", "error": "boom", "seconds": 0.1}
        run = GreedyRun([[1, 2]], {"num_drafts": 0.0}, start_s=1.0)
        return run, {"status": "done", "start_s": 1.0, "seconds": 1.0, "counters": run.counters}

    monkeypatch.setattr(parallel, "serve_layout", fake)
    rows = model_rows("pair", "t", {}, [[9]], 2, 3, lambda msg: None)
    assert rows[0]["status"] == "error" and all(r.get("identical_to_tp1") is None for r in rows)


def test_a_refusal_keeps_the_forks_message_and_other_failures_their_tail() -> None:
    wrapped = ("1 validation error for SpeculativeConfig\n  Value error, " + parallel.REFUSED + "2 on ... Fix: x "
               "[type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]\n    For further "
               "information visit https://errors.pydantic.dev/2.12/v/value_error")
    assert parallel.failure(wrapped) == {"status": "refused", "error": parallel.REFUSED + "2 on ... Fix: x"}
    assert parallel.failure("x" * 2000 + "boom") == {"status": "error", "error": ("x" * 2000 + "boom")[-1500:]}


def test_ray_rows_run_one_rank_only_once_ray_has_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend="ray": each Ray layout; the one-rank runs (not rows) only once a Ray run served, then once each."""
    calls: list[tuple] = []

    def failing(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        calls.append((tp, pp, bool(spec), backend))
        return None, {"status": "unsupported", "error": parallel.RAY_ON_CPU + ".", "seconds": 0.1}

    monkeypatch.setattr(parallel, "serve_layout", failing)
    rows = model_rows("pair", "t", {"llama": "d"}, [[9]], 2, 3, lambda msg: None, backend="ray")
    ray_calls = [(tp, pp, spec, "ray") for tp, pp in RAY_LAYOUTS for spec in (False, True)]
    assert calls == ray_calls  # no one-rank run to compare nothing with
    assert [(r["tp"], r["pp"], r["executor"], r["status"]) for r in rows] == [
        (tp, pp, "ray", "unsupported") for tp, pp, _, _ in ray_calls]
    assert all(r.get("identical_to_tp1") is None for r in rows)

    def serving(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        calls.append((tp, pp, bool(spec), backend))
        counters = {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 6.0 if tp == 1 else 5.0}
        run = GreedyRun([[1, 2]], counters if spec else {"num_drafts": 0.0}, start_s=1.0)
        return run, {"status": "done", "start_s": 1.0, "seconds": 1.0, "counters": run.counters}

    calls.clear()
    monkeypatch.setattr(parallel, "serve_layout", serving)
    rows = model_rows("pair", "t", {"llama": "d"}, [[9]], 2, 3, lambda msg: None, backend="ray")
    assert calls[:4] == [(2, 1, False, "ray"), (1, 1, False, None), (2, 1, True, "ray"), (1, 1, True, None)]
    assert calls[4:] == ray_calls[2:]  # the one-rank runs are made once
    assert [(r["tp"], r["pp"]) for r in rows] == [layout for layout in RAY_LAYOUTS for _ in range(2)]
    ray_llama = rows[1]
    assert ray_llama["identical_to_tp1"] == {"identical": 1, "total": 1} and ray_llama["tau"] == 2.25
    assert ray_llama["same_counters_as_tp1"] is False  # one accepted token fewer than on one rank


def test_serve_rows_go_through_vllm_serve_and_compare_with_one_rank_in_process(monkeypatch, tmp_path) -> None:
    """backend="serve": PP 2 as vllm serve; EAGLE-3 refused before loading; the one-rank reference in-process."""
    served: list[tuple] = []
    in_process: list[tuple] = []

    def over_http(target, prompt_ids, tokens, tp, pp, spec, logs):
        served.append((tp, pp, bool(spec), logs))
        if spec:
            return None, {"status": "refused", "error": parallel.REFUSED + "2 ...", "seconds": 3.0}
        run = GreedyRun([[1, 2], [3, 4]], {"num_drafts": 0.0}, start_s=9.0)
        return run, {"status": "done", "start_s": 9.0, "seconds": 12.0, "counters": run.counters, "requests": 2,
                     "failed": 0}

    def one_rank(target, prompt_ids, tokens, tp, pp, spec, backend=None):
        in_process.append((tp, pp, bool(spec), backend))
        run = GreedyRun([[1, 2], [3, 5]], {"num_drafts": 0.0}, start_s=1.0)
        return run, {"status": "done", "start_s": 1.0, "seconds": 1.0, "counters": run.counters}

    monkeypatch.setattr(parallel, "serve_over_http", over_http)
    monkeypatch.setattr(parallel, "serve_layout", one_rank)
    rows = model_rows("pair", "t", {"llama": "d"}, [[9], [8]], 2, 3, lambda msg: None, backend="serve", logs=tmp_path)
    assert served == [(1, 2, False, tmp_path), (1, 2, True, tmp_path)]
    assert in_process == [(1, 1, False, None)]  # the reference, once the server has answered; none for the refusal
    assert [(r["tp"], r["pp"], r["executor"], r["status"]) for r in rows] == [(1, 2, "serve", "done"),
                                                                              (1, 2, "serve", "refused")]
    assert rows[0]["identical_to_tp1"] == {"identical": 1, "total": 2} and rows[0]["requests"] == 2
    assert "identical_to_tp1" not in rows[1] and rows[1]["error"].startswith(parallel.REFUSED)
    assert parallel.executor(1, 2, "serve") == "serve" and parallel.SERVE_LAYOUTS == ((1, 2),)


def test_the_local_ray_cluster_declares_the_cpus_of_the_largest_layouts_bundles(monkeypatch) -> None:
    """TP 2 x PP 2 on two CPUs binds "0|1|0|1": four one-CPU bundles, so Ray must declare four CPUs; where cores
    differ in threads, every bundle is as large as the largest group."""
    from kimi_lab.bench import hardware

    cores = {"now": None}
    monkeypatch.setattr(hardware, "cpu_cores", lambda: cores["now"] or [[c] for c in sorted(os.sched_getaffinity(0))])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert parallel.ray_cpus(((2, 1),)) == 2 and parallel.ray_cpus(((2, 1), (2, 2))) == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert parallel.ray_cpus(((2, 2),)) == 16  # four groups of four
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9})
    cores["now"] = [[0, 8], [1, 9], [2], [3]]  # two cores with SMT, two without
    assert parallel.omp_bind(2) == "0,1,8,9|2,3" and parallel.ray_cpus(((2, 1),)) == 8  # two bundles of four


def test_a_failed_start_up_is_reported_by_its_root_cause_and_ray_on_cpu_as_unsupported() -> None:
    log = ("Traceback (most recent call last):\n  File \"ray_utils.py\", line 574\n    raise ValueError(\n"
           "ValueError: current platform cpu does not support ray.\n(EngineCore pid=1) INFO shutting down\n")
    assert parallel.root_cause(log) == "ValueError: current platform cpu does not support ray."
    assert parallel.root_cause("nothing failed") is None
    assert parallel.failure("ValueError: current platform cpu does not support ray. (in the engine core)")[
        "status"] == "unsupported"
    assert parallel.executor(2, 1, "ray") == "ray" and parallel.executor(1, 1, "ray") == "uni"


def test_captured_stderr_catches_what_child_processes_write_and_echoes_it(capfd: pytest.CaptureFixture) -> None:
    import subprocess
    import sys

    with parallel.captured_stderr() as captured:
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('KeyError: from a child\\n')"],
                       check=True)
    assert parallel.root_cause(captured.text) == "KeyError: from a child"
    assert "KeyError: from a child" in capfd.readouterr().err


@pytest.mark.install
def test_tp2_through_rays_executor_on_a_local_cluster_is_lossless_or_refused_as_recorded(trained_pair: Path) -> None:
    """Issue 19: the shipped pair at TP 2 through vLLM's Ray executor on a Ray cluster this test starts and stops.
    vLLM 0.32.0 refuses Ray on its CPU backend before anything loads (``CpuPlatform.ray_device_key`` is empty,
    :data:`~kimi_lab.bench.parallel.RAY_ON_CPU`); the fork (patch 0021) serves it and must give the greedy tokens and
    acceptance counts of TP 1."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: .venv/bin/python -m pip install ray")
    import psutil
    from vllm.platforms import current_platform

    from kimi.e2e.engine import tokenize
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts

    if "RAY_ADDRESS" in os.environ:
        pytest.skip("RAY_ADDRESS names a Ray cluster; this test starts its own")
    target, drafter = str(trained_pair / "target"), str(trained_pair / "drafter")
    prompt_ids = tokenize(target, code_prompts(4))
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    with parallel.local_ray(num_cpus=2) as address:
        assert ray.is_initialized() and os.environ["RAY_ADDRESS"] == address
        cluster = [info.process.pid for infos in ray._private.worker._global_node.all_processes.values()
                   for info in infos]
        two, entry = parallel.serve_layout(target, prompt_ids, 24, 2, 1, spec, CPU_EAGER, backend="ray")
    assert not ray.is_initialized() and "RAY_ADDRESS" not in os.environ  # the cluster is stopped
    assert cluster and not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                               for pid in cluster)
    if not current_platform.ray_device_key:  # vLLM 0.32.0: refused before any worker or weight
        assert two is None and entry["status"] == "unsupported" and entry["seconds"] < 120, entry
        assert entry["error"].startswith("ValueError: " + parallel.RAY_ON_CPU), entry
        return
    assert entry["status"] == "done", entry
    base, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, None, CPU_EAGER)
    one, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, spec, CPU_EAGER)
    assert two.tokens == base.tokens and one.tokens == base.tokens
    assert two.counters == one.counters and two.counters["num_drafts"] > 0


@pytest.mark.install
@pytest.mark.line("mainline")
@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (2, 2)], ids=["pp2", "tp2xpp2"])
def test_pipeline_layouts_through_rays_executor_on_the_torch_only_platform_are_lossless(
        trained_pair: Path, tp: int, pp: int) -> None:
    """The shipped pair with EAGLE-3 at PP 2 and TP 2 x PP 2 through vLLM's Ray executor on the torch-only CPU
    platform (patch 0021 for Ray, 0022 for EAGLE-3 across stages): the greedy tokens of the target alone and the
    acceptance counts of one rank. (The v0.32 line's Ray layouts are recorded by ``benchmarks/parallel.py``.)"""
    pytest.importorskip("ray", reason="Ray is not installed: .venv/bin/python -m pip install ray")
    from kimi.e2e.engine import tokenize
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts

    if "RAY_ADDRESS" in os.environ:
        pytest.skip("RAY_ADDRESS names a Ray cluster; this test starts its own")
    target, drafter = str(trained_pair / "target"), str(trained_pair / "drafter")
    prompt_ids = tokenize(target, code_prompts(4))
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    with parallel.local_ray(num_cpus=parallel.ray_cpus(((tp, pp),))):
        staged, entry = parallel.serve_layout(target, prompt_ids, 24, tp, pp, spec, CPU_EAGER, backend="ray")
    assert entry["status"] == "done", entry
    base, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, None, CPU_EAGER)
    one, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, spec, CPU_EAGER)
    assert staged.tokens == base.tokens
    assert staged.counters == one.counters and staged.counters["num_drafts"] > 0


@pytest.mark.install
def test_the_boundary_drafter_names_an_id_in_each_stage_and_one_at_their_boundary(trained_pair: Path,
                                                                                   tmp_path: Path) -> None:
    import json

    from vllm.distributed.utils import get_pp_indices

    assert parallel.boundary_ids(6) == (2, 3, 5) and parallel.boundary_ids(8) == (3, 4, 7)
    assert get_pp_indices(8, 1, 2)[0] == 4  # the second stage starts at the boundary id
    folder, ids = parallel.boundary_drafter(trained_pair / "drafter", trained_pair / "target", tmp_path / "b")
    config = json.loads((folder / "config.json").read_text())
    assert ids == (2, 3, 5) and config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5]
    assert json.loads((trained_pair / "drafter" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [
        2, 4, 5]  # the original is untouched
    assert (folder / "model.safetensors").read_bytes() == (trained_pair / "drafter" / "model.safetensors").read_bytes()
    assert not (tmp_path / "b.partial").exists()


@pytest.mark.install
@pytest.mark.line("v0.32")
def test_pp2_eagle3_on_the_pair_is_lossless_and_accepts_as_one_stage(trained_pair: Path) -> None:
    """The shipped pair on vLLM's CPU backend (torch.compile: vLLM 0.32.0's CPU workers allocate the pipeline's
    intermediate tensors in the compile warm-up): EAGLE-3 at TP 2 and at PP 2 (patch 0022; upstream fails there,
    see its header) gives the greedy tokens of the target alone on one rank and the acceptance counts of one rank."""
    from kimi.e2e.engine import tokenize
    from kimi.models.prompts import code_prompts

    target, drafter = str(trained_pair / "target"), str(trained_pair / "drafter")
    prompt_ids = tokenize(target, code_prompts(4))
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    base, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, None)
    one, _ = parallel.serve_layout(target, prompt_ids, 24, 1, 1, spec)
    assert one.tokens == base.tokens and one.counters["num_accepted_tokens"] > 0
    for tp, pp in ((2, 1), (1, 2)):
        run, entry = parallel.serve_layout(target, prompt_ids, 24, tp, pp, spec)
        assert entry["status"] == "done", (tp, pp, entry)
        assert run.tokens == base.tokens, (tp, pp)
        assert run.counters == one.counters, (tp, pp, run.counters, one.counters)


@pytest.mark.install
@pytest.mark.line("v0.32")
def test_pp2_vllm_serve_answers_concurrent_openai_requests_like_one_rank(trained_pair: Path, tmp_path: Path) -> None:
    """``vllm serve`` of the shipped pair at PP 2 (vLLM's multiprocessing executor, gloo between the stages), with and
    without EAGLE-3, answers four greedy completions sent at once by the openai client with the tokens of the target
    alone on one rank."""
    from kimi.e2e.engine import tokenize
    from kimi.models.prompts import code_prompts

    target, drafter = str(trained_pair / "target"), str(trained_pair / "drafter")
    prompt_ids = tokenize(target, code_prompts(4))
    one, _ = parallel.serve_layout(target, prompt_ids, 16, 1, 1, None)
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    for speculative in (None, spec):
        served, entry = parallel.serve_over_http(target, prompt_ids, 16, 1, 2, speculative, tmp_path)
        assert entry["status"] == "done" and entry["failed"] == 0 and entry["requests"] == 4, entry
        assert served.tokens == one.tokens, speculative
    assert entry["counters"]["num_drafts"] > 0 and entry["counters"]["num_accepted_tokens"] > 0


@pytest.mark.install
@pytest.mark.line("mainline")
def test_pp2_eagle3_on_the_torch_cpu_platform_is_lossless(trained_pair: Path) -> None:
    """vLLM 0.34.0 on the torch-only CPU platform: EAGLE-3 (k = 3) at PP 2 gives the greedy tokens of the target alone
    on one rank. vLLM's CPU platform turns async scheduling off, and without it the first stage asserted
    ``num_scheduled_tokens_np >= num_logits`` in its first speculative step; the platform turns it back on here."""
    from kimi.e2e.engine import tokenize
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts

    target, drafter = str(trained_pair / "target"), str(trained_pair / "drafter")
    prompt_ids = tokenize(target, code_prompts(2))
    base, _ = parallel.serve_layout(target, prompt_ids, 12, 1, 1, None, CPU_EAGER)
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    run, entry = parallel.serve_layout(target, prompt_ids, 12, 1, 2, spec, CPU_EAGER)
    assert entry["status"] == "done", entry
    assert run.tokens == base.tokens and run.counters["num_accepted_tokens"] > 0
