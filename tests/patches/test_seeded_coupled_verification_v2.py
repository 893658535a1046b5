"""Patch 0019: on the V2 model runner a seeded request verified by coupling gives the tokens of plain sampling,
whatever its drafts.

vLLM 0.32.0's V2 sampler keys its Gumbel noise by (seed, position, token), so a seeded request's tokens without
speculation do not depend on the batch; but its rejection sampler accepts a draft by a ratio test and resamples a
rejected position from the residual, so with EAGLE-3 the tokens follow the drafts, and the drafts follow the batch
(``benchmarks/results/robustness-gpu.md``: ``mixed_sampling`` seeded 0/4 identical across token budgets 64 and 512 on
the H200). With the patch every emitted token of a coupled request is ``gumbel_sample``'s draw at its position.

The first tests check ``couple_v2`` (the choice of the accepted prefix) and ``coupled_requests_v2`` (which
requests) on CPU tensors. The GPU test drives the patched ``RejectionSampler._verify`` step by step against a toy
target (logits that are a function of the prefix), with drafts that are all right, all wrong or partly right,
beside an unseeded and a greedy request; the reference is the plain V2 sampling of one request at a time
(``Sampler._sample_random``'s path: processed logits, then ``gumbel_sample``).
"""

from __future__ import annotations

import random

import pytest

np = pytest.importorskip("numpy")


def _torch():
    return pytest.importorskip("torch")


def _hook():
    """The hook module (it needs torch: the fast tier's python has none)."""
    _torch()
    from kimi.hooks import seeded_coupled_verification_v2

    return seeded_coupled_verification_v2


@pytest.mark.install
def test_couple_v2_accepts_the_drafts_that_equal_the_samples_before_them() -> None:
    torch = _torch()
    couple_v2 = _hook().couple_v2
    # request 0: 3 drafts, all equal to the samples before them -> 4 tokens (the last row's sample is the bonus);
    # request 1: 3 drafts, the second one wrong -> 2 tokens; request 2: no drafts -> 1 token;
    # request 3: 2 drafts, a -1 (never accepted) first -> 1 token; request 4: like request 0 but not coupled.
    samples = torch.tensor([7, 8, 9, 4, 5, 6, 1, 2, 9, 3, 3, 7, 8, 9, 4])
    drafts = torch.tensor([0, 7, 8, 9, 0, 5, 0, 2, 0, 0, -1, 0, 7, 8, 9])
    cu = torch.tensor([0, 4, 8, 9, 12, 15], dtype=torch.int32)
    coupled = torch.tensor([True, True, True, True, False])
    upstream = torch.full((5, 4), 42, dtype=torch.int64)
    upstream_num = torch.full((5,), 3, dtype=torch.int32)
    sampled, num = couple_v2(samples, drafts, cu, coupled, upstream, upstream_num)
    assert num.tolist() == [4, 2, 1, 1, 3] and num.dtype == torch.int32
    emitted = [row[:n] for row, n in zip(sampled.tolist(), num.tolist(), strict=True)]
    assert emitted == [[7, 8, 9, 4], [5, 6], [9], [3], [42, 42, 42]]


@pytest.mark.install
def test_only_seeded_sampled_requests_with_one_hot_drafts_are_coupled(monkeypatch: pytest.MonkeyPatch) -> None:
    coupled_requests_v2 = _hook().coupled_requests_v2
    seeds_set = np.array([True, False, True, True])
    temperature = np.array([0.8, 0.8, 0.0, 1.0], dtype=np.float32)
    idx = np.array([3, 0, 1, 2])
    plain = dict(has_draft_logits=False, synthetic=False, watermark=False)
    assert coupled_requests_v2(seeds_set, temperature, idx, **plain).tolist() == [True, True, False, False]
    assert coupled_requests_v2(seeds_set, temperature, np.array([1, 2]), **plain) is None  # unseeded, greedy
    for other in ("has_draft_logits", "synthetic", "watermark"):
        assert coupled_requests_v2(seeds_set, temperature, idx, **{**plain, other: True}) is None
    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", "upstream")
    assert coupled_requests_v2(seeds_set, temperature, idx, **plain) is None
    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", "off")
    with pytest.raises(ValueError, match="expected one of coupled, upstream"):
        coupled_requests_v2(seeds_set, temperature, idx, **plain)


