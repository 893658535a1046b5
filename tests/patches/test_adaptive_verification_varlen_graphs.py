"""Patch 0028: with adaptive verification and full CUDA graphs, the attention selector refuses a backend whose
graphs cannot replay varlen decode batches, when the target's attention layers are built (before its weights load).

Upstream 0.34.0 picks FLASH_ATTN_MLA for a DeepSeek-V3 target on an H100, loads the weights, sizes the KV cache
and only then refuses in ``maybe_create_adaptive_verification_manager`` ("... FlashAttnMLABackend allows none",
benchmarks/results/logs/adaptive-gpu-0.34.0-2026-12-06/pair-adaptive.log). The selector now treats it as an
invalid reason, decided from the builder class where that class's answer cannot depend on the KV cache spec, and
must agree with what ``get_varlen_cudagraph_unsupported_backend`` decides later for the same builder. Tested here
on the builder classes that import on CPU (FLASHMLA, TRITON_MLA, TOKENSPEED_MLA, FLASH_ATTN, TRITON_ATTN), on
small builders derived from TRITON_MLA's, on the selector's inputs, and, in a child with FlashAttention's and
FlashInfer's kernels stubbed, on CUDA's selection for an H100 (capability 9.0) and a B200 (10.0).
"""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from conftest import installed_line
from engine_script import run_engine_script

pytestmark = pytest.mark.line("mainline")

if installed_line() == "mainline":
    import torch
    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
    from vllm.v1.worker.gpu.attn_utils import get_varlen_cudagraph_unsupported_backend

QUERY_LEN = 4  # num_speculative_tokens 3, plus the bonus token
REASON = "FULL cudagraphs cannot replay the varlen decode batches"


def _reasons(backend: type, query_len: int | None, *, use_mla: bool = True) -> list[str]:
    return backend.validate_configuration(
        head_size=576 if use_mla else 128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
        use_mla=use_mla, has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder", use_adaptive_verification=True,
        adaptive_verification_cudagraph_query_len=query_len)


def _late_check(backend: type) -> tuple[str, int | None] | None:
    """What the runner decides once the KV cache spec is known (one group of the backend's builder)."""
    spec = (MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
            if backend.is_mla() else
            FullAttentionSpec(block_size=64, num_kv_heads=8, head_size=128, dtype=torch.bfloat16))
    builder = backend.get_builder_cls()  # the methods asked are classmethods
    group = SimpleNamespace(layer_names=["layer.0"], kv_cache_spec=spec, backend=backend,
                            get_metadata_builder=lambda _ubatch: builder)
    return get_varlen_cudagraph_unsupported_backend([[group]], SimpleNamespace(), QUERY_LEN)


@pytest.mark.parametrize("name", ["FLASHMLA", "TRITON_MLA", "TOKENSPEED_MLA"])
def test_uniform_batch_mla_backends_are_refused_and_agree(name: str) -> None:
    backend = AttentionBackendEnum[name].get_class()
    assert backend.get_builder_cls()._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH
    reasons = [r for r in _reasons(backend, QUERY_LEN) if r.startswith(REASON)]
    assert len(reasons) == 1, reasons
    assert "up to 4 tokens per request" in reasons[0]
    assert "--attention-backend FLASHINFER_MLA" in reasons[0]
    assert "enable_adaptive_verification=false" in reasons[0]
    assert _late_check(backend) == (backend.__name__, None)


@pytest.mark.parametrize("name", ["FLASHMLA", "TRITON_MLA"])
def test_no_reason_without_full_graphs_or_adaptive_verification(name: str) -> None:
    """The selector passes None when adaptive verification is off, the graphs are not full (the CPU platform's
    eager engine), or the layers are a drafter's: nothing changes."""
    backend = AttentionBackendEnum[name].get_class()
    assert not any(r.startswith(REASON) for r in _reasons(backend, None))


@pytest.mark.parametrize("name", ["FLASH_ATTN", "TRITON_ATTN"])
def test_backends_left_to_the_runner(name: str) -> None:
    """TRITON_ATTN reports ALWAYS (replays any batch); FLASH_ATTN overrides get_cudagraph_support, so its answer
    is left to the runner's check, which has the KV cache spec."""
    backend = AttentionBackendEnum[name].get_class()
    assert not backend.cannot_replay_varlen_decode_cudagraphs()
    assert not any(r.startswith(REASON) for r in _reasons(backend, QUERY_LEN, use_mla=False))


def _derived_backends() -> dict[str, tuple[type, bool | None]]:
    """Backends on builders derived from TRITON_MLA's -> (class, what the runner decides: refused or not, or None
    where the class-level check leaves it to the runner)."""
    base_backend = AttentionBackendEnum["TRITON_MLA"].get_class()
    base_builder = base_backend.get_builder_cls()

    def backend_on(builder: type) -> type:
        return type(f"{builder.__name__}Backend", (base_backend,),
                    {"get_builder_cls": staticmethod(lambda: builder)})

    def builder(name: str, support: AttentionCGSupport, **methods) -> type:
        return type(name, (base_builder,), {"_cudagraph_support": support, **methods})

    def bound_4(cls, vllm_config, kv_cache_spec):
        return 4

    def spec_dependent(cls, vllm_config, kv_cache_spec):
        return AttentionCGSupport.ALWAYS if kv_cache_spec.block_size == 64 else AttentionCGSupport.UNIFORM_BATCH

    return {
        "always": (backend_on(builder("Always", AttentionCGSupport.ALWAYS)), False),
        "never": (backend_on(builder("Never", AttentionCGSupport.NEVER)), True),
        "single": (backend_on(builder("Single", AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)), True),
        "uniform": (backend_on(builder("Uniform", AttentionCGSupport.UNIFORM_BATCH)), True),
        "bounded": (backend_on(builder("Bounded", AttentionCGSupport.UNIFORM_BATCH,
                                       get_varlen_cudagraph_max_query_len=classmethod(bound_4))), None),
        "by_spec": (backend_on(builder("BySpec", AttentionCGSupport.UNIFORM_BATCH,
                                       get_cudagraph_support=classmethod(spec_dependent))), None),
    }


