"""The torch-only CPU platform: vLLM's CpuPlatform with every compiled piece served by torch code.

What it changes on vLLM's ``CpuPlatform``:

- ``import_kernels``: the ``torch.ops._C`` ops of the CPU path, in torch (:mod:`kimi.cpu_platform.ops`);
- ``register_triton_kernel_overrides``: Model Runner V2's Triton kernels on the hot path, in torch
  (:data:`kimi.cpu_platform.kernels.OVERRIDES`); the rest run in Triton's interpreter;
- ``get_attn_backend_cls``: the fork's ``CPU_MLA`` (:mod:`kimi.cpu_mla`: prefill, decode and the k + 1
  tokens of EAGLE verification on one paged torch path) for MLA layers, the torch attention backend
  (:mod:`kimi.cpu_platform.attention`) for the others;
- ``check_and_update_config``: custom ops run their torch code, eager mode, and what the torch code does
  not compute is refused with the fix named, while the config is built (before any weights load).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(f"vllm.{__name__}")  # under vllm's logger, whose handler prints INFO

ATTENTION_BACKEND = "kimi.cpu_platform.attention.TorchCpuAttentionBackend"
MLA_BACKEND = "kimi.cpu_mla.backend.CpuMLABackend"
#: ``torch`` (default): the runner's Triton kernels in torch; ``interpreter``: all of them in Triton's interpreter
#: (slow; to tell an override's fault from upstream's).
KERNELS_ENV = "KIMI_CPU_KERNELS"
KERNELS_MODES = ("torch", "interpreter")
#: KV cache dtypes the torch ops store (``auto`` is the model's dtype).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")


def refusals(vllm_config: VllmConfig) -> list[str]:
    """What in ``vllm_config`` the torch-only CPU platform cannot run, one sentence with its fix each."""
    found = []
    if os.environ.get(KERNELS_ENV, "torch") not in KERNELS_MODES:
        found.append(f"{KERNELS_ENV}={os.environ[KERNELS_ENV]!r}: set it to {' or '.join(KERNELS_MODES)}, "
                     "or unset it")
    if os.environ.get("TRITON_INTERPRET") != "1":
        found.append("TRITON_INTERPRET is set to something other than 1: the kernels left to Triton run in its "
                     "interpreter on this platform; unset it or set TRITON_INTERPRET=1")
    dtype = getattr(vllm_config.model_config, "dtype", torch.float32)
    if dtype != torch.float32:
        found.append(f"--dtype {str(dtype).removeprefix('torch.')}: vLLM's CPU matmul of half-precision weights needs "
                     "its compiled kernels; use --dtype float32")
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is not None:
        found.append(f"--attention-backend {getattr(backend, 'name', backend)}: this platform picks its own (the "
                     "fork's CPU_MLA for MLA layers, CPU_ATTN on torch ops for the others); leave it unset")
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in KV_CACHE_DTYPES:
        found.append(f"--kv-cache-dtype {cache_dtype}: a quantized KV cache needs vLLM's compiled CPU kernels; "
                     "leave it at auto")
    for role, model in (("target", vllm_config.model_config),
                        ("draft model", getattr(vllm_config.speculative_config, "draft_model_config", None))):
        method = getattr(model, "quantization", None)
        if method is not None:
            found.append(f"the {role} is quantized ({method}): its linear layers need vLLM's compiled kernels; "
                         "serve an unquantized checkpoint, or install a vLLM build with CPU kernels")
    return found


class TorchCpuPlatform(CpuPlatform):
    """vLLM's CPU platform with its ``_C`` ops and the model runner's Triton kernels in torch."""

    @classmethod
    def import_kernels(cls) -> None:
        from kimi.cpu_platform import ops

        ops.register()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        if os.environ.get(KERNELS_ENV, "torch") == "interpreter":
            logger.info("torch-only CPU platform: %s=interpreter, every Triton kernel runs interpreted", KERNELS_ENV)
            return
        from vllm.triton_utils.dispatcher import register_kernels

        from kimi.cpu_platform.kernels import OVERRIDES

        register_kernels(OVERRIDES)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend: AttentionBackendEnum,
                             attn_selector_config: AttentionSelectorConfig, num_heads: int | None = None) -> str:
        if attn_selector_config.use_mla:
            return MLA_BACKEND
        return ATTENTION_BACKEND

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        """vLLM's CPU settings (async scheduling back on for pipeline parallelism with a drafter), then
        ``custom_ops=["none"]`` and eager mode.

        Raises:
            ValueError: :func:`refusals` found something; the message lists each with its fix.
        """
        problems = refusals(vllm_config)
        if problems:
            raise ValueError("the torch-only CPU platform (no compiled vLLM kernels) cannot run this:\n  - "
                             + "\n  - ".join(problems))
        from vllm.config.compilation import CompilationMode, CUDAGraphMode  # imports the platform: not at the top

        super().check_and_update_config(vllm_config)
        if vllm_config.parallel_config.pipeline_parallel_size > 1 and vllm_config.speculative_config is not None:
            # vLLM's CPU platform turns async scheduling off. Without it the engine core hands the scheduler the
            # drafts of a batch still in the pipeline's batch queue (EngineCore.post_step), the scheduler sends
            # those requests again with one new token and a draft each, and the first stage's prepare_inputs
            # asserts num_scheduled_tokens >= num_drafts + 1. The V2 runner's pipeline relay of sampled tokens and
            # drafts (PPHandler) is made for async scheduling.
            logger.info("torch-only CPU platform: async scheduling on (pipeline parallelism with speculative decoding)")
            vllm_config.scheduler_config.async_scheduling = True
        compilation = vllm_config.compilation_config
        if compilation.custom_ops != ["none"]:
            logger.info("torch-only CPU platform: custom ops run their torch code (custom_ops=['none'])")
            compilation.custom_ops = ["none"]
        if compilation.mode != CompilationMode.NONE:
            # the torch ops have no fake (meta) versions for torch.compile to trace: run eager
            logger.info("torch-only CPU platform: eager mode (as --enforce-eager)")
            if vllm_config.model_config is not None:  # a VllmConfig() without a model has none
                vllm_config.model_config.enforce_eager = True
            compilation.mode = CompilationMode.NONE
            compilation.cudagraph_mode = CUDAGraphMode.NONE
