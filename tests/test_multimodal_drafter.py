"""Issue 18: at image positions an EAGLE-3 drafter reads the target's image embeddings, not the placeholder's.

Kimi-K2.5's reference wrapper (``kimi models make``: random vision tower, placeholder id 2) with each drafter
style on vLLM's CPU engine (the V1 model runner: no Triton CPU backend here), image requests one at a time.
The rows each drafter's first decoder layer actually received are read inside the engine and compared with
the rows the target's first decoder layer received one position later (``kimi.e2e.draft_inputs``):

* with the fork (patch 0017, ``kimi.hooks.eagle3_drafter_image_embeddings``) every image row the drafter read
  is the target's, for a whole prefill, prefix-cache hits ending inside and after the image, a chunked prefill
  splitting the image and a chunk ending right before it;
* with ``KIMI_DRAFT_IMAGE_EMBEDS=upstream`` (vLLM 0.32.0 as released) the same comparison finds the
  placeholder's embedding at the image positions, so it fails there, and the start-up WARNING names the drafter.

Each engine is a subprocess of about 20 s on 2 cores.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from conftest import installed_line
from engine_script import make_reference_models, run_engine_script

pytestmark = [pytest.mark.install, pytest.mark.long_file]

_CHECK = """
import json, sys
from kimi_lab.bench.multimodal import drafter_inputs
from kimi.spec import drafter_images as hook
warnings, made = [], hook._logger
class Keep:  # vLLM's logging set-up replaces handlers added to its loggers: keep the hook's warnings here
    def __init__(self, log):
        self.log = log
    def info(self, *args):
        self.log.info(*args)
    def warning(self, msg, *args):
        warnings.append(msg % args)
        self.log.warning(msg, *args)
hook._logger = lambda: Keep(made())
result = drafter_inputs(sys.argv[1], sys.argv[2], chunked=sys.argv[3] == "1")
print("RESULT " + json.dumps({**result, "warnings": warnings}))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_reference_models(tmp_path_factory.mktemp("mm") / "reference")


def _check(models: Path, style: str, chunked: bool, mode: str = "auto") -> dict:
    return run_engine_script(_CHECK, str(models / "kimi-k25"), str(models / f"drafter-{style}"),
                             "1" if chunked else "0", env={"KIMI_DRAFT_IMAGE_EMBEDS": mode}, timeout=900)


@pytest.mark.parametrize("chunked", [False, True], ids=["prefill-and-prefix-cache", "chunked-prefill"])
@pytest.mark.parametrize("style", ["llama", "mla"])
def test_drafter_reads_the_target_image_embeddings(models: Path, style: str, chunked: bool) -> None:
    from kimi_lab.bench.multimodal import sees_target_embeddings

    got = _check(models, style, chunked)
    scenarios = got["scenarios"]
    assert got["engine"]["model_runner"] == ("v1" if installed_line() in ("v0.26", "v0.32") else "v2")
    assert got["warnings"] == []
    for name, s in scenarios.items():
        assert s["image_tokens"] == 64 and s["image_target_is_placeholder"] == 0, (name, s)
        assert s["image_equal"] == s["image_positions"] and s["image_placeholder"] == 0, (name, s)
        assert s["text_equal"] == s["text_positions"] > 0, (name, s)
    if chunked:
        assert scenarios["chunked"]["image_positions"] == scenarios["chunk_ends_before_image"]["image_positions"] == 64
    else:
        assert scenarios["prefill"]["image_positions"] == scenarios["prefill_long"]["image_positions"] == 64
        inside, after = scenarios["prefix_hit_inside"], scenarios["prefix_hit_after"]
        assert 0 < inside["image_positions"] < 64 and inside["image_not_read"] == 64 - inside["image_positions"]
        assert after["image_positions"] == 0 and after["image_not_read"] == 64  # the hit covers the image
    assert sees_target_embeddings([got])


