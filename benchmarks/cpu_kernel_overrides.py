"""Per-kernel time of the CPU platform's torch overrides against the Triton kernels in Triton's interpreter.

    TRITON_INTERPRET=1 python benchmarks/cpu_kernel_overrides.py [num_reqs ...]

Drives the upstream launchers of tests/cpu_platform/test_kernel_overrides.py on one decode step's batch
(3 speculative steps, vocab 4096) and prints the mean ms per launch of each kernel, both ways.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cpu_platform"))

import pytest  # noqa: E402
import test_kernel_overrides as t  # noqa: E402
import torch  # noqa: E402


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
    for num_reqs in [int(a) for a in sys.argv[1:]] or [4, 32]:
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
        print(f"num_reqs={num_reqs}: ms per launch, interpreter -> torch")
        for name in sorted(results[False]):
            print(f"  {name:45s} {results[False][name]:9.2f} -> {results[True][name]:7.3f}")
        print(f"  {'sum':45s} {sum(results[False].values()):9.2f} -> {sum(results[True].values()):7.3f}")


if __name__ == "__main__":
    main()
