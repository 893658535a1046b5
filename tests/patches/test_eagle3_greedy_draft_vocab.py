"""Patch 0009: greedy EAGLE-3 drafts from the draft vocabulary give upstream's ids, for both drafter styles.

One subprocess loads the reference target with each reference drafter on CPU (vLLM in-process) and compares
the proposer's greedy hook with upstream's ``compute_logits(...).argmax(-1)`` (the full-vocabulary scatter)
on random hidden states (``KIMI_DRAFT_GREEDY=auto``), then loads once more with the default, where the hook
is on. Without the patch the proposer has no ``draft_greedy`` attribute. A third drafter has no ``lm_head`` in
its checkpoint (served with the fork's start-up check off: the fork refuses it): the proposer then puts the
target's head on it after loading (``_maybe_share_lm_head``), and a hook that kept the drafter's first head
gave other ids than upstream's on every row (seen on the H200 with the Kimi slice's dummy weights: 58368 of
58368 draft rows).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_script import make_reference_models, run_engine_script

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.install


_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    import kimi.hooks.eagle3_drafter_checks as checks
    from vllm import LLM
    models, out, fork_check = sys.argv[1], {}, checks.prepare_eagle3_drafter
    def proposer(style):
        # The fork refuses a drafter without lm_head over a smaller draft vocabulary (lm-head-absent in
        # docs/drafter-assumptions.md); its start-up check is off for that one, as vLLM would serve it.
        checks.prepare_eagle3_drafter = (lambda spec_config: None) if style == "llama-nohead" else fork_check
        llm = LLM(model=models + "/target", dtype="float32", max_model_len=256, enforce_eager=True,
                  kv_cache_memory_bytes=128 << 20, speculative_config={
                      "method": "eagle3", "model": f"{models}/drafter-{style}", "num_speculative_tokens": 2})
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        # the V2 runner (vLLM 0.34.0) keeps its EAGLE-3 drafter as `speculator`, the V1 runner (0.32.0) as `drafter`
        return llm, getattr(runner, "speculator", None) or runner.drafter
    for style in ("llama", "mla", "llama-nohead"):
        llm, prop = proposer(style)
        hidden = torch.randn(97, 256, generator=torch.Generator().manual_seed(0))
        hook = prop.draft_greedy is not None
        same = hook and torch.equal(prop.draft_greedy(hidden), prop.model.compute_logits(hidden).argmax(-1))
        out[style] = {"hook": hook, "same_ids": bool(same)}
        llm.llm_engine.engine_core.shutdown()
        del llm, prop
    del os.environ["KIMI_DRAFT_GREEDY"]
    llm, prop = proposer("llama")
    out["default_hook"] = prop.draft_greedy is not None
    print("RESULT " + json.dumps(out))
""")


def _without_lm_head(drafter: Path, dest: Path) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, dest)
    weights = load_file(dest / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, dest / "model.safetensors")


def test_greedy_drafts_equal_upstream_ids(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    _without_lm_head(models / "drafter-llama", models / "drafter-llama-nohead")
    out = run_engine_script(_SCRIPT, str(models), env={"KIMI_DRAFT_GREEDY": "auto"})
    assert out["llama"] == out["mla"] == out["llama-nohead"] == {"hook": True, "same_ids": True}
    assert out["default_hook"] is True  # on by default: see kimi/spec/draft_greedy.py


def test_unknown_mode_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi.hooks.eagle3_greedy_draft_vocab import draft_greedy

    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "fast")
    with pytest.raises(ValueError, match="expected one of auto, torch, upstream"):
        draft_greedy(object())


