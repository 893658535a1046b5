"""The origin line (vLLM 0.16.0) with the fork's three EAGLE-3 fixes (patches 0003-0005), on CPU.

Runs in the origin line's own environment (`python3 -m kimi test --line origin`); elsewhere the
`line("origin")` marker skips it.  vLLM runs in a subprocess per test (distributed state and
environment variables are per process).

* Target support (0003): `EngineArgs.create_engine_config()`, where `vllm serve` refuses or accepts
  a target before any weight loads.
* Image token id (0004): vLLM's own `EagleProposer.load_model` on a stand-in target whose config is
  vLLM's `KimiK25Config`; the drafter and the weight sharing are stand-ins (no weights exist here).
* Aux hidden states (0005): at module level.  MLA attention has no CPU backend in vLLM 0.16.0
  (`platforms/cpu.py`: "MLA is not supported on CPU."), so the reference DeepSeek-V3 target is built
  with `VLLM_MLA_DISABLE=1` and, inside the test only, each decoder layer's `self_attn` is replaced by
  a stand-in (tanh of its input).  Embeddings, norms (vLLM's CPU kernels, in place), the dense MLP,
  the routed MoE with its shared expert, the layer loop and the aux capture are vLLM's, with the
  reference target's weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drafters import kimi_target, toplevel_drafter
from kimi.models.reference import make_reference_models

pytestmark = [pytest.mark.install, pytest.mark.line("origin")]

KIMI_K25_MEDIA_PLACEHOLDER = 163605


def run_script(script: str, *args: str) -> dict:
    """Run ``script`` in a fresh interpreter; its last stdout line is a JSON object."""
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference models (8-layer DeepSeek-V3 target, drafters), made from seed 0."""
    out = tmp_path_factory.mktemp("reference") / "models"
    make_reference_models(out)
    return out


# --- 0003: which targets pass config validation -------------------------------------------------

_ENGINE_CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    target, drafter = sys.argv[1], sys.argv[2]
    args = EngineArgs(model=target, skip_tokenizer_init=True, max_model_len=1024, gpu_memory_utilization=0.25,
                      trust_remote_code=True,
                      speculative_config={"method": "eagle3", "model": drafter, "num_speculative_tokens": 3})
    try:
        config = args.create_engine_config()
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    else:
        print(json.dumps({"method": config.speculative_config.method,
                          "model_type": config.model_config.hf_text_config.model_type,
                          "architecture": config.model_config.architectures[0]}))
""")

# How Kimi-K2 checkpoints ship their config: model_type kimi_k2 with a remote-code config class
# (DeepSeek-V3's fields), loaded with trust_remote_code.
_KIMI_K2_CONFIG_CLASS = textwrap.dedent("""
    from transformers import DeepseekV3Config


    class KimiK2Config(DeepseekV3Config):
        model_type = "kimi_k2"
""")


def kimi_k2_target(path: Path) -> Path:
    kimi_target(path)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_kimi_k2.KimiK2Config"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "configuration_kimi_k2.py").write_text(_KIMI_K2_CONFIG_CLASS)
    return path


def test_kimi_targets_pass_eagle3_config_validation(tmp_path: Path, reference: Path) -> None:
    drafter = toplevel_drafter(tmp_path / "drafter")
    k2 = run_script(_ENGINE_CONFIG, kimi_k2_target(tmp_path / "kimi-k2"), drafter)
    assert k2 == {"method": "eagle3", "model_type": "kimi_k2", "architecture": "DeepseekV3ForCausalLM"}
    k25 = run_script(_ENGINE_CONFIG, kimi_target(tmp_path / "kimi-k25", wrapper=True), drafter)
    assert k25 == {"method": "eagle3", "model_type": "kimi_k2", "architecture": "KimiK25ForConditionalGeneration"}
    v3 = run_script(_ENGINE_CONFIG, reference / "target", reference / "drafter-llama")
    assert v3 == {"method": "eagle3", "model_type": "deepseek_v3", "architecture": "DeepseekV3ForCausalLM"}


def test_unsupported_target_fails_naming_the_model_class(tmp_path: Path, reference: Path) -> None:
    """Qwen2-MoE's class has no aux outputs in 0.16.0; upstream's model_type list ("qwen") let it through
    to fail after loading ("Model does not support EAGLE3 interface")."""
    target = tmp_path / "qwen2-moe"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 256,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
        "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "num_experts": 4,
        "num_experts_per_tok": 2, "vocab_size": 4096, "max_position_embeddings": 4096}))
    error = run_script(_ENGINE_CONFIG, target, reference / "drafter-llama")["error"]
    assert "target model class Qwen2MoeForCausalLM (architecture Qwen2MoeForCausalLM, model_type qwen2_moe)" in error
    assert "does not implement vLLM's SupportsEagle3 interface" in error


# --- 0004: the image token id of a multimodal target --------------------------------------------

_LOAD_MODEL = textwrap.dedent("""
    import json, sys, types
    import torch
    import vllm.v1.spec_decode.eagle as eagle
    from transformers import PretrainedConfig
    from vllm.model_executor.models.interfaces import SupportsMultiModal
    from vllm.transformers_utils.configs import KimiK25Config

    # vLLM's load_model with stand-ins for what needs loaded weights: no attention layers are
    # registered, the drafter is a bare module with a config, and nothing is shared with the target.
    eagle.get_layers_from_vllm_config = lambda *args, **kwargs: {}

    class Language(torch.nn.Module):
        def embed_input_ids(self, input_ids):
            return input_ids

    class Target(torch.nn.Module, SupportsMultiModal):
        def __init__(self, config):
            super().__init__()
            self.config, self.language_model = config, Language()

    config = KimiK25Config(text_config={"vocab_size": 163840}) if sys.argv[1] == "kimi_k25" else PretrainedConfig()
    target = type(sys.argv[2], (Target,), {})(config)
    proposer = object.__new__(eagle.EagleProposer)
    drafter = torch.nn.Module()
    drafter.config = types.SimpleNamespace()
    proposer._get_model = lambda: drafter
    proposer._maybe_share_embeddings = proposer._maybe_share_lm_head = lambda model: None
    proposer.vllm_config, proposer.supports_mm_inputs, proposer.parallel_drafting = None, False, False
    try:
        proposer.load_model(target)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    else:
        print(json.dumps({"image_token_index": drafter.config.image_token_index}))
