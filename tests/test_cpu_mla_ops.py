"""kimi.cpu_mla.ops against a dense float64 reference: prefill, decode, chunked prefill, k+1-token queries."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kimi.cpu_mla.ops import paged_latent_attention, write_latent_cache  # noqa: E402

pytestmark = pytest.mark.install

LORA, ROPE, HEADS, BLOCK = 512, 64, 4, 16


def _paged_batch(seq_lens, q_lens, dtype, seed=0):
    """Random latents for each request scattered over shuffled cache blocks; queries for the last q_len tokens."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-s // BLOCK) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.zeros(num_blocks, BLOCK, LORA + ROPE, dtype=dtype)
    table = torch.full((len(seq_lens), max(blocks_per_req) + 1), -1, dtype=torch.int32)
    latents, taken = [], 0
    for r, (seq, n) in enumerate(zip(seq_lens, blocks_per_req, strict=True)):
        table[r, :n] = torch.tensor(order[taken:taken + n], dtype=torch.int32)
        taken += n
        lat = torch.randn(seq, LORA + ROPE, generator=gen).to(dtype)
        slots = torch.stack([table[r, i // BLOCK] * BLOCK + i % BLOCK for i in range(seq)])
        write_latent_cache(lat[:, :LORA], lat[:, LORA:].unsqueeze(1), cache, slots)
        latents.append(lat)
    q = torch.randn(sum(q_lens), HEADS, LORA + ROPE, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return cache, table, torch.tensor(seq_lens, dtype=torch.int32), starts, q, latents


def _dense_reference(q, latents, seq_lens, q_lens, scale):
    outs, lses, begin = [], [], 0
    for lat, seq, n in zip(latents, seq_lens, q_lens, strict=True):
        keys = lat.double()
        queries = q[begin:begin + n].double()
        scores = torch.einsum("qhd,sd->qhs", queries, keys) * scale
        for i in range(n):
            scores[i, :, seq - n + i + 1:] = float("-inf")
        lses.append(torch.logsumexp(scores, -1))
        outs.append(torch.einsum("qhs,sd->qhd", scores.softmax(-1), keys[:, :LORA]))
        begin += n
    return torch.cat(outs), torch.cat(lses)


# prefill from scratch, single-token decode, a chunk of a prefill with context, k + 1 = 4 verification tokens,
# a request with no query this step.
SEQ_LENS = [37, 90, 130, 21, 48]
Q_LENS = [37, 1, 33, 4, 0]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_matches_dense_reference(dtype, tol) -> None:
    cache, table, seqs, starts, q, latents = _paged_batch(SEQ_LENS, Q_LENS, dtype)
    scale = 192 ** -0.5
    out, lse = paged_latent_attention(q, cache, table, seqs, starts, scale, LORA)
    ref_out, ref_lse = _dense_reference(q, latents, SEQ_LENS, Q_LENS, scale)
    assert out.shape == (sum(Q_LENS), HEADS, LORA) and out.dtype == dtype and lse.dtype == torch.float32
    assert torch.allclose(out.double(), ref_out, atol=tol, rtol=tol)
    assert torch.allclose(lse.double(), ref_lse, atol=tol, rtol=tol)


def test_a_query_sees_only_earlier_positions() -> None:
    cache, table, seqs, starts, q, latents = _paged_batch([20], [4], torch.float32)
    out, _ = paged_latent_attention(q, cache, table, seqs, starts, 0.1, LORA)
    later = cache.view(-1, LORA + ROPE)[table[0, 1] * BLOCK + 3]  # position 19, seen only by the last query
    later.add_(100.0)
    moved, _ = paged_latent_attention(q, cache, table, seqs, starts, 0.1, LORA)
    assert torch.equal(moved[:3], out[:3]) and not torch.allclose(moved[3], out[3])


def test_padding_slots_are_not_written() -> None:
    cache = torch.zeros(2, BLOCK, LORA + ROPE)
    kv_c, k_pe = torch.ones(3, LORA), torch.full((3, 1, ROPE), 2.0)
    write_latent_cache(kv_c, k_pe, cache, torch.tensor([5, -1, 17]))
    flat = cache.view(-1, LORA + ROPE)
    assert flat[5, 0] == 1 and flat[5, -1] == 2 and flat[17, 0] == 1
    assert int((flat.abs().sum(-1) > 0).sum()) == 2


def test_bad_shapes_are_named() -> None:
    cache = torch.zeros(2, BLOCK, LORA + ROPE)
    with pytest.raises(ValueError, match="kv_lora_rank / qk_rope_head_dim do not match"):
        write_latent_cache(torch.ones(1, 256), torch.ones(1, 1, ROPE), cache, torch.tensor([0]))
    q = torch.zeros(3, HEADS, LORA + ROPE)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="3 query tokens but only 2 tokens"):
        paged_latent_attention(q, cache, table, torch.tensor([2]), torch.tensor([0, 3]), 1.0, LORA)
    with pytest.raises(ValueError, match="needs 2 cache blocks; its block table has 1"):
        paged_latent_attention(q, cache, table, torch.tensor([20]), torch.tensor([0, 3]), 1.0, LORA)