# ---------------------------------------------------------------- the patched V2 RejectionSampler, on the GPU

VOCAB = 3000  # three of gumbel_sample's 1024-wide blocks
K = 3
PROMPT_LEN = 9
OUTPUT_TOKENS = 40
#: (request-state index, temperature, top_k, top_p, seed): two seeded (one with top-k and top-p), one unseeded,
#: one greedy; state indices out of order, as the runner's persistent batch has them.
REQUESTS = [(3, 0.8, 50, 0.9, 11), (0, 1.3, -1, 1.0, 12), (5, 1.0, -1, 1.0, None), (1, 0.0, -1, 1.0, None)]
SEEDED = [0, 1]


def _toy_logits(torch, prefix: list[int]):
    """[VOCAB] float32 logits of a toy target after ``prefix``, on the GPU: peaked enough that drafts are often
    right."""
    gen = torch.Generator().manual_seed(hash(tuple(prefix)) % (2**31))
    return (torch.randn(VOCAB, generator=gen) * 4.0).cuda()


class _Sampler:
    """What ``RejectionSampler._verify`` reads of the V2 ``Sampler``, for requests without penalties or logits
    processors: its sampling states, and ``apply_sampling_params`` as the ``Sampler`` applies them (float32 copy,
    temperature, then top-k / top-p unless skipped)."""

    use_fp64_gumbel = False
    logprobs_mode = "raw_logprobs"
    return_sampling_mask = False

    def __init__(self, torch) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.worker.gpu.sample.states import SamplingStates

        self.sampling_states = SamplingStates(8, VOCAB)
        for state, temperature, top_k, top_p, seed in REQUESTS:
            self.sampling_states.add_request(state, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                                                   seed=seed))
        self.sampling_states.apply_staged_writes()

    def apply_sampling_params(self, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids,
                              expanded_local_pos, seq_lens_upper_bound_np, skip_top_k_top_p=False):
        logits = logits.float().clone()
        self.sampling_states.apply_temperature(logits, expanded_idx_mapping, idx_mapping_np)
        if skip_top_k_top_p:
            return logits
        return self.sampling_states.apply_top_k_top_p(logits, expanded_idx_mapping, idx_mapping_np)


