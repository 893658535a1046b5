"""Per-kernel time of the CPU platform's torch overrides against the Triton kernels in Triton's interpreter.

    .venv/bin/python benchmarks/cpu_kernel_overrides.py [num_reqs ...]   (the mainline's venv)

Drives the upstream launchers of tests/cpu_platform/test_kernel_overrides.py on one decode step's batch
(3 speculative steps, vocab 4096) and records the mean ms per launch of each kernel, both ways, in
``benchmarks/results/cpu_kernel_overrides.{json,md}``.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "tests"), str(ROOT / "tests" / "cpu_platform")]

import pytest  # noqa: E402
import test_kernel_overrides as t  # noqa: E402
import torch  # noqa: E402

from kimi_lab.bench.hardware import cpu_name  # noqa: E402
from kimi_lab.bench.results import header, stamp, write_json, write_lines  # noqa: E402


class Timed:
    def __init__(self, name, impl, times):
        self.kernel = t.upstream_kernel(name)
        self.run = t.dispatcher.KernelOverride(self.kernel, t.OVERRIDES[name]) if impl else self.kernel
        self.name, self.times, self.arg_names = name.rsplit(".", 1)[1], times, self.kernel.arg_names

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            start = time.perf_counter()
            self.run[grid](*args, **kwargs)
            self.times[self.name].append(time.perf_counter() - start)
        return launch


def step(num_reqs: int):
    shape = (num_reqs, num_reqs + 4, 3, 7)
    b, temperature, seeds, expanded, local_pos, logits, draft_sampled, pos = t.verification_batch(shape, 0.5, 4096)
    t.up_input_batch.prepare_pos_seq_lens(b.idx_mapping, b.query_start_loc, b.num_computed,
                                          torch.zeros(b.num_tokens, dtype=torch.int64), b.seq_lens.clone())
    t.up_input_batch.combine_sampled_and_draft_tokens(
        torch.zeros(b.num_tokens, dtype=torch.int32), b.idx_mapping, torch.zeros(b.max_num_reqs, dtype=torch.int32),
        b.query_start_loc, b.seq_lens, b.prefill_len, torch.zeros(b.max_num_reqs, 3, dtype=torch.int32),
        b.cu_num_logits, b.total_logits)
    t.up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits, 4)
    t.up_gumbel.gumbel_sample(logits, expanded, temperature, seeds, pos, apply_temperature=True, is_drafting=False)
    t.up_rejection_utils.rejection_sample(logits, None, draft_sampled, b.cu_num_logits, pos, b.idx_mapping, expanded,
                                          local_pos, temperature, seeds, 3)
    sampled = torch.randint(0, 4096, (b.num_reqs, 4))
    t.up_input_batch.post_update(b.idx_mapping, b.num_computed.clone(), torch.zeros(b.max_num_reqs, dtype=torch.int32),
                                 None, sampled, torch.ones(b.num_reqs, dtype=torch.int32),
                                 torch.zeros(b.num_reqs, dtype=torch.int32), b.query_start_loc,
                                 torch.zeros(b.max_num_reqs, 512, dtype=torch.int32),
                                 torch.zeros(b.max_num_reqs, dtype=torch.int32))
    buffers = t.draft_buffers(b.max_num_reqs, b.max_num_reqs * 4)
    t.up_speculator.update_draft_inputs(
        torch.randint(0, 99, (b.num_reqs,)), torch.tensor(0, dtype=torch.int32), torch.randn(b.num_reqs, 256),
        torch.zeros(b.max_num_reqs, 3, dtype=torch.int64), torch.zeros(b.max_num_reqs * 4, 256), buffers,
        torch.zeros(b.max_num_reqs, dtype=torch.int64), b.num_reqs, torch.tensor(512), 3)


def main() -> None:
    counts = [int(a) for a in sys.argv[1:]] or [4, 32]
    out = {**stamp("benchmarks/cpu_kernel_overrides.py", sys.argv[1:], python=".venv/bin/python"),
           "cpu": cpu_name(), "vllm": importlib.metadata.version("vllm"), "torch": torch.__version__, "rows": []}
    for num_reqs in counts:
        results = {}
        for impl in (False, True):
            times: dict[str, list[float]] = defaultdict(list)
            with pytest.MonkeyPatch.context() as patch:
                for name in t.OVERRIDES:
                    host, attr = t.dispatcher._resolve_kernel(name)
                    patch.setattr(host, attr, Timed(name, impl, times))
                for _ in range(3):
                    step(num_reqs)
            results[impl] = {k: 1e3 * sum(v) / len(v) for k, v in times.items()}
        out["rows"] += [{"num_reqs": num_reqs, "kernel": name, "interpreter_ms": round(results[False][name], 3),
                         "torch_ms": round(results[True][name], 4)} for name in sorted(results[False])]
    write_json(ROOT / "benchmarks/results/cpu_kernel_overrides.json", out)
    lines = header("Runner kernels: Triton's interpreter against the torch overrides (ms per launch)", out["command"],
                   out["date"])
    lines += [(f"- machine: {out['cpu']}; vLLM {out['vllm']}, torch {out['torch']}; one decode step with 3 "
               "speculative tokens, vocab 4096, mean of 3 steps"), "",
              "| requests | kernel | interpreter | torch |", "|---|---|---|---|"]
    lines += [f"| {r['num_reqs']} | {r['kernel']} | {r['interpreter_ms']:.2f} | {r['torch_ms']:.3f} |"
              for r in out["rows"]]
    lines += ["", "Not shown: kernels off this path (left to the interpreter), the model's own time."]
    write_lines(ROOT / "benchmarks/results/cpu_kernel_overrides.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
