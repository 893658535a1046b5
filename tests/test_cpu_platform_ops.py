"""kimi.cpu_platform.ops (torch versions of vLLM's CPU ``_C`` ops) against dense references.

The ops need only torch, so they are checked in any install; their registration under ``torch.ops._C``
runs in a child process (the mainline's install has vLLM's compiled ``_C`` loaded, which holds these names).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kimi.cpu_platform import ops  # noqa: E402

pytestmark = pytest.mark.install


def _paged(seq_lens, kv_heads, head, block, seed=0):
    """Random keys/values per request, written through cpu_attn_reshape_and_cache into shuffled blocks.

    Returns (key_cache, value_cache, block_table, dense keys per request, dense values per request).
    """
    gen = torch.Generator().manual_seed(seed)
    per_req = [-(-s // block) for s in seq_lens]
    num_blocks = sum(per_req) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.zeros(num_blocks, kv_heads, 2 * block, head)
    key_cache, value_cache = cache.view(num_blocks, kv_heads, 2 * block, head).chunk(2, dim=2)
    table = torch.zeros(len(seq_lens), max(per_req) + 1, dtype=torch.int32)
    keys, values, taken = [], [], 0
    for r, (seq, n) in enumerate(zip(seq_lens, per_req, strict=True)):
        table[r, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
        k = torch.randn(seq, kv_heads, head, generator=gen)
        v = torch.randn(seq, kv_heads, head, generator=gen)
        slots = torch.tensor([int(table[r, i // block]) * block + i % block for i in range(seq)])
        # a padding token (slot -1) in between must not be written anywhere
        ops.cpu_attn_reshape_and_cache(torch.cat([k, k[:1] + 100]), torch.cat([v, v[:1] + 100]),
                                       key_cache, value_cache, torch.cat([slots, torch.tensor([-1])]), "vec")
        keys.append(k)
        values.append(v)
    return key_cache, value_cache, table, keys, values


def _dense_attention(q, k, v, scale, window=0, softcap=0.0):
    """q [q_len, H, D], k/v [S, KH, D]: causal attention of the last q_len positions, float64."""
    q_len, heads = q.shape[:2]
    seq = k.shape[0]
    group = heads // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    pos = torch.arange(seq - q_len, seq)[:, None]
    key_pos = torch.arange(seq)[None, :]
    hidden = key_pos > pos
    if window:
        hidden |= key_pos <= pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqs,shd->qhd", torch.softmax(scores, -1), v)


@pytest.mark.parametrize(("heads", "kv_heads", "head", "window", "softcap"),
                         [(4, 4, 48, 0, 0.0), (8, 2, 64, 0, 0.0), (4, 1, 32, 5, 0.0), (2, 2, 16, 0, 30.0)])
def test_paged_attention_equals_dense_attention(heads, kv_heads, head, window, softcap):
    block = 16
    seq_lens, q_lens = [1, 17, 40, 33], [1, 17, 4, 1]  # decode, prefill, a k+1 = 4 verification, decode
    key_cache, value_cache, table, keys, values = _paged(seq_lens, kv_heads, head, block)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(sum(q_lens), heads, head, generator=gen)
    out = torch.full_like(q, float("nan"))
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    scale = head ** -0.5
    ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, qsl, torch.tensor(seq_lens, dtype=torch.int32),
                                    scale, True, None, window, table, softcap, torch.empty(0), None, None)
    for r in range(len(seq_lens)):
        begin, end = int(qsl[r]), int(qsl[r + 1])
        want = _dense_attention(q[begin:end], keys[r], values[r], scale, window, softcap)
        torch.testing.assert_close(out[begin:end].double(), want, rtol=1e-5, atol=1e-5)


def test_attention_whose_output_is_unused_writes_zeros_and_leaves_the_cache():
    """Inside ``attention_output_unused`` (the drafter's pass that only keeps its KV cache) the op attends to
    nothing: zeros where the queries' output goes, the caches as they were; outside it, attention as before."""
    seq_lens, q_lens, heads, head = [5, 9], [1, 3], 4, 16
    key_cache, value_cache, table, _, _ = _paged(seq_lens, 2, head, 16)
    q = torch.randn(sum(q_lens), heads, head, generator=torch.Generator().manual_seed(3))
    qsl = torch.tensor([0, 1, 4], dtype=torch.int32)
    args = (qsl, torch.tensor(seq_lens, dtype=torch.int32), head ** -0.5, True, None, 0, table, 0.0, torch.empty(0),
            None, None)
    caches = key_cache.clone(), value_cache.clone()
    out = torch.full_like(q, float("nan"))
    with ops.attention_output_unused():
        ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, *args)
    assert out.eq(0).all()
    assert torch.equal(key_cache, caches[0]) and torch.equal(value_cache, caches[1])
    ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, *args)
    assert out.abs().sum() > 0, "the scope ended with the block"