@pytest.mark.parametrize("style", ["llama", "mla"])
def test_upstream_drafter_reads_the_placeholder_and_says_so(models: Path, style: str) -> None:
    """The same comparison fails without the hook: the drafter reads the placeholder's row at image positions."""
    from kimi_lab.bench.multimodal import sees_target_embeddings

    got = _check(models, style, chunked=False, mode="upstream")
    prefill = got["scenarios"]["prefill"]
    assert prefill["image_positions"] == 64 and prefill["image_equal"] == 0
    assert prefill["image_placeholder"] >= 60 and prefill["max_image_diff"] > 0.1
    assert prefill["text_equal"] == prefill["text_positions"] > 0  # text rows are right either way
    assert not sees_target_embeddings([got])
    drafter = {"llama": "Eagle3LlamaForCausalLM", "mla": "Eagle3DeepseekV2ForCausalLM"}[style]
    warnings = [w for w in got["warnings"] if w.startswith("DRAFTER WITHOUT IMAGE INPUTS")]
    assert warnings, f"no start-up warning names the drafter; the engine's warnings: {got['warnings']}"
    warning = warnings[0]
    assert drafter in warning and f"drafter-{style}" in warning
    assert "placeholder token 2 (media_placeholder_token_id)" in warning and "acceptance on image prompts drops" \
        in warning