class _Drafter(torch.nn.Module):
    """An EAGLE-3 drafter's head as vLLM's V2 speculator sees it: ``lm_head`` [draft_vocab, hidden],
    ``logits_processor``, ``draft_id_to_target_id`` and upstream's ``compute_logits`` (draft logits scattered
    into a [T, target_vocab] tensor of -inf, as ``llama_eagle3.py`` does)."""

    def __init__(self, hidden: int = 16, draft_vocab: int = 40, target_vocab: int = 300) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.lm_head = torch.nn.Linear(hidden, draft_vocab, bias=False)
        self.lm_head.weight.data = torch.randn(draft_vocab, hidden, generator=gen)
        offsets = torch.sort(torch.randperm(target_vocab, generator=gen)[:draft_vocab]).values
        self.draft_id_to_target_id = offsets - torch.arange(draft_vocab)
        self.target_vocab = target_vocab

    def logits_processor(self, head: torch.nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
        return head(hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.logits_processor(self.lm_head, hidden_states)
        full = logits.new_full((logits.shape[0], self.target_vocab), float("-inf"))
        targets = torch.arange(logits.shape[1]) + self.draft_id_to_target_id
        full[:, targets] = logits
        return full


def _v2_speculator(monkeypatch: pytest.MonkeyPatch, drafter: torch.nn.Module):
    """vLLM's V2 EAGLE speculator with ``load_model`` run on ``drafter`` (no engine: the drafter loader and the
    layer lookup are replaced, one TP rank)."""
    import vllm.distributed
    from vllm.v1.worker.gpu.spec_decode import speculator as module
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    monkeypatch.setattr(module, "get_layers_from_vllm_config", lambda *args: {})
    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(EagleSpeculator, "load_draft_model", lambda self, target, names: drafter)
    speculator = object.__new__(EagleSpeculator)
    speculator.use_local_argmax_reduction = False
    # what 0.32.0's and 0.34.0's load_model read around the hook (the multimodal check, adaptive verification,
    # 0.34.0's draft logits cache)
    speculator.vllm_config = SimpleNamespace(model_config=SimpleNamespace(supports_multimodal_inputs=False))
    speculator.use_acceptance_estimator, speculator.acceptance_estimator = False, None
    speculator.use_draft_logits = False
    speculator.load_model(torch.nn.Module())
    return speculator


def _greedy_draft(speculator, hidden: torch.Tensor) -> torch.Tensor:
    """The V2 speculator's greedy draft step: ``sample_draft`` with no draft logits kept (0.32.0), or
    ``_greedy_sample_draft`` (0.26.0)."""
    if hasattr(speculator, "_greedy_sample_draft"):
        return speculator._greedy_sample_draft(hidden)
    return speculator.sample_draft(hidden, None, None, None, None, None, draft_logits=None)


def test_v2_runner_speculator_takes_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """The V2 runner's greedy draft step (``sample_draft``, captured in its CUDA graphs) uses the hook and
    gives upstream's ids; without the patch ``load_model`` sets no ``draft_greedy`` and the scatter runs."""
    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "torch")
    drafter = _Drafter()
    speculator = _v2_speculator(monkeypatch, drafter)
    assert speculator.draft_greedy is not None
    calls = []
    monkeypatch.setattr(drafter, "compute_logits", lambda h: calls.append(h) or _Drafter.compute_logits(drafter, h))
    hidden = torch.randn(33, 16, generator=torch.Generator().manual_seed(2))
    ids = _greedy_draft(speculator, hidden)
    assert calls == []  # no [T, target_vocab] logits
    assert torch.equal(ids, _Drafter.compute_logits(drafter, hidden).argmax(-1))


def test_v2_runner_refuses_check_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check`` counts rows on the host at each call; inside V2's captured drafting loop it would count once."""
    import vllm.envs

    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "check")
    # the fix names the V1 runner: its switch up to vLLM 0.32, the v0.32 line since 0.34.0 removed it
    fix = ("VLLM_USE_V2_MODEL_RUNNER=0" if "VLLM_USE_V2_MODEL_RUNNER" in vllm.envs.environment_variables
           else "no V1 model runner .* v0.32 line")
    with pytest.raises(ValueError, match=fix):
        _v2_speculator(monkeypatch, _Drafter())
    same_vocab = _Drafter()
    same_vocab.draft_id_to_target_id = None  # the hook does not apply: nothing to check, nothing refused
    assert _v2_speculator(monkeypatch, same_vocab).draft_greedy is None


def test_v2_runner_adaptive_verification_reads_its_confidences_from_the_draft_vocabulary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under adaptive verification (an acceptance estimator), the greedy draft step takes the hook too: upstream's
    ids and the estimator's confidences equal to those upstream computes from the ``[T, target_vocab]`` scatter,
    which is never made (without the change the estimator forced upstream's path)."""
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator

    if not HAS_TRITON:  # the v0.32 line: the compiled CPU wheel, Triton without a CPU backend, no torch overrides
        pytest.skip("the acceptance estimator's kernels need Triton (on CPU: the mainline's interpreter and overrides)")

    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "torch")
    drafter, rows, k = _Drafter(), 6, 3
    speculator = _v2_speculator(monkeypatch, drafter)
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(rows, 16, generator=gen)
    idx_mapping = torch.tensor([4, 0, 2, 5, 1, 3], dtype=torch.int32)
    step = torch.tensor(1)
    speculator.temperature = torch.tensor([0.0, 0.7, 0.0, 1.3, 0.0, 0.9])

    def draft(greedy) -> tuple[torch.Tensor, torch.Tensor]:
        speculator.draft_greedy = greedy
        speculator.acceptance_estimator = OnlineAcceptanceEstimator(8, k, torch.device("cpu"))
        speculator.acceptance_estimator.slope.fill_(0.8)
        speculator.draft_token_confidence_probs = torch.zeros(rows, k)
        ids = speculator.sample_draft(hidden, None, idx_mapping, speculator.temperature, None, step,
                                      draft_logits=None)
        return ids, speculator.draft_token_confidence_probs.clone()

    calls = []
    monkeypatch.setattr(drafter, "compute_logits", lambda h: calls.append(h) or _Drafter.compute_logits(drafter, h))
    ids, confidences = draft(speculator.draft_greedy)
    assert calls == [], "the hook made the target-vocabulary logits"
    want_ids, want_confidences = draft(None)  # upstream's path: compute_logits, argmax, the estimator on it
    assert len(calls) == 1
    assert torch.equal(ids, want_ids)
    assert confidences[:, 1].gt(0).all() and confidences[:, [0, 2]].eq(0).all()
    torch.testing.assert_close(confidences, want_confidences, rtol=1e-5, atol=1e-6)