""")


def test_kimi_k25_image_token_id() -> None:
    """Upstream 0.16.0: AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'."""
    result = run_script(_LOAD_MODEL, "kimi_k25", "KimiK25ForConditionalGeneration")
    assert result == {"image_token_index": KIMI_K25_MEDIA_PLACEHOLDER}


def test_image_token_id_names_and_places() -> None:
    from kimi.origin.targets import image_token_id

    ns = type("Config", (), {})
    for config, expected in [
        ({"image_token_index": 32000}, 32000),                           # LLaVA
        ({"image_token_id": 151655}, 151655),                            # Qwen2.5-VL
        ({"vision_config": {"image_token_id": 10}}, 10),                 # Pixtral
        ({"media_placeholder_token_id": 163605, "text_config": {}}, 163605),  # Kimi-K2.5
        ({"text_config": {"image_token_id": 7}}, 7),
        ({"image_token_index": None, "vision_config": {"image_token_index": 5}}, 5),
    ]:
        obj = ns()
        for key, value in config.items():
            setattr(obj, key, value)
        assert image_token_id(config) == expected and image_token_id(obj) == expected


def test_multimodal_target_without_image_token_id_fails() -> None:
    error = run_script(_LOAD_MODEL, "none", "SomeVLForConditionalGeneration")["error"]
    assert error.startswith("Eagle3TargetError: EAGLE-3 with the multimodal target SomeVLForConditionalGeneration: "
                            "its config names no image token id (looked at config.image_token_index, ")
    assert "config.media_placeholder_token_id" in error


# --- 0005: aux hidden states of DeepSeek-V3 and Kimi-K2.5 ---------------------------------------

