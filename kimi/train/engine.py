"""vLLM engine settings per platform, and one place that says what the training stages print.

On CPU the engine gets :data:`kimi.e2e.engine.CPU_ENGINE` (a fixed KV cache, float32) and eager mode; on
CUDA a bf16 engine that takes a share of the GPU's memory (the models here are small).
"""

from __future__ import annotations

from kimi.log import sayer

#: Engine settings on CUDA: vLLM's MLA kernels want bf16; a small share of memory leaves room for training. A
#: fixed KV cache skips vLLM's memory profiling, whose check "free memory did not grow meanwhile" failed on the
#: H200 ("Error in memory profiling. Initial free memory 138.53 GiB, current free memory 138.59 GiB").
CUDA_ENGINE = {"dtype": "bfloat16", "max_model_len": 1024, "gpu_memory_utilization": 0.4, "seed": 0,
               "kv_cache_memory_bytes": 2 << 30}


#: The training stages' progress lines: ``kimi train: ...`` on stderr.
say = sayer("train")


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_settings(eager: bool = True) -> dict:
    """``LLM(...)`` keyword arguments for this machine (CPU: CPU_ENGINE; CUDA: CUDA_ENGINE)."""
    from kimi.e2e.engine import CPU_ENGINE

    settings = dict(CUDA_ENGINE) if on_cuda() else dict(CPU_ENGINE)
    if eager or not on_cuda():
        settings["enforce_eager"] = True
    return settings
