"""Patch 0015: top-k on CPU of a verification step without draft tokens.

With speculative decoding the rejection sampler applies each request's sampling settings to the target logits of
its draft tokens (``apply_sampling_constraints``, ``vllm/v1/sample/rejection_sampler.py``). A step can carry the
spec-decode metadata with no draft token at all (a lone request between drafts); on CPU top-k without top-p then
goes to ``apply_top_k_only`` (``vllm/v1/sample/ops/topk_topp_sampler.py``) with zero rows, whose ``k.max()``
raised "max(): Expected reduction dim to be specified for input.numel() == 0" and killed the engine: one
``SamplingParams(temperature=1.0, top_k=20)`` request alone on the trained pair with EAGLE-3 did it.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.install, pytest.mark.line("mainline")]


def test_no_rows_are_returned_as_they_are() -> None:
    torch = pytest.importorskip("torch")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    empty = torch.empty(0, 4096)
    out = apply_top_k_top_p_pytorch(empty, torch.empty(0, dtype=torch.int32), None, allow_cpu_sync=True)
    assert out.shape == (0, 4096)


def test_rows_are_still_masked() -> None:
    torch = pytest.importorskip("torch")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0], [5.0, 4.0, 3.0, 2.0]])
    out = apply_top_k_top_p_pytorch(logits.clone(), torch.tensor([2, 4], dtype=torch.int32), None,
                                    allow_cpu_sync=True)
    assert torch.isinf(out[0]).tolist() == [True, False, False, True]
    assert not torch.isinf(out[1]).any()