_AUX = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_MLA_DISABLE"] = "1"  # build attention modules without MLA: no CPU backend for it in 0.16.0
    from pathlib import Path
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.interfaces import supports_eagle3

    kind, folder, port, weights_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    id_sets, bad_sets = json.loads(sys.argv[5]), json.loads(sys.argv[6])
    config = EngineArgs(model=str(folder), skip_tokenizer_init=True, max_model_len=256, enforce_eager=True,
                        dtype="float32", gpu_memory_utilization=0.25).create_engine_config()


    class AttentionStandIn(torch.nn.Module):
        def forward(self, positions, hidden_states, **kwargs):
            return torch.tanh(hidden_states)


    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        ensure_model_parallel_initialized(1, 1)
        if kind == "deepseek_v3":
            from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM as cls
        else:
            from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration as cls
        model = cls(vllm_config=config)
        language = model if kind == "deepseek_v3" else model.language_model
        weights = load_file(weights_dir / "model.safetensors")
        language.load_weights((k, v) for k, v in weights.items() if ".self_attn." not in k)
        layers = language.model.layers
        for layer in layers:
            layer.self_attn = AttentionStandIn()
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))

        # The stream entering each layer, read independently of the fork's capture.
        entering = {}
        def hook(index):
            def pre(module, args):
                hidden, residual = args[1], args[2]
                entering[index] = (hidden if residual is None else hidden + residual).clone()
            return pre
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(hook(index))

        ids = torch.arange(10, 30)
        positions = torch.arange(ids.numel())
        report = {"supports_eagle3": supports_eagle3(model),
                  "defaults": list(model.get_eagle3_aux_hidden_state_layers())}

        def forward():  # one forward context per pass (0.18's MoE runner counts its layers' calls in it)
            with set_forward_context(None, config), torch.no_grad():
                return model(input_ids=ids, positions=positions)

        plain = forward()
        report["plain_is_tensor"] = isinstance(plain, torch.Tensor)
        for ids_set in map(tuple, id_sets):
            try:
                model.set_aux_hidden_state_layers(ids_set)
                hidden, aux = forward()
            except Exception as exc:  # reported, so that the test names it
                report[str(ids_set)] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            report[str(ids_set)] = {
                "shapes": [list(a.shape) for a in aux],
                "max_abs_diff": [float((a - entering[i]).abs().max()) for a, i in zip(aux, ids_set)],
                "distinct": float(min((aux[0] - aux[1]).abs().max(), (aux[1] - aux[2]).abs().max())),
                "final_vs_plain": float((hidden - plain).abs().max()),
            }
        report["errors"] = []
        for bad in map(tuple, bad_sets):
            try:
                model.set_aux_hidden_state_layers(bad)
            except ValueError as exc:
                report["errors"].append(str(exc))
    print(json.dumps(report))
""")


def aux_report(kind: str, folder: Path, port: int, weights: Path, id_sets: list, bad_sets: list = ()) -> dict:
    return run_script(_AUX, kind, folder, port, weights, json.dumps(id_sets), json.dumps(list(bad_sets)))


def check_states(report: dict, ids: str, hidden: int) -> None:
    """Three ``[num_tokens, hidden]`` states, exactly the streams entering the requested layers."""
    got = report[ids]
    assert "error" not in got, got
    assert got["shapes"] == [[20, hidden]] * 3, ids
    assert max(got["max_abs_diff"]) == 0.0, ids
    assert got["distinct"] > 0.0 and got["final_vs_plain"] == 0.0, ids  # capturing leaves the output alone


def test_deepseek_v3_module_returns_three_aux_states(reference: Path) -> None:
    """Upstream 0.16.0: DeepseekV3ForCausalLM has no set_aux_hidden_state_layers (AttributeError) and
    vLLM's runner stops with "Model does not support EAGLE3 interface"."""
    report = aux_report("deepseek_v3", reference / "target", 29531, reference / "target", [[2, 4, 6]])
    assert report["supports_eagle3"] is True and report["plain_is_tensor"] is True
    assert report["defaults"] == [2, 4, 5]  # vLLM's (2, L // 2, L - 3) for the 8-layer target
    check_states(report, "(2, 4, 6)", hidden=256)


def test_aux_states_from_layer_zero_and_checked_ids(reference: Path) -> None:
    """Fork-only: id 0 is the embeddings (upstream 0.18.0 adds None to a tensor there), and ids that
    would give fewer states than the drafter takes are refused when they are set."""
    report = aux_report("deepseek_v3", reference / "target", 29533, reference / "target", [[0, 3, 7]],
                        [[2, 2, 5], [2, 4, 8]])
    check_states(report, "(0, 3, 7)", hidden=256)
    assert report["errors"] == [
        "EAGLE-3 aux layer ids [2, 2, 5] repeat a layer; each id gives one state",
        "EAGLE-3 aux layer ids [2, 4, 8]: [8] are not layers of this 8-layer target (valid: 0..7)"]


def test_kimi_k25_delegates_to_its_language_model(tmp_path: Path, reference: Path) -> None:
    """A Kimi-K2.5 wrapper (tiny vision tower) around the reference target's language model.
    Upstream 0.16.0: no get_eagle3_aux_hidden_state_layers on KimiK25ForConditionalGeneration."""
    text = json.loads((reference / "target" / "config.json").read_text())
    text["model_type"] = "kimi_k2"
    folder = tmp_path / "kimi-k25"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
        "media_placeholder_token_id": 4000,
        "vision_config": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "intermediate_size": 128, "patch_size": 14, "init_pos_emb_height": 8,
                          "init_pos_emb_width": 8}}))
    report = aux_report("kimi_k25", folder, 29532, reference / "target", [[2, 4, 6]])
    assert report["supports_eagle3"] is True and report["plain_is_tensor"] is True
    assert report["defaults"] == [2, 4, 5]
    check_states(report, "(2, 4, 6)", hidden=256)