def _plain(torch, sampler: _Sampler, request: int, count: int) -> list[int]:
    """The request's first ``count`` tokens, sampled one position at a time as V2 samples without speculation."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    states = sampler.sampling_states
    state = REQUESTS[request][0]
    idx = torch.tensor([state], dtype=torch.int32, device="cuda")
    tokens: list[int] = []
    for _ in range(count):
        logits = sampler.apply_sampling_params(_toy_logits(torch, tokens)[None], idx, idx, np.array([state]), None,
                                               None, None, None, skip_top_k_top_p=True)
        top_k, top_p = states.get_top_k_top_p(idx, np.array([state]))
        logits = apply_top_k_top_p(logits, top_k, top_p)
        pos = torch.tensor([PROMPT_LEN - 1 + len(tokens)], dtype=torch.int64, device="cuda")
        tokens.append(int(gumbel_sample(logits, idx, states.temperature.gpu, states.seeds.gpu, pos,
                                        apply_temperature=False, is_drafting=False)[0]))
    return tokens


def _drafts(policy: str, n: int, truth: list[int], rng: random.Random) -> list[int]:
    """``n`` draft tokens: ``right`` (the plain tokens to come), ``wrong`` (never those), ``partial`` (right, then
    wrong from a random position)."""
    cut = {"right": n, "wrong": 0, "partial": rng.randrange(n + 1)}[policy]
    out = truth[:cut] + [(t + 1 + rng.randrange(VOCAB - 1)) % VOCAB for t in truth[cut:n]]
    return out + [rng.randrange(VOCAB) for _ in range(n - len(out))]


def _speculate(torch, policy: str, seed: int) -> tuple[list[list[int]], int]:
    """Run the batch of :data:`REQUESTS` through the patched ``RejectionSampler._verify`` until every request has
    :data:`OUTPUT_TOKENS` tokens, with 0-3 drafts per request and step. Returns the tokens and how many of the
    seeded requests' drafts were accepted."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    rng = random.Random(seed)
    sampler = _Sampler(torch)
    truth = {i: _plain(torch, sampler, i, OUTPUT_TOKENS + K + 1) for i in SEEDED}
    spec = SimpleNamespace(num_speculative_tokens=K, enable_adaptive_verification=False,
                           rejection_sample_method="standard", synthetic_acceptance_rates=None)
    verifier = RejectionSampler(sampler, spec, torch.device("cuda"))
    out: list[list[int]] = [[] for _ in REQUESTS]
    seeded_accepted = 0
    while min(len(o) for o in out) < OUTPUT_TOKENS:
        drafts, rows, inputs, pos, expanded, local, cu = [], [], [], [], [], [], [0]
        for i, tokens in enumerate(out):
            n = rng.randrange(K + 1)
            future = truth[i][len(tokens):] if i in SEEDED else [rng.randrange(VOCAB) for _ in range(n)]
            d = _drafts(policy, n, future, rng)
            drafts.append(d)
            for j in range(n + 1):
                rows.append(_toy_logits(torch, tokens + d[:j]))
                inputs.append(d[j - 1] if j else (tokens[-1] if tokens else 0))
                pos.append(PROMPT_LEN - 1 + len(tokens) + j)
                expanded.append(REQUESTS[i][0])
                local.append(j)
            cu.append(cu[-1] + n + 1)
        idx_np = np.array([r[0] for r in REQUESTS], dtype=np.int32)

        def gpu(values, dtype):
            return torch.tensor(values, dtype=dtype, device="cuda")

        draft_sampled = gpu(inputs, torch.int32)
        _, sampled, num_sampled = verifier._verify(
            torch.stack(rows), None, draft_sampled, gpu(pos, torch.int64), gpu(cu, torch.int32),
            gpu(idx_np.tolist(), torch.int32), idx_np, gpu(expanded, torch.int32), gpu(local, torch.int32),
            np.full(len(REQUESTS), 4096, dtype=np.int32), draft_sampled)
        first = 0
        for i, (row, n) in enumerate(zip(sampled.tolist(), num_sampled.tolist(), strict=True)):
            emitted = row[:n]
            accepted = n - 1
            assert emitted[:accepted] == drafts[i][:accepted]  # a prefix of the drafts, then one token
            if REQUESTS[i][1] == 0.0:  # greedy: the toy target's argmax chain
                assert emitted == [int(rows[first + j].argmax()) for j in range(n)]
            first += len(drafts[i]) + 1
            out[i] += emitted
            seeded_accepted += accepted * (i in SEEDED)
    return out, seeded_accepted


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["right", "wrong", "partial"])
def test_seeded_tokens_are_the_plain_v2_samplers_whatever_the_drafts(policy: str) -> None:
    torch = _torch()
    pytest.importorskip("vllm.v1.worker.gpu.spec_decode.rejection_sampler")
    for seed in range(3):
        out, accepted = _speculate(torch, policy, seed)
        assert (accepted > 0) == (policy != "wrong"), accepted
        plain = _Sampler(torch)
        for i in SEEDED:
            assert out[i] == _plain(torch, plain, i, len(out[i])), (policy, seed, i)


@pytest.mark.gpu
def test_upstream_mode_keeps_the_v2_ratio_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KIMI_SEEDED_VERIFICATION=upstream``: vLLM's own verification, whose seeded tokens follow the drafts (the
    symptom; this is how the test above fails without the patch)."""
    torch = _torch()
    pytest.importorskip("vllm.v1.worker.gpu.spec_decode.rejection_sampler")
    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", "upstream")
    out, _ = _speculate(torch, "partial", 0)
    plain = _Sampler(torch)
    assert any(out[i] != _plain(torch, plain, i, len(out[i])) for i in SEEDED)