def test_reshape_and_cache_skips_padding_slots():
    key_cache, value_cache, table, keys, _ = _paged([5], 2, 32, 16)
    block = int(table[0, 0])
    torch.testing.assert_close(key_cache[block, :, :5], keys[0].transpose(0, 1))
    assert key_cache[block, :, 5:].abs().sum() == 0  # the padding token's +100 went nowhere
    others = [b for b in range(key_cache.shape[0]) if b != block]
    assert key_cache[others].abs().sum() == 0


@pytest.mark.parametrize(("name", "kwargs"), [
    ("ALiBi slopes", {"alibi_slopes": torch.ones(2)}),
    ("attention sinks", {"s_aux": torch.ones(2)}),
    ("kv_cache_dtype='fp8'", {"kv_cache_dtype": "fp8"}),
])
def test_paged_attention_refuses_what_it_does_not_compute(name, kwargs):
    key_cache, value_cache, table, _, _ = _paged([4], 2, 32, 16)
    q = torch.randn(1, 2, 32)
    args = {"alibi_slopes": None, "s_aux": None, "kv_cache_dtype": "auto", **kwargs}
    with pytest.raises(ops.UnsupportedOnTorchCpu) as info:
        ops.cpu_attention_with_kv_cache(q, key_cache, value_cache, torch.empty_like(q), torch.tensor([0, 1]),
                                        torch.tensor([4]), 1.0, True, args["alibi_slopes"], 0, table, 0.0,
                                        torch.empty(0), args["s_aux"], None, kv_cache_dtype=args["kv_cache_dtype"])
    assert name.split("=")[0] in str(info.value)


@pytest.mark.parametrize("skip_weighted", [False, True])
def test_fused_moe_equals_per_token_experts(skip_weighted):
    tokens, hidden, inter, experts, top = 7, 12, 5, 4, 2
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, inter, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top] for _ in range(tokens)])
    weights = torch.rand(tokens, top, generator=gen)
    packed = torch.empty_like(w13)
    ops.prepack_moe_weight(w13, packed, "vec")
    out = torch.empty(tokens, hidden)
    ops.cpu_fused_moe(out, x, packed, w2, None, None, weights, ids, skip_weighted, "silu", "vec")
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ x[t].double()
            act = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            want[t] += (1.0 if skip_weighted else float(weights[t, j])) * (w2[e].double() @ act)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_fused_moe_refuses_an_unknown_activation():
    with pytest.raises(ops.UnsupportedOnTorchCpu, match="swigluoai"):
        ops.cpu_fused_moe(torch.empty(1, 2), torch.randn(1, 2), torch.randn(1, 2, 2), torch.randn(1, 2, 1), None,
                          None, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long), False, "swigluoai", "vec")


def test_register_defines_every_op_under_torch_ops_C():
    code = ("import torch\nfrom kimi.cpu_platform import ops\nops.register()\nops.register()\n"
            "print(sorted(n for n in ops.SCHEMAS if hasattr(torch.ops._C, n)))\n"
            "print(torch.ops._C.cpu_attn_has_isa('amx'))\n"
            "torch.ops._C.init_cpu_memory_env([0])\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    names, has_isa = proc.stdout.splitlines()[-2:]
    assert names == str(sorted(ops.SCHEMAS))
    assert has_isa == "False"
