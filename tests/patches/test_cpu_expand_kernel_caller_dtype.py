"""Patch 0014: the CPU fallback of the rejection sampler's ``expand_kernel`` writes the caller's buffer.

With EAGLE-3 on CPU, every non-greedy request's temperature, top-p and top-k are expanded from one value per
request to one per verified token by ``expand_batch_to_tokens`` (``vllm/v1/sample/rejection_sampler.py``), which
allocates the result with ``new_empty`` in the input's dtype and launches ``expand_kernel``; on CPU that launch goes
to ``_expand_kernel_impl`` in ``vllm/utils/cpu_triton_utils.py``. The sdist's version hands the int64-only C++
kernel int64 copies, so the buffer stays uninitialised: the torture run of ``benchmarks/robustness.py`` killed the
engine with "index 980753840 is out of bounds for dimension 1 with size 4096" (top-k) and temperature/top-p were
garbage. Here the launch is made as ``expand_batch_to_tokens`` makes it, on a buffer filled with a sentinel.
"""

from __future__ import annotations

import pytest

#: A mainline patch for code 0.32.0 has (the CPU Triton fallbacks are newer than 0.26.0).
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]


@pytest.mark.parametrize("dtype, values, replace", [
    ("float32", [0.7, -1.0, 1.3], (-1, 1)),  # temperature: greedy rows (-1) become 1
    ("int32", [20, 4096, 1], (0, 0)),  # top-k
    ("float32", [0.9, 1.0, 0.5], (0, 0)),  # top-p
])
def test_per_request_values_reach_every_verified_token(dtype: str, values: list, replace: tuple) -> None:
    torch = pytest.importorskip("torch")
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import _expand

    if not current_platform.is_cpu():
        pytest.skip("the fallback is the CPU platform's (a GPU runs the Triton kernel)")
    current_platform.register_triton_kernel_overrides()  # as the worker does at start (worker_base.py)

    x = torch.tensor(values, dtype=getattr(torch, dtype))
    cu_num_tokens = torch.tensor([4, 5, 9], dtype=torch.int32)  # 4, 1 and 4 tokens (k = 3 and a prefill)
    out = torch.full((9,), -7, dtype=x.dtype)
    _expand(out, x, cu_num_tokens, *replace)
    fixed = [replace[1] if v == replace[0] else v for v in values]
    expected = torch.tensor([fixed[0]] * 4 + [fixed[1]] + [fixed[2]] * 4, dtype=x.dtype)
    assert torch.equal(out, expected), out