@pytest.mark.parametrize("case", ["always", "never", "single", "uniform", "bounded", "by_spec"])
def test_class_level_check_agrees_with_the_runner(case: str) -> None:
    """Where the class decides, it decides as the runner does; a builder overriding either method is left to the
    runner (here the runner accepts both: a bound of 4, and ALWAYS for this spec)."""
    backend, refused_by_class = _derived_backends()[case]
    refused_by_runner = _late_check(backend) is not None
    assert backend.cannot_replay_varlen_decode_cudagraphs() is bool(refused_by_class)
    assert any(r.startswith(REASON) for r in _reasons(backend, QUERY_LEN)) is bool(refused_by_class)
    if refused_by_class is not None:
        assert refused_by_runner is refused_by_class
    else:
        assert not refused_by_runner


def _selector_query_len(monkeypatch: pytest.MonkeyPatch, *, adaptive: bool = True, tag: str = "backbone",
                        mode: str = "FULL_AND_PIECEWISE") -> int | None:
    """The ``adaptive_verification_cudagraph_query_len`` that ``get_attn_backend`` hands the platform."""
    import vllm.compilation.backends
    import vllm.config
    from vllm.v1.attention import selector

    config = SimpleNamespace(
        cache_config=SimpleNamespace(user_specified_block_size=False, cache_dtype="auto"),
        kv_transfer_config=None, model_config=None,
        speculative_config=SimpleNamespace(enable_adaptive_verification=adaptive, num_speculative_tokens=3),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[mode]),
        attention_config=SimpleNamespace(use_non_causal=False, backend=None, backend_per_kind=None),
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1, decode_context_parallel_size=1))
    seen = []
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: config)
    monkeypatch.setattr(vllm.compilation.backends, "model_tag", tag)
    monkeypatch.setattr(selector, "_cached_get_attn_backend",
                        lambda **kw: seen.append(kw["attn_selector_config"]))
    selector.get_attn_backend(576, torch.bfloat16, "auto", use_mla=True)
    return seen[0].adaptive_verification_cudagraph_query_len


def test_selector_asks_only_for_the_target_with_full_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _selector_query_len(monkeypatch) == QUERY_LEN
    assert _selector_query_len(monkeypatch, mode="FULL_DECODE_ONLY") == QUERY_LEN
    assert _selector_query_len(monkeypatch, adaptive=False) is None
    assert _selector_query_len(monkeypatch, mode="NONE") is None  # eager: the CPU platform
    assert _selector_query_len(monkeypatch, mode="PIECEWISE") is None
    assert _selector_query_len(monkeypatch, tag="eagle_head") is None  # the runner checks target layers only
    assert _selector_query_len(monkeypatch, tag="dspark_head") is None


# CUDA's selection for a DeepSeek-V3 (MLA) target, in a child: vLLM's CUDA ops and FlashAttention's and FlashInfer's
# kernels are stubbed so that the CUDA platform, FLASH_ATTN_MLA and FLASHINFER_MLA import on CPU (nothing runs them).
_CUDA_SELECTION = textwrap.dedent("""
    import importlib.machinery, json, sys, types
    import torch
    sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    import vllm.v1.attention.backends.fa_utils as fa_utils
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata"):
        setattr(fa_utils, name, None)
    fa_utils.flash_attn_supports_mla = lambda: True
    def _stub(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return lambda *args, **kwargs: None
    for name in ("flashinfer", "flashinfer.decode", "flashinfer.utils"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__getattr__ = _stub
        sys.modules[name] = module
    sys.modules["vllm.v1.attention.backends.mla.cutlass_mla"] = None  # allocates on CUDA at import: ImportError
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm.config import VllmConfig, set_current_vllm_config
    current = set_current_vllm_config(VllmConfig())  # FLASHINFER_MLA reads it
    current.__enter__()
    out = {}
    for major in (9, 10):
        CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(major, 0))
        for query_len in (None, 4):
            config = AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto",
                                             block_size=None, use_mla=True, use_adaptive_verification=True,
                                             adaptive_verification_cudagraph_query_len=query_len)
            try:
                out[f"{major}/{query_len}"] = CudaPlatform.get_attn_backend_cls(None, config, num_heads=128)
            except ValueError as e:
                out[f"{major}/{query_len}"] = "ValueError: " + str(e)
    print("RESULT " + json.dumps(out))
""")


def test_cuda_selection_for_an_mla_target() -> None:
    out = run_engine_script(_CUDA_SELECTION)
    # without adaptive verification's graphs: upstream's choice on an H100, FLASHINFER_MLA first on a B200
    assert out["9/None"].endswith("FlashAttnMLABackend"), out
    assert out["10/None"].endswith("FlashInferMLABackend"), out
    # an H100 has no MLA backend whose graphs replay varlen decode batches: refused at selection, naming the fix
    refusal = out["9/4"]
    assert refusal.startswith("ValueError: No valid attention backend found"), refusal
    assert f"FLASH_ATTN_MLA: [{REASON}" in refusal, refusal
    assert "FLASHINFER_MLA: [compute capability not supported]" in refusal, refusal
    assert "enable_adaptive_verification=false" in refusal, refusal
    # a B200 keeps FLASHINFER_MLA (ALWAYS)
    assert out["10/4"].endswith("FlashInferMLABackend"), out