_UNPADDED = """
import json, sys
from transformers import AutoTokenizer
from vllm import LLM
from kimi_lab.bench import multimodal as mm
from kimi.e2e.engine import close_engine
target, drafter = sys.argv[1], sys.argv[2]
texts = mm.prompts(AutoTokenizer.from_pretrained(target))
# a short text request decodes (drafts rejected: random drafter) while the image prefills in 32-token chunks
requests = [{"prompt": "def f(x):\\n"}, mm.image_request(texts["long"], ("red",))]
out = {}
for name, spec in (("base", None), ("eagle3", {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3,
                                               "disable_padded_drafter_batch": True})):
    llm = LLM(model=target, speculative_config=spec, **mm.CHUNKED)
    try:
        out[name] = mm._greedy(llm, requests, margins=False)["tokens"]
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"[:300]
    close_engine(llm)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.line("v0.32", "v0.26")  # disable_padded_drafter_batch is Model Runner V1's; 0.34.0 has neither
def test_unpadded_drafter_batch_mixing_decodes_and_an_image_prefill(models: Path) -> None:
    """``disable_padded_drafter_batch``: the drafter gets the kept rows only, and the image mask (one row per
    scheduled token) is cut to them; uncut it crashed the first step where a decode dropped a rejected draft
    beside an image chunk ("The shape of the mask [32] ... does not match ... [29, 256]")."""
    got = run_engine_script(_UNPADDED, str(models / "kimi-k25"), str(models / "drafter-llama"), timeout=900)
    assert isinstance(got["eagle3"], list), got["eagle3"]
    assert got["eagle3"] == got["base"]


# --- the hook's decision, without an engine ------------------------------------------------------------------

def _config(multimodal: bool = True, target_width: int = 256, draft_width: int = 256):
    draft = types.SimpleNamespace(model="/models/drafter", get_inputs_embeds_size=lambda: draft_width)
    model = types.SimpleNamespace(supports_multimodal_inputs=multimodal, get_inputs_embeds_size=lambda: target_width,
                                  hf_config=types.SimpleNamespace(media_placeholder_token_id=163605))
    return types.SimpleNamespace(model_config=model, speculative_config=types.SimpleNamespace(
        draft_model_config=draft))


def _drafter(name: str):
    import torch

    cls = type(name, (torch.nn.Module,), {})
    drafter = cls()
    drafter.model = torch.nn.Module()
    drafter.model.embed_input_ids = lambda ids: torch.zeros(len(ids), 4)
    return drafter


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    from kimi.spec import drafter_images as hook

    seen: list[tuple[str, str]] = []
    log = types.SimpleNamespace(info=lambda msg, *a: seen.append(("info", msg % a)),
                                warning=lambda msg, *a: seen.append(("warning", msg % a)))
    monkeypatch.setattr(hook, "_logger", lambda: log)
    return seen


def test_hook_feeds_an_eagle3_drafter_and_merges_image_rows(logged: list) -> None:
    import torch

    from kimi.hooks.eagle3_drafter_image_embeddings import take_target_embeddings

    drafter = _drafter("Eagle3LlamaForCausalLM")
    assert take_target_embeddings(drafter, _config()) is True and drafter.supports_multimodal_embeddings
    rows = drafter.embed_input_ids(torch.tensor([5, 2, 2, 7]), multimodal_embeddings=[torch.ones(2, 4)],
                                   is_multimodal=torch.tensor([False, True, True, False]))
    assert rows.sum(dim=1).tolist() == [0.0, 4.0, 4.0, 0.0]
    assert drafter.embed_input_ids(torch.tensor([5])).shape == (1, 4)
    said = "Drafter Eagle3LlamaForCausalLM (/models/drafter) reads the target's image embeddings at image positions."
    assert logged == [("info", said)]


@pytest.mark.parametrize("name, widths, because", [
    ("Eagle3LlamaForCausalLM", (256, 512), "its input rows are 512 wide and the target's image embeddings 256"),
    ("EagleMedusaDraft", (256, 256), "EagleMedusaDraft is not one of the EAGLE-3 drafters"),
])
def test_hook_warns_loudly_for_a_drafter_it_cannot_feed(logged: list, name: str, widths: tuple, because: str) -> None:
    from kimi.hooks.eagle3_drafter_image_embeddings import take_target_embeddings

    drafter = _drafter(name)
    assert take_target_embeddings(drafter, _config(target_width=widths[0], draft_width=widths[1])) is False
    assert not hasattr(drafter, "supports_multimodal_embeddings") and "embed_input_ids" not in vars(drafter)
    [(level, message)] = logged
    assert level == "warning" and message.startswith(f"DRAFTER WITHOUT IMAGE INPUTS: the drafter {name} "
                                                     "(/models/drafter)")
    assert because in message and "placeholder token 163605 (media_placeholder_token_id)" in message
    assert "acceptance on image prompts drops" in message


def test_hook_leaves_text_targets_and_able_drafters_alone(logged: list, monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi.hooks.eagle3_drafter_image_embeddings import take_target_embeddings

    drafter = _drafter("Eagle3LlamaForCausalLM")
    assert take_target_embeddings(drafter, _config(multimodal=False)) is False and logged == []
    able = _drafter("EagleLlama4ForCausalLM")
    able.supports_multimodal_embeddings = True
    assert take_target_embeddings(able, _config()) is True and logged == []
    monkeypatch.setenv("KIMI_DRAFT_IMAGE_EMBEDS", "sometimes")
    with pytest.raises(ValueError, match="expected one of auto, upstream"):
        take_target_embeddings(drafter, _config())


def test_hook_takes_the_callers_reading_and_a_config_of_only_the_target(logged: list) -> None:
    """The V2 speculator reads the target's ``supports_multimodal_inputs`` once and hands it over (upstream's
    tests/v1/worker/test_gpu_target_dependent_ar_speculator.py counts the reads); upstream's tests also build the
    speculator over a config holding only ``model_config``: the hook still decides and warns."""
    from kimi.hooks.eagle3_drafter_image_embeddings import take_target_embeddings

    reads = []

    class Target:
        @property
        def supports_multimodal_inputs(self) -> bool:
            reads.append(self)
            return True

    partial = types.SimpleNamespace(model_config=Target())
    assert take_target_embeddings(_drafter("TextOnlyDrafter"), partial, target_supports_mm=True) is False
    assert reads == []
    [(level, message)] = logged
    assert level == "warning" and "the drafter TextOnlyDrafter (?)" in message and "(unknown id)" in message
    assert take_target_embeddings(_drafter("TextOnlyDrafter"), partial, target_supports_mm=False) is False
    assert reads == [] and len(logged) == 1
    assert take_target_embeddings(_drafter("TextOnlyDrafter"), partial) is False and len(reads) == 1


def test_the_results_say_what_was_run() -> None:
    """benchmarks/results/multimodal.json, when recorded, carries what issue 18 asks a result to show."""
    path = Path(__file__).resolve().parents[1] / "benchmarks/results/multimodal.json"
    if not path.is_file():
        pytest.skip("benchmarks/results/multimodal.json not recorded yet: run benchmarks/multimodal.py")
    result = json.loads(path.read_text())
    assert {"device", "vllm", "drafter_sees_target_embeddings", "lossless", "drafter_inputs"} <= set(result)
    for styles in result["lossless"].values():
        for r in styles.values():
            assert {"requests", "identical", "total", "crashes"} <= set(r)
