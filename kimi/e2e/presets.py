"""Engine presets: the ``LLM(...)`` keyword arguments that the checks and benchmarks start vLLM with, in one place.

Each preset is a plain dict (no vLLM import); callers copy it (``dict(PRESET)`` / ``{**PRESET, ...}``) before
adding to it. ``kimi.e2e.server.serve_args`` turns one into ``vllm serve`` flags.

Why the settings look the way they do:

* A fixed KV cache (``kv_cache_memory_bytes``) everywhere: on CPU vLLM's ``gpu_memory_utilization`` would
  reserve most of host memory; on a GPU it skips vLLM's memory profiling, which refuses to run while another
  process on the GPU changes its memory use. ``gpu_memory_utilization`` then only has to pass the start-up
  check "free memory >= utilization x total", so a low value lets engines run side by side.
* float32 on CPU so that implementations can be compared; bfloat16 on a GPU (vLLM's MLA kernels want it).
"""

from __future__ import annotations

#: CPU runs that compare implementations (``kimi.e2e.engine``, ``benchmarks/cpu_e2e.py``, ``kimi train`` on CPU).
CPU_ENGINE = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20, "seed": 0}
#: :data:`CPU_ENGINE` without torch.compile (``benchmarks/cpu_e2e.py``'s engines).
CPU_EAGER = {**CPU_ENGINE, "enforce_eager": True}

#: ``vllm serve`` on CPU in ``benchmarks/cpu_e2e.py`` (a shorter context than :data:`CPU_ENGINE`).
CPU_SERVE = {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 512 << 20}

#: ``benchmarks/gpu_e2e.py`` on a GPU: several engines (lanes) at once on one GPU, 1 GiB of KV cache each.
GPU_E2E = {"dtype": "bfloat16", "max_model_len": 512, "gpu_memory_utilization": 0.12,
           "kv_cache_memory_bytes": 1 << 30, "seed": 0}
#: ``benchmarks/gpu_e2e.py --cpu-smoke``: the same logic without a GPU (eager, float32).
GPU_E2E_CPU_SMOKE = {**CPU_SERVE, "seed": 0, "enforce_eager": True}
#: If gpu_e2e's baseline cannot start with vLLM's MLA backend choice, everything runs with this one.
MLA_FALLBACK = {"attention_config": {"backend_per_kind": {"mla_attention": "TRITON_MLA"}}}
#: If the Kimi-K2.5 wrapper cannot start with its vision tower profiled, it runs text-only.
K25_FALLBACK = {"limit_mm_per_prompt": {"vision_chunk": 0}}

#: ``benchmarks/perf_vs_upstream.py`` on a GPU (vLLM's defaults otherwise: torch.compile, CUDA graphs, async
#: scheduling); prefix caching off, so that repeated prompts cost the same as new ones. The plan adds
#: ``max_num_seqs`` (the largest concurrency) and the CUDA-graph sizes measured.
PERF_GPU = {"dtype": "bfloat16", "max_model_len": 1024, "seed": 0, "enable_prefix_caching": False}
#: ``benchmarks/perf_vs_upstream.py --cpu-smoke``.
PERF_CPU_SMOKE = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "seed": 0,
                  "enable_prefix_caching": False}
#: The trained pair's engines in perf_vs_upstream: 2 GiB of KV cache each.
PERF_PAIR_KV_BYTES = 2 << 30
#: On a GPU, the pair's engines also take this, so that engines started side by side (--parallel-start) pass
#: the start-up check of free memory.
PERF_SIDE_BY_SIDE = {"gpu_memory_utilization": 0.05}
#: The Kimi-dimension slice (random weights, token ids given directly); its KV cache is ``--slice-kv-gib``.
PERF_SLICE = {"load_format": "dummy", "skip_tokenizer_init": True}
